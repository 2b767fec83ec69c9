"""The cos / sin tables of RoPE, as HF Llama's default rope computes them.

Rotate-half layout: row p holds cos(p * f) for the d / 2 frequencies f, twice ([max_seq, d], both halves
equal), so x * cos + rotate_half(x) * sin rotates each pair (x[i], x[i + d / 2]) by p * f[i]. fp32, on
`device`; a kernel that wants the d / 2 distinct columns reads the first half.
"""

import torch

__all__ = ["rope_tables"]


def rope_tables(head_dim: int, theta: float, max_seq: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each fp32 [max_seq, head_dim]."""
    if head_dim % 2:
        raise ValueError(f"rope: head_dim={head_dim} is odd; rotary embedding rotates pairs, use an even head_dim")
    # Same arithmetic as HF Llama's default rope (fp32 inverse frequencies, outer product).
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    t = torch.arange(max_seq, device=device, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
