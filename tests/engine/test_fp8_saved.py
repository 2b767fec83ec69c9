"""Tensorwise FP8 linears keep their forward's FP8 copies of x and W for backward (engine/distributed/fp8.py
keeps_fp8, wgrad.py save_linear, tp_linear.py) and cast dy once: bit for bit the path that casts every backward
operand again (tests/engine/fp8_recast.py), because one scale per tensor transposes with it (amax(t^T) = amax(t), the
cast is elementwise). Tolerance: none (torch.equal, every [LOSS] field digit for digit). Rowwise keeps recasting
(per-row scales do not transpose): checked to save bf16.

Default run: one linear through autograd (casts counted, saved tensors inspected, gradients bitwise, with and without
a main_grad), and a short in-process training run (selective activation checkpointing, unfused). `slow`: the matrix
(full / selective checkpointing, fused and not, the compiled cast) and TP 2 (column, row, SP, row chunks). The CLI run
of the same comparison ([LOSS] lines and final weights) is in tests/engine/test_fp8.py.
"""

import pytest
import torch

from engine.distributed.fp8 import E4M3, E5M2, Fp8Recipe, cast, fp8_copy, weight_copies_kept, weight_copy
from engine.distributed.wgrad import MainGrad, attach_main_grad, fused_linear, main_grad_of
from tests.engine.fp8_recast import recasting
from tests.parallel.workers import RECAST, single_run, spawn


def counting(calls: list, cast_fn=cast):
    def fn(t, dtype, dim, pow2, transposed=False, amax=None):
        calls.append((tuple(t.shape), t.is_contiguous(), dtype, transposed))
        return cast_fn(t, dtype, dim, pow2, transposed=transposed, amax=amax)
    return fn


def linear_step(recipe: str, fused: bool, device: str = "cpu", dtype: torch.dtype = torch.float32, cast_fn=cast,
                shape: tuple[int, int, int] = (64, 48, 80)):
    """One FP8 linear (n tokens, in, out) forward + backward: (y, dx, dW, casts, saved tensors' dtypes and shapes)."""
    n, k, m = shape
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, n // 2, k, generator=g).to(device, dtype).requires_grad_()
    w = (torch.randn(m, k, generator=g) * 0.05).to(device, dtype).requires_grad_()
    dy = (torch.randn(2, n // 2, m, generator=g) * 1e-3).to(device, dtype)
    calls: list = []
    if fused:
        attach_main_grad(w, MainGrad(torch.zeros_like(w, dtype=torch.float32)))
    saved: list = []
    def keep(t):  # (dtype, shape), and for a 2-D tensor whether it is stored transposed (its .t() row-major)
        saved.append((t.dtype, tuple(t.shape), t.dim() == 2 and t.t().is_contiguous() and not t.is_contiguous()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        y = fused_linear(x, w, Fp8Recipe(recipe, counting(calls, cast_fn)))
    y.backward(dy)
    dw = main_grad_of(w).grad if fused else w.grad
    return y.detach(), x.grad, dw.clone(), calls, saved


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "main_grad"])
def test_a_tensorwise_linear_saves_fp8_copies_casts_three_times_and_equals_the_recast_path(fused):
    y, dx, dw, calls, saved = linear_step("tensorwise", fused)
    with recasting():
        ry, rdx, rdw, rcalls, rsaved = linear_step("tensorwise", fused)
    assert torch.equal(y, ry) and torch.equal(dx, rdx) and torch.equal(dw, rdw)
    # kept: x, W (forward, E4M3) and dy once (E5M2); recast: x, W, then dy and W^T (dgrad), dy^T and x^T (wgrad)
    assert [c[2] for c in calls] == [E4M3, E4M3, E5M2]
    assert [c[2] for c in rcalls] == [E4M3, E4M3, E5M2, E4M3, E5M2, E4M3]
    # each kept cast also writes the transpose backward takes (x^T: wgrad, W^T: dgrad, dy^T: wgrad) in the same pass,
    # so backward transposes no FP8 copy; the recast path asks for none
    assert [c[3] for c in calls] == [True, True, True] and not any(c[3] for c in rcalls)
    # saved: x's FP8 copy [64, 48] in place of the fp32 x and W's [80, 48], each stored transposed (the row-major
    # copies of x^T and W^T, the layouts backward takes; the forward's row-major copies are not held), scales, W
    assert (E4M3, (64, 48), True) in saved and (E4M3, (80, 48), True) in saved
    assert not any(d == E4M3 and not transposed for d, _, transposed in saved)
    assert not any(shape == (2, 32, 48) for _, shape, _ in saved)
    assert (torch.float32, (2, 32, 48), False) in rsaved and not any(d in (E4M3, E5M2) for d, _, _ in rsaved)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("version", ["baseline", "compiled"])
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "main_grad"])
def test_on_cuda_the_fp8_copies_equal_the_recast_path(version, fused):
    """cuBLAS FP8 GEMMs in bf16 at the 8B slice's QKV shape (4096 tokens, 4096 -> 4608), both cast versions."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs compute capability 8.9+")
    from engine.ops.fp8_cast import baseline, compiled
    fn = {"baseline": baseline.cast, "compiled": compiled.cast}[version]
    args = ("tensorwise", fused, "cuda", torch.bfloat16, fn, (4096, 4096, 4608))
    y, dx, dw, calls, _ = linear_step(*args)
    with recasting():
        ry, rdx, rdw, rcalls, _ = linear_step(*args)
    assert len(calls) == 3 and len(rcalls) == 6
    assert torch.equal(y, ry) and torch.equal(dx, rdx) and torch.equal(dw, rdw)


def test_rowwise_keeps_recasting():
    """Per-row scales do not transpose to per-column ones: rowwise saves x and casts every backward operand."""
    *_, calls, saved = linear_step("rowwise", False)
    assert len(calls) == 6 and (torch.float32, (2, 32, 48), False) in saved and not any(d == E4M3 for d, _, _ in saved)


FP8 = {"fp8": "tensorwise"}


def same(a: dict, b: dict) -> None:
    assert a["steps"] == b["steps"]  # (loss, grad norm) of every step, exactly
    assert a["weights"].keys() == b["weights"].keys()
    for name, t in a["weights"].items():
        assert torch.equal(t, b["weights"][name]), name
    assert torch.equal(a["logits"], b["logits"])


def test_a_short_run_with_selective_recompute_unfused_equals_the_recast_path():
    cfg = {**FP8, "activation_checkpointing": "selective", "grad_accum_fusion": False, "eval_samples": 0}
    same(single_run(cfg, 2), single_run({**cfg, RECAST: True}, 2))


def test_the_weight_cache_casts_each_weight_once_a_step_and_changes_no_bit():
    """--fp8-weight-cache: inside weight_copies_kept a weight is cast once (both layouts) and its copies handed to the
    later micro-batches; outside, and after the step, every call casts again. A run with it (2 micro-batches a step,
    selective recompute: the recompute takes the kept copies too) equals one without, every step and weight bit for
    bit (the same cast of the same weight)."""
    w = torch.randn(32, 48)
    calls: list = []
    recipe = Fp8Recipe("tensorwise", counting(calls))
    with weight_copies_kept(True):
        first, again = weight_copy(w, recipe), weight_copy(w, recipe)
        other = weight_copy(w.clone(), recipe)  # another tensor of the same values: its own copies
    assert first is again and other is not first and len(calls) == 2 and calls[0][3] is True
    assert torch.equal(first.q.view(torch.uint8), fp8_copy(w, "tensorwise", transposed=True).q.view(torch.uint8))
    weight_copy(w, recipe)
    with weight_copies_kept(False):
        weight_copy(w, recipe)
    assert len(calls) == 4  # nothing kept outside a step, nor with the cache off
    cfg = {**FP8, "grad_accum_steps": 2, "activation_checkpointing": "selective", "eval_samples": 0}
    same(single_run({**cfg, "fp8_weight_cache": True}, 2), single_run(cfg, 2))


@pytest.mark.slow  # six in-process runs of 3 steps; the compiled cast compiles (~5 s a graph on 2 cores)
@pytest.mark.parametrize("overrides", [
    {"activation_checkpointing": "full"},
    {"activation_checkpointing": "selective"},
    {"op_fp8_cast": "compiled"},
], ids=["full", "selective", "compiled"])
def test_fp8_copies_equal_the_recast_path_under_recompute_and_the_compiled_cast(overrides):
    cfg = {**FP8, **overrides, "eval_samples": 0}
    same(single_run(cfg, 3), single_run({**cfg, RECAST: True, "op_fp8_cast": "baseline"}, 3))


TP = {**FP8, "tp": 2, "eval_samples": 0}
TP_CASES = [
    ("overlap", TP),  # column-parallel QKV / FC1 overlapped, MLP region's hand-over, row-parallel O / FC2
    ("sp", {**TP, "sequence_parallel": True}),  # FP8 rows all-gathered in backward; row-parallel through the sink
    ("sp_unfused", {**TP, "sequence_parallel": True, "grad_accum_fusion": False}),
    ("plain_chunks", {**TP, "tp_comm_overlap": False, "tp_fwd_chunks": 2}),  # chunked forward: x recast for wgrad
]


@pytest.mark.slow  # eight 3-step TP 2 runs on two gloo processes
def test_fp8_copies_equal_the_recast_path_at_tp2(tmp_path):
    """... and --fp8-weight-cache at TP 2 (2 micro-batches a step; the column-parallel weights' copies of the
    overlapped path and the row-parallel ones) equals the same run without it."""
    gas2 = {**TP, "grad_accum_steps": 2}
    scenarios = [(n, c, 3) for n, c in TP_CASES] + [(n + "_recast", {**c, RECAST: True}, 3) for n, c in TP_CASES]
    scenarios += [("gas2", gas2, 3), ("gas2_cache", {**gas2, "fp8_weight_cache": True}, 3)]
    threads = torch.get_num_threads()
    try:
        world = spawn(2, scenarios, tmp_path)
    finally:
        torch.set_num_threads(threads)
    for name, ref_name in [(n, n + "_recast") for n, _ in TP_CASES] + [("gas2_cache", "gas2")]:
        got, ref = world[name], world[ref_name]
        assert got["steps"] == ref["steps"], name
        assert torch.equal(got["logits"], ref["logits"]), name
