"""The fp8_cast op (--fp8's operand cast, engine/ops/fp8_cast/register.toml): versions behind the dispatcher, the
recipe carrying the chosen one, and `compiled` (torch.compile of the baseline) equal to `baseline` bit for bit.

Why bit for bit: the compiled version computes the amax and the scale with the baseline's own eager code and
compiles only the elementwise part (fp32 multiply, clamp, round-to-nearest-even cast), which is exactly rounded in
both (engine/ops/fp8_cast/compiled.py says why the scale is not compiled). Compiling costs ~5 s a graph on CPU, so
those cases are `slow`."""

import pytest
import torch

from engine.config import EngineConfig
from engine.distributed.fp8 import E4M3, E5M2, Fp8Recipe, cast, linear_dgrad, linear_forward, linear_wgrad
from engine.errors import ConfigError, KernelLoadError
from engine.ops import resolve_ops

FORMATS = [(E4M3, None, False), (E5M2, None, False), (E4M3, -1, True)]  # tensorwise x / W, tensorwise dy, rowwise


def operand(rows: int, cols: int, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """Normal values with the cases a cast must get right: a zero row (scale 1), a zero element, a value far above
    the rest (it sets the amax; the others round onto a coarser grid)."""
    gen = torch.Generator(device="cpu").manual_seed(rows * 7 + cols)
    t = (torch.randn(rows, cols, generator=gen) * 3).to(device=device, dtype=dtype)
    t[1] = 0
    t[2, 3] = 0
    t[4, 5] = 4e3
    return t


def test_fp8_resolves_the_cast_version_and_the_layers_recipe_carries_it():
    from engine.model.layers import tp_comm
    from engine.distributed import ParallelState
    from engine.ops.fp8_cast import baseline, compiled

    ops = resolve_ops(EngineConfig(fp8="tensorwise", op_fp8_cast="compiled"), "cpu")
    assert ops.versions["fp8_cast"] == "compiled" and ops.fp8_cast is compiled.cast
    assert resolve_ops(EngineConfig(fp8="rowwise"), "cpu").fp8_cast is baseline.cast is cast  # the default
    off = resolve_ops(EngineConfig(), "cpu")
    assert off.fp8_cast is None and "fp8_cast" not in off.versions  # no --fp8: nothing resolved, nothing in the header
    tp = tp_comm(EngineConfig(fp8="tensorwise"), ParallelState.single(torch.device("cpu")), ops)
    assert isinstance(tp.fp8, Fp8Recipe) and tp.fp8 == "tensorwise" and tp.fp8.cast is compiled.cast
    import copy
    again = copy.deepcopy(tp.fp8)
    assert isinstance(again, Fp8Recipe) and again == "tensorwise" and again.cast is compiled.cast
    with pytest.raises(ConfigError, match="fp8_cast and fp8_wgrad ops"):
        tp_comm(EngineConfig(fp8="tensorwise"), ParallelState.single(torch.device("cpu")), off)


def test_an_unknown_cast_version_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"'fused'.*not a version of op 'fp8_cast'.*baseline, compiled"):
        resolve_ops(EngineConfig(fp8="tensorwise", op_fp8_cast="fused"), "cpu")


@pytest.mark.parametrize("fmt", FORMATS[:2], ids=["e4m3", "e5m2"])
def test_the_baseline_cast_writes_the_transpose_row_major_bit_for_bit(fmt):
    """The contract's `transposed` (one scale): q^T's row-major copy, the operand backward takes, equal to casting
    t^T itself (the scale is t's amax either way, and the cast is elementwise)."""
    t = operand(48, 80, torch.bfloat16)
    q, s, qt = cast(t, *fmt, transposed=True)
    qt_ref, s_ref = cast(t.t(), *fmt)
    assert qt.is_contiguous() and qt.shape == (80, 48) and torch.equal(s, s_ref)
    assert torch.equal(qt.view(torch.uint8), qt_ref.view(torch.uint8))
    assert torch.equal(q.view(torch.uint8), cast(t, *fmt)[0].view(torch.uint8))


@pytest.mark.parametrize("version", ["baseline", pytest.param("compiled", marks=pytest.mark.slow)])
def test_a_known_amax_gives_the_same_cast_bit_for_bit(version):
    """The contract's `amax` (a kernel that wrote t took its amax: gemm_fc1 triton's SwiGLU backward): the scale and
    both layouts equal the cast that reduces t itself, bit for bit, for both formats and a transposed view."""
    from engine.ops.fp8_cast import compiled
    fn = cast if version == "baseline" else compiled.cast
    t = operand(48, 80, torch.bfloat16)
    for fmt in FORMATS[:2]:
        for view in (t, t.t()):
            amax = view.float().abs().amax()
            for transposed in (False, True):
                got, want = fn(view, *fmt, transposed=transposed, amax=amax), cast(view, *fmt, transposed=transposed)
                assert len(got) == len(want) and torch.equal(got[1], want[1])
                for a, b in zip(got[::2], want[::2]):
                    assert a.is_contiguous() and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_a_known_amax_is_refused_where_it_cannot_be_the_scales():
    """One fp32 value for one unrounded scale: with a scale per row, rounded to a power of two, or not fp32, the cast
    refuses it (every version checks it: check_cast)."""
    t = operand(16, 16, torch.bfloat16)
    for dim, pow2, amax in ((-1, True, torch.tensor(3.0)), (None, True, torch.tensor(3.0)),
                            (None, False, torch.tensor(3.0, dtype=torch.float64)), (None, False, torch.ones(2))):
        with pytest.raises(ValueError, match="a known amax is one fp32 value"):
            cast(t, E4M3, dim, pow2, amax=amax)


def test_a_transposed_copy_with_row_scales_is_refused():
    with pytest.raises(ValueError, match="per-row scale does not transpose"):
        cast(operand(16, 16, torch.bfloat16), E4M3, -1, True, transposed=True)


def test_a_format_the_compiled_cast_has_no_kernel_for_is_refused():
    from engine.ops.fp8_cast.compiled import cast as compiled_cast
    with pytest.raises(KernelLoadError, match="no compiled cast to torch.float8_e4m3fnuz.*--op-fp8-cast baseline"):
        compiled_cast(torch.ones(16, 16), torch.float8_e4m3fnuz, None, False)  # no recipe casts to it


@pytest.mark.slow  # torch.compile: ~5 s a graph on 2 CPU cores
@pytest.mark.parametrize("fmt", FORMATS, ids=["e4m3", "e5m2", "rows-e4m3-pow2"])
def test_the_compiled_cast_equals_the_baseline_bit_for_bit_on_cpu(fmt):
    from engine.ops.fp8_cast.compiled import cast as compiled_cast
    t = operand(48, 80, torch.bfloat16)
    for view in (t, t.t()):  # a forward operand, and a dgrad / wgrad one (transposed view, written row-major)
        q, s = compiled_cast(view, *fmt)
        qb, sb = cast(view, *fmt)
        assert q.is_contiguous() and q.dtype == fmt[0] and q.shape == view.shape
        assert torch.equal(q.view(torch.uint8), qb.view(torch.uint8)) and torch.equal(s, sb)
        if fmt[1] is None:  # one scale: the transpose's row-major copy from the same compiled pass
            q2, s2, qt = compiled_cast(view, *fmt, transposed=True)
            _, _, qtb = cast(view, *fmt, transposed=True)
            assert qt.is_contiguous() and qt.shape == view.t().shape and torch.equal(s2, sb)
            assert torch.equal(q2.view(torch.uint8), qb.view(torch.uint8))
            assert torch.equal(qt.view(torch.uint8), qtb.view(torch.uint8))


def scale_cases(device: str = "cpu", n: int = 400) -> list[torch.Tensor]:
    """16 x 16 fp32 operands whose amaxes spread over 2^-40..2^40 with random mantissas (and 0, a subnormal): where
    a scale formed another way (a true fp32 division, an approximate one) rounds differently, some of these show it."""
    g = torch.Generator().manual_seed(11)
    amaxes = torch.exp2(torch.rand(n, generator=g, dtype=torch.float64) * 80 - 40).float().tolist() + [0.0, 1e-40]
    out = []
    for a in amaxes:
        t = torch.rand(16, 16, generator=g) * a
        t[3, 5] = -a  # the amax, exactly
        out.append(t.to(device))
    return out


@pytest.mark.slow  # torch.compile: one graph a format
def test_the_compiled_scale_is_the_baselines_bit_for_bit_over_many_amaxes():
    """The compiled cast forms max(dtype) x (1 / amax) inside its graph (its reciprocal in fp64, rounded to fp32):
    the baseline's scale bit for bit, and so its q, over amaxes of every magnitude and mantissa."""
    from engine.ops.fp8_cast.compiled import cast as compiled_cast
    for fmt in FORMATS[:2]:
        for t in scale_cases():
            q, s = compiled_cast(t, *fmt)
            qb, sb = cast(t, *fmt)
            assert torch.equal(s, sb), (t.abs().max().item(), s.item(), sb.item())
            assert torch.equal(q.view(torch.uint8), qb.view(torch.uint8))


@pytest.mark.slow  # torch.compile: two graphs a format
def test_the_split_transposed_cast_equals_the_baseline_bit_for_bit_on_cpu(monkeypatch):
    """From SPLIT_NUMEL elements on, q^T is copied from q by a second compiled kernel (fewer device seconds on the
    8B's big operands): the same bytes as the baseline's, for a forward operand and a transposed view."""
    from engine.ops.fp8_cast import compiled
    monkeypatch.setattr(compiled, "SPLIT_NUMEL", 0)
    calls = []
    transpose = compiled._TRANSPOSE
    monkeypatch.setattr(compiled, "_TRANSPOSE", lambda q: calls.append(q.shape) or transpose(q))
    t = operand(48, 80, torch.bfloat16)
    for fmt in FORMATS[:2]:
        for view in (t, t.t()):
            q, s, qt = compiled.cast(view, *fmt, transposed=True)
            qb, sb, qtb = cast(view, *fmt, transposed=True)
            assert torch.equal(s, sb) and q.is_contiguous() and qt.is_contiguous() and qt.shape == view.t().shape
            assert torch.equal(q.view(torch.uint8), qb.view(torch.uint8))
            assert torch.equal(qt.view(torch.uint8), qtb.view(torch.uint8))
    assert len(calls) == 4  # every cast took the split


@pytest.mark.slow
def test_an_fp8_linear_with_the_compiled_cast_equals_the_baseline_bit_for_bit_on_cpu():
    """The three GEMMs of a linear (torch's CPU _scaled_mm emulation), both recipes: the casts are equal bit for bit,
    so the products are."""
    from engine.ops.fp8_cast.compiled import cast as compiled_cast
    x, w, g = operand(64, 48, torch.float32), operand(32, 48, torch.float32), operand(64, 32, torch.float32)
    for name in ("tensorwise", "rowwise"):
        fast = Fp8Recipe(name, compiled_cast)
        assert torch.equal(linear_forward(x, w, fast), linear_forward(x, w, name))
        assert torch.equal(linear_dgrad(g, w, fast), linear_dgrad(g, w, name))
        assert torch.equal(linear_wgrad(g, x, fast, torch.float32), linear_wgrad(g, x, name, torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_compiled_cast_equals_the_baseline_bit_for_bit_on_cuda():
    """At the 8B slice's shapes (8192 tokens, hidden 4096, the FC1 weight [32768, 4096] among them): Triton kernels,
    with and without the transpose's copy (one kernel at 8192 x 4096; from q by a second kernel at the two 2^27
    shapes, SPLIT_NUMEL)."""
    from engine.ops.fp8_cast.compiled import cast as compiled_cast
    for rows, cols in ((8192, 4096), (32768, 4096), (8192, 16384)):
        t = operand(rows, cols, torch.bfloat16, "cuda")
        for fmt in FORMATS:
            for view in (t, t.t()):
                q, s = compiled_cast(view, *fmt)
                qb, sb = cast(view, *fmt)
                assert q.is_contiguous() and torch.equal(q.view(torch.uint8), qb.view(torch.uint8)), (rows, cols, fmt)
                assert torch.equal(s, sb), (rows, cols, fmt)
                if fmt[1] is None:  # both layouts from one tiled kernel (the transpose cast from the operand itself)
                    q2, _, qt = compiled_cast(view, *fmt, transposed=True)
                    assert torch.equal(q2.view(torch.uint8), qb.view(torch.uint8)), (rows, cols, fmt)
                    assert qt.is_contiguous() and torch.equal(qt.view(torch.uint8), qb.t().contiguous().view(torch.uint8))
    for fmt in FORMATS[:2]:  # the scale formed in Triton (its fp32 division is approximate: the graph's is not)
        for t in scale_cases("cuda"):
            q, s = compiled_cast(t, *fmt)
            qb, sb = cast(t, *fmt)
            assert torch.equal(s, sb) and torch.equal(q.view(torch.uint8), qb.view(torch.uint8)), t.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("config", [None, ((1024, 4, 2), (32, 64, 4)), ((8192, 16, 4), (128, 128, 8))],
                         ids=["default", "small-tiles", "big-tiles"])
def test_the_triton_cast_equals_the_baseline_bit_for_bit_on_cuda(config):
    """engine/ops/fp8_cast/triton_cast.py at the 8B slice's shapes and at shapes no tile divides, both layouts of the
    operand, both formats, rowwise, with and without q^T; at its default launch shapes and two others (a launch
    shape moves work between programs, never a bit: the amax is a max, the write elementwise). Then the scale over
    the amaxes of every magnitude (formed in the kernel from the partials, its reciprocal in fp64), and an all-zero,
    a NaN and an inf operand (scale 1, 1 and 0 as the baseline's)."""
    from engine.ops.fp8_cast import triton_cast

    def tensorwise(view, fmt, transposed=False):
        if config is None:
            return triton_cast.cast(view, *fmt, transposed=transposed)
        return triton_cast.tensorwise(view, fmt[0], transposed, *config)

    for rows, cols in ((8192, 4096), (8192, 32768), (32768, 4096), (1000, 72), (72, 1000)):
        t = operand(rows, cols, torch.bfloat16, "cuda")
        for fmt in FORMATS:
            for view in (t, t.t()):
                qb, sb = cast(view, *fmt)
                q, s = tensorwise(view, fmt) if fmt[1] is None and not fmt[2] else triton_cast.cast(view, *fmt)
                assert q.is_contiguous() and q.shape == view.shape, (rows, cols, fmt)
                assert torch.equal(q.view(torch.uint8), qb.view(torch.uint8)) and torch.equal(s, sb), (rows, cols, fmt)
                if fmt[1] is None:
                    q2, s2, qt = tensorwise(view, fmt, transposed=True) if not fmt[2] else \
                        triton_cast.cast(view, *fmt, transposed=True)
                    assert torch.equal(q2.view(torch.uint8), qb.view(torch.uint8)) and torch.equal(s2, sb)
                    assert qt.is_contiguous()
                    assert torch.equal(qt.view(torch.uint8), qb.t().contiguous().view(torch.uint8))
    for fmt in FORMATS[:2]:
        for t in scale_cases("cuda"):
            q, s, qt = tensorwise(t, fmt, transposed=True)
            qb, sb = cast(t, *fmt)
            assert torch.equal(s, sb) and torch.equal(q.view(torch.uint8), qb.view(torch.uint8)), t.abs().max().item()
        for special in (0.0, float("nan"), float("inf")):
            t = operand(64, 48, torch.bfloat16, "cuda")
            if special == 0.0:
                t.zero_()
            else:
                t[7, 9] = special
            (q, s), (qb, sb) = tensorwise(t, fmt), cast(t, *fmt)
            assert torch.equal(s, sb) and torch.equal(q.view(torch.uint8), qb.view(torch.uint8)), special


def test_the_triton_cast_refuses_an_operand_it_has_no_kernel_for():
    """CPU tensors (the version runs on CUDA; the registry says so before a run starts) and formats no recipe casts
    to: a clear error naming the version to use instead. Needs triton importable (the GPU image has it)."""
    pytest.importorskip("triton")
    from engine.ops.fp8_cast import triton_cast
    with pytest.raises(KernelLoadError, match="no Triton cast to torch.float8_e4m3fnuz.*--op-fp8-cast baseline"):
        triton_cast.cast(torch.ones(16, 16), torch.float8_e4m3fnuz, None, False)
    with pytest.raises(ValueError, match=r"casts 2-D CUDA operands; got \(16, 16\) on cpu: use --op-fp8-cast baseline"):
        triton_cast.cast(torch.ones(16, 16), E4M3, None, False)


@pytest.mark.slow  # two tiny CPU runs, one compiling its casts (~1 min on 2 cores)
def test_a_run_prints_the_same_losses_with_either_cast_version(tmp_path):
    """`--op-fp8-cast compiled` end to end (the layers' recipe carries it into every linear, forward and backward):
    the [LOSS] lines of a tiny rowwise run equal the baseline cast's, digit for digit."""
    import subprocess
    import sys
    from pathlib import Path

    def losses(version: str) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "engine", "pretrain", "--preset", "tiny", "--device", "cpu",
                              "--seq-length", "64", "--micro-batch-size", "4", "--num-steps", "3", "--warmup-steps", "1",
                              "--eval-samples", "0", "--no-save-final", "--fp8", "rowwise", "--op-fp8-cast", version,
                              "--run-dir", str(tmp_path / version)],
                             cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert f"fp8_cast={version}" in out.stdout
        return [" ".join(w for w in line.split() if not w.startswith(("time_s=", "mfu="))) for line in out.stdout.splitlines()
                if line.startswith("[LOSS]")]

    compiled, baseline = losses("compiled"), losses("baseline")
    assert len(compiled) == 3 and compiled == baseline
