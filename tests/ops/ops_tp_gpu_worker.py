"""Worker for the GPU vocab-parallel gemm_output test: two processes (TP ranks) share one GPU.

gloo carries the collectives (it accepts CUDA tensors; NCCL refuses two ranks on one device), which
is all the op needs to be tested for: the same kernels run, only the transport differs.
Lives in its own module (not a test file) so spawned children can import it. Started by the engine's process
(tests/ops/versions_gpu_calls.py), never by the test's: the inputs come from the test, which draws them.
"""

import torch
import torch.distributed as dist

from engine.ops.dispatch import load_op

__all__ = ["run_rank"]


def run_rank(rank: int, world: int, version: str, init_file: str, out_dir: str, vocab_size: int) -> None:
    """One TP rank: the version on its vocabulary shard of w (out_dir/inputs.pt: fp32 h, w, labels; bf16 on the
    GPU), its results saved to out_dir/rank<r>.pt."""
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        group = dist.new_group(list(range(world)))
        fn = load_op("gemm_output", version)
        inputs = torch.load(f"{out_dir}/inputs.pt")
        h, w, labels = inputs["h"], inputs["w"], inputs["labels"]
        v_local = w.shape[0] // world
        h = h.cuda().bfloat16().requires_grad_()
        shard = w[rank * v_local:(rank + 1) * v_local].cuda().bfloat16().requires_grad_()
        loss = fn(h, shard, labels.cuda(), vocab_start=rank * v_local, vocab_size=vocab_size, tp_group=group)
        loss.backward()
        grad_h = h.grad.float()
        dist.all_reduce(grad_h, group=group)  # the caller's TP region does this in the model
        torch.save({"loss": loss.detach().cpu(), "grad_h": grad_h.cpu(), "grad_w_shard": shard.grad.float().cpu()},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
