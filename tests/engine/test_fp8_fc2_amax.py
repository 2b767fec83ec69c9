"""FC2's input amax handed out by gemm_fc1 (engine/ops/gemm_fc1/register.toml `amax`, passed with --fp8 tensorwise):
FC2's FP8 cast of its input h takes it (fp8_copy's `amax`) instead of reducing h again.

Reference: the same run with the cast reducing h itself (tests/engine/no_fc2_amax.py: gemm_fc1 asked for no amax,
the GPU A/B's other arm too). Tolerance: none. The amax of the same stored values is the same fp32 value (a max is exact), so the scale, the
FP8 bits and everything after them are equal: torch.equal, every step's (loss, grad norm) exactly. A wrong amax
(three times the true one: not a power of two, which would only move every FP8 value's exponent)
must change them: the amax reaches the cast. The baseline's amax (its plain reduction, the
contract's reference) against torch.amax of the y it returns, NaN and inf included. The triton version's kernel and
its node, on CUDA: tests/ops/test_gemm_fc1_triton.py -m gpu."""

import pytest
import torch

from engine.distributed.fp8 import E4M3, Fp8Recipe, amax_of, cast
from engine.distributed.wgrad import MainGrad, attach_main_grad, fused_linear, main_grad_of
from engine.model.layers import MLP
from engine.ops.gemm_fc1 import baseline
from tests.engine.no_fc2_amax import fc1_without_amax
from tests.parallel.workers import single_run, spawn

FP8 = {"fp8": "tensorwise", "eval_samples": 0}


def operands(dtype: torch.dtype, m: int = 40, f: int = 48, h: int = 64, seed: int = 0) -> tuple:
    """x [2, m / 2, h], FC1's w [2f, h], FC2's w [h, f], FC2's output gradient [2, m / 2, h]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, m // 2, h, generator=g)
    w1 = torch.randn(2 * f, h, generator=g) / h**0.5
    w2 = torch.randn(h, f, generator=g) / f**0.5
    dy = torch.randn(2, m // 2, h, generator=g)
    return tuple(t.to(dtype) for t in (x, w1, w2, dy))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_baseline_hands_out_the_amax_of_the_output_it_returns(dtype):
    """(y, amax): y the op's y without `amax`, bit for bit; amax one fp32 value, torch.amax of |y| as returned (the
    model dtype's values), not part of autograd; NaN where y has a NaN, inf where y overflowed to inf."""
    x, w1, _, _ = operands(dtype)
    for fp8 in ("off", "tensorwise"):
        kw = {} if fp8 == "off" else {"fp8": fp8}
        xr = x.clone().requires_grad_()
        y, amax = baseline.gemm_fc1(xr, w1, amax=True, **kw)
        assert torch.equal(y, baseline.gemm_fc1(x, w1, **kw)), fp8
        assert amax.dtype == torch.float32 and amax.shape == () and not amax.requires_grad
        assert torch.equal(amax, y.detach().float().abs().amax()) and amax > 0, fp8
    nan = x.clone()
    nan[1, 3, 5] = float("nan")
    assert baseline.gemm_fc1(nan, w1, amax=True)[1].isnan()
    if dtype == torch.bfloat16:  # gate x up past bf16's 3.4e38: the product rounds to inf
        y, amax = baseline.gemm_fc1(x * 1e20, w1, amax=True)
        assert y.isinf().any() and amax == float("inf")


def fc2(h: torch.Tensor, w2: torch.Tensor, dy: torch.Tensor, x_amax, fused: bool, calls: list) -> tuple:
    """FC2's tensorwise FP8 linear on h (forward and backward): (out, dh, dW); `calls`: (shape, dtype, amax given)
    of each cast."""
    def counting(t, dtype, dim, pow2, transposed=False, amax=None):
        calls.append((tuple(t.shape), dtype, amax is not None))
        return cast(t, dtype, dim, pow2, transposed=transposed, amax=amax)

    hr, wr = h.clone().requires_grad_(), w2.clone().requires_grad_()
    if fused:
        attach_main_grad(wr, MainGrad(torch.zeros_like(wr, dtype=torch.float32)))
    out = fused_linear(hr, wr, Fp8Recipe("tensorwise", counting), x_amax=x_amax)
    out.backward(dy)
    return out.detach(), hr.grad, (main_grad_of(wr).grad if fused else wr.grad).clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "main_grad"])
def test_fc2s_fp8_linear_with_the_amax_equals_the_one_reducing_its_input(dtype, fused):
    """FC2 on gemm_fc1's h: its input's cast takes the op's amax (the only cast that does) and the output and both
    gradients are the ones of the cast reducing h itself, bit for bit; three times the amax changes the output."""
    x, w1, w2, dy = operands(dtype)
    h, amax = baseline.gemm_fc1(x, w1, fp8="tensorwise", amax=True)
    assert torch.equal(amax, amax_of(h))
    with_calls: list = []
    without_calls: list = []
    got = fc2(h, w2, dy, amax, fused, with_calls)
    want = fc2(h, w2, dy, None, fused, without_calls)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    n, f = h.shape[0] * h.shape[1], h.shape[-1]
    assert [c for c in with_calls if c[2]] == [((n, f), E4M3, True)] and not any(c[2] for c in without_calls)
    assert len(with_calls) == len(without_calls) == 3  # x, W, dy: the amax replaces a reduction, not a cast
    assert not torch.equal(fc2(h, w2, dy, amax * 3, fused, [])[0], want[0])


def wrong_fc2_amax(fn):
    """gemm_fc1 `fn` handing out three times y's amax: a wrong scale, which must show in the run."""
    def gemm_fc1(x, w, *, main_grad=None, fp8="off", amax=False):
        out = fn(x, w, main_grad=main_grad, fp8=fp8, amax=amax)
        return (out[0], out[1] * 3) if amax else out
    return gemm_fc1


def same(a: dict, b: dict) -> bool:
    return a["steps"] == b["steps"] and torch.equal(a["logits"], b["logits"]) and \
        all(torch.equal(t, b["weights"][name]) for name, t in a.get("weights", {}).items())


def test_a_tensorwise_run_hands_every_fc2_input_cast_its_amax_and_trains_bit_for_bit_as_without(monkeypatch):
    """Two steps of the tiny model (4 layers) at TP 1 with the baseline ops: every FP8 cast of FC2's input ([tokens,
    ffn], E4M3, not a weight) takes gemm_fc1's amax, equal to its own reduction's; the run (losses, grad norms,
    logits, weights) equals the run whose gemm_fc1 hands out none, bit for bit, and differs from one handing out a
    wrong amax. Rowwise asks for none."""
    from engine.ops.fp8_cast import baseline as cast_baseline

    calls: list = []

    def counting(t, dtype, dim, pow2, transposed=False, amax=None):
        calls.append((t.shape[-1], dtype, isinstance(t, torch.nn.Parameter), amax is not None))
        assert amax is None or torch.equal(amax, amax_of(t))
        return cast(t, dtype, dim, pow2, transposed=transposed, amax=amax)

    with monkeypatch.context() as patch:
        patch.setattr(cast_baseline, "cast", counting)
        fused = single_run(FP8, 2)
        ffn = fused["config"].ffn_hidden_size
        fc2_inputs = [c for c in calls if c[0] == ffn and c[1] == E4M3 and not c[2]]
        assert fc2_inputs and all(c[3] for c in fc2_inputs) and [c for c in calls if c[3]] == fc2_inputs
        calls.clear()
        single_run({**FP8, "fp8": "rowwise"}, 1)
        assert calls and not any(c[3] for c in calls)
    with monkeypatch.context() as patch:
        patch.setattr(MLP, "_fc1", fc1_without_amax)  # gemm_fc1 asked for none: FC2's cast reduces h itself
        assert same(fused, single_run(FP8, 2))
    with monkeypatch.context() as patch:
        patch.setattr(baseline, "gemm_fc1", wrong_fc2_amax(baseline.gemm_fc1))
        assert not same(fused, single_run(FP8, 2))


@pytest.mark.slow  # torch.compile: ~10 s a graph on 2 CPU cores
def test_compiled_hands_out_no_amax_and_the_same_output():
    """compiled's kernel takes no amax: (y, None), y its output without `amax` bit for bit (FC2's cast reduces it)."""
    from engine.ops.gemm_fc1 import compiled

    x, w1, _, _ = operands(torch.float32)
    y, amax = compiled.gemm_fc1(x, w1, fp8="tensorwise", amax=True)
    assert amax is None and torch.equal(y, compiled.gemm_fc1(x, w1, fp8="tensorwise"))


TP2 = {**FP8, "tp": 2}


@pytest.mark.slow  # twelve 3-step TP 2 runs on two gloo processes
def test_at_tp2_each_ranks_fc2_amax_trains_bit_for_bit_as_without(tmp_path, monkeypatch):
    """Each rank hands its own h's amax to its FC2 shard's cast (amax is local: docs/fp8.md): overlapped (the MLP
    region's hand-over), sequence-parallel (FC2's input is h there too: the gather is before FC1, the reduce-scatter
    after FC2), overlap off, and the chunked forward (each chunk cast with its own scale: the amax unused). Each
    equals the same layout whose gemm_fc1 hands out none, every step and the logits bit for bit; a wrong amax
    changes every layout but the chunked one. The ranks are forked: the patches reach them."""
    scenarios = [("overlap", TP2, 3), ("sp", {**TP2, "sequence_parallel": True}, 3),
                 ("plain", {**TP2, "tp_comm_overlap": False}, 3),
                 ("plain_chunks", {**TP2, "tp_comm_overlap": False, "tp_fwd_chunks": 2}, 3)]
    threads = torch.get_num_threads()
    try:
        fused = spawn(2, scenarios, tmp_path)
        runs = {}
        for name, target, attr, patched in (("reduced", MLP, "_fc1", fc1_without_amax),
                                            ("wrong", baseline, "gemm_fc1", wrong_fc2_amax(baseline.gemm_fc1))):
            with monkeypatch.context() as patch:
                patch.setattr(target, attr, patched)
                (tmp_path / name).mkdir()
                runs[name] = spawn(2, scenarios, tmp_path / name)
    finally:
        torch.set_num_threads(threads)
    for name, _, _ in scenarios:
        assert same(fused[name], runs["reduced"][name]), name
        assert same(fused[name], runs["wrong"][name]) == (name == "plain_chunks"), name
