"""Worker for the vocab-parallel gemm_output test: one process per TP rank (gloo on CPU).

The ranks are forked from the test process (tests/parallel/workers.launch).
"""

import torch
import torch.distributed as dist

from engine.ops.gemm_output.baseline import gemm_output_chunked

__all__ = ["SCENARIOS", "make_inputs", "run_rank"]

# name: (n tokens, hidden, padded vocab, real vocab, chunk); all padded to a multiple of 2 x 16.
SCENARIOS = {
    "labels_on_both_shards": (37, 16, 64, 50, 8),  # rank 1 holds real columns 32..49 and padding 50..63
    "second_shard_all_padding": (9, 8, 64, 20, 4),  # rank 1 has no real column at all
}


def make_inputs(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d, v_padded, vocab_size, _ = SCENARIOS[name]
    g = torch.Generator().manual_seed(len(name))
    h = torch.randn(n, d, generator=g)
    w = torch.randn(v_padded, d, generator=g) * 2 / d**0.5
    labels = torch.randint(0, vocab_size, (n,), generator=g)
    labels[::4] = -100
    return h, w, labels


def run_rank(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        group = dist.new_group(list(range(world)))
        results = {}
        for name, (_, _, v_padded, vocab_size, chunk) in SCENARIOS.items():
            h, w, labels = make_inputs(name)
            v_local = v_padded // world
            h = h.requires_grad_()
            shard = w[rank * v_local:(rank + 1) * v_local].clone().requires_grad_()
            loss = gemm_output_chunked(h, shard, labels, vocab_start=rank * v_local, vocab_size=vocab_size,
                                       tp_group=group, chunk_tokens=chunk)
            loss.backward()
            # grad_h is this rank's partial sum by contract; the TP region would all-reduce it.
            grad_h = h.grad.clone()
            dist.all_reduce(grad_h, group=group)
            results[name] = {"loss": loss.detach(), "grad_w_shard": shard.grad, "grad_h": grad_h}
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
