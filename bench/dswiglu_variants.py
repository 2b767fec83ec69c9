"""Check and time the variants of our SwiGLU backward kernel (engine/ops/gemm_fc1/cute_dswiglu.py).

    python bench/dswiglu_variants.py

For M = 8192 tokens and f = 16384 / 8192 / 4096 (MiniCPM4-8B TP 1, TP 2, MiniCPM4-0.5B): fresh
random dy and interleaved preact, the kernel's [dgate | dup] against the same math in fp32 torch
(rel. error, bf16 tolerance 1e-2), then the median of 50 calls (device events) and the bandwidth
of the bytes it must move (dy 2 B + preact 4 B + grads 4 B per element of y) against the
unfused torch version (what autograd of the baseline runs). Table printed last.
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_call_ms  # noqa: E402
from engine.ops.gemm_fc1.cute_dswiglu import dswiglu_concat  # noqa: E402
from engine.ops.kernel_cache import configure_quack_cache  # noqa: E402

__all__ = ["main"]


def reference(dy: torch.Tensor, preact: torch.Tensor) -> torch.Tensor:
    g, u, d = preact[:, 0::2].float(), preact[:, 1::2].float(), dy.float()
    s = torch.sigmoid(g)
    return torch.cat([d * u * s * (1 + g * (1 - s)), d * g * s], dim=1)


def torch_unfused(dy: torch.Tensor, preact: torch.Tensor) -> torch.Tensor:
    g, u = preact[:, 0::2], preact[:, 1::2]
    silu = F.silu(g)
    dgate = torch.ops.aten.silu_backward(dy * u, g)
    return torch.cat([dgate, dy * silu], dim=1)




def _median_ms(fn, iters=50) -> float:
    return median_call_ms(lambda _: fn(), [None], iters)


def main() -> int:
    configure_quack_cache()
    rows, ok = [], True
    for f in (16384, 8192, 4096):
        m = 8192
        g = torch.Generator(device="cuda").manual_seed(f)
        dy = torch.randn(m, f, generator=g, device="cuda").bfloat16()
        preact = (torch.randn(m, 2 * f, generator=g, device="cuda") * 2).bfloat16()
        ref = reference(dy, preact)
        nbytes = m * f * 10
        t = _median_ms(lambda: torch_unfused(dy, preact))
        rows.append((f, "torch", t, nbytes / t / 1e6, ((torch_unfused(dy, preact).float() - ref).norm() / ref.norm()).item()))
        for vec in (4, 8):
            out = dswiglu_concat(dy, preact, vec=vec)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            ok &= err <= 1e-2 and bool(torch.isfinite(out).all())
            t = _median_ms(lambda v=vec: dswiglu_concat(dy, preact, vec=v))
            rows.append((f, f"cute vec{vec}", t, nbytes / t / 1e6, err))
    print(f"{'f':>6} {'variant':<10} {'ms':>8} {'GB/s':>8} {'rel err':>9}   (M = 8192, bytes = 10 per y element)")
    for f, name, t, gbs, err in rows:
        print(f"{f:>6} {name:<10} {t:>8.3f} {gbs:>8.0f} {err:>9.1e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
