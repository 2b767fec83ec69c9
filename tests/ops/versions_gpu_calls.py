"""The engine's side of tests/ops/test_ops_versions_gpu.py: runs in the candidate's process (harness.judge.candidate),
never in the test's. It runs op versions on the GPU on the inputs and upstream gradients the test drew and hands back
their outputs and gradients (on the CPU); the test computes the fp32 reference and asserts."""

import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

from engine.ops.dispatch import load_op
from tests.ops import ops_tp_gpu_worker as worker
from tests.ops.gpu_cases import case_named

__all__ = ["run", "forward_modes", "vocab_parallel"]


def _on_gpu(inputs: dict, leaves: list) -> dict:
    """Fresh GPU copies of the tensors (those named in `leaves` require grad): every run gets its own."""
    return {k: ((v.cuda().clone().requires_grad_(k in leaves)) if isinstance(v, torch.Tensor) else v)
            for k, v in inputs.items()}


def run(op: str, case: str, versions: list, inputs: dict, gouts: list, leaves: list) -> dict:
    """{version: {"out": outputs, "grad": {leaf: gradient}}}: each version called as the case calls it, on fresh
    copies of `inputs` (those named in `leaves` require grad), then its backward with `gouts` (cast to each output's
    dtype). An input the used outputs do not depend on (the weight when only s of the residual form is used) may get
    None from one version and zeros from another: both mean a zero gradient, so None comes back as zeros."""
    c = case_named(op, case)
    results = {}
    for version in versions:
        x = _on_gpu(inputs, leaves)
        outs = c.call(load_op(op, version), x)
        torch.autograd.backward(outs, [g.cuda().to(o.dtype) for g, o in zip(gouts, outs, strict=True)])
        results[version] = {"out": [o.detach() for o in outs],
                            "grad": {k: x[k].grad if x[k].grad is not None else torch.zeros_like(x[k]) for k in leaves}}
    return results


def forward_modes(op: str, case: str, version: str, inputs: dict, leaves: list) -> dict:
    """The version's outputs under torch.no_grad (inputs detached) and with autograd on."""
    c, fn = case_named(op, case), load_op(op, version)
    with torch.no_grad():
        plain = c.call(fn, _on_gpu(inputs, []))
    graded = c.call(fn, _on_gpu(inputs, leaves))
    return {"plain": [o.detach() for o in plain], "graded": [o.detach() for o in graded]}


def vocab_parallel(version: str, h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, vocab_size: int) -> list:
    """Two real TP ranks of gemm_output `version` (gloo, one GPU, tests/ops/ops_tp_gpu_worker.py): each rank's
    {"loss", "grad_h" (all-reduced), "grad_w_shard"}."""
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({"h": h, "w": w, "labels": labels}, f"{tmp}/inputs.pt")  # a file, not 1.2 GB through /dev/shm
        mp.start_processes(worker.run_rank, args=(2, version, f"{tmp}/store", tmp, vocab_size), nprocs=2, join=True,
                           start_method="spawn")
        return [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(2)]
