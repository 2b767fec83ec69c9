"""Worker for the GPU vocab-parallel gemm_output test: two processes (TP ranks) share one GPU.

gloo carries the collectives (it accepts CUDA tensors; NCCL refuses two ranks on one device), which
is all the op needs to be tested for: the same kernels run, only the transport differs.
Lives in its own module (not a test file) so spawned children can import it.
"""

import torch
import torch.distributed as dist

from engine.ops.dispatch import load_op

__all__ = ["SHAPE", "make_inputs", "run_rank"]

SHAPE = {"n": 512, "d": 4096, "v_padded": 73472, "vocab_size": 73448}  # MiniCPM4 vocab padded to 128 x 2


def make_inputs(seed: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n, d = SHAPE["n"], SHAPE["d"]
    h = torch.randn(n, d, generator=g)
    w = torch.randn(SHAPE["v_padded"], d, generator=g) / d**0.5
    labels = torch.randint(0, SHAPE["vocab_size"], (n,), generator=g)
    labels[::7] = -100
    labels[1] = SHAPE["vocab_size"] - 1  # the last real column, next to rank 1's padding
    return h, w, labels


def run_rank(rank: int, world: int, version: str, init_file: str, out_dir: str) -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        group = dist.new_group(list(range(world)))
        fn = load_op("gemm_output", version)
        h, w, labels = make_inputs()
        v_local = SHAPE["v_padded"] // world
        h = h.cuda().bfloat16().requires_grad_()
        shard = w[rank * v_local:(rank + 1) * v_local].cuda().bfloat16().requires_grad_()
        loss = fn(h, shard, labels.cuda(), vocab_start=rank * v_local, vocab_size=SHAPE["vocab_size"], tp_group=group)
        loss.backward()
        grad_h = h.grad.float()
        dist.all_reduce(grad_h, group=group)  # the caller's TP region does this in the model
        torch.save({"loss": loss.detach().cpu(), "grad_h": grad_h.cpu(), "grad_w_shard": shard.grad.float().cpu()},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
