"""--fp8 (engine/distributed/fp8.py): FP8 GEMMs of the decoder's linears, checked against independent references.

References: the exact linear in fp64 (x W^T, dy W, dy^T x), and `reference_linear_fp8` (the same quantisation,
dequantised, multiplied in fp32) for the scaled GEMM itself. Tolerances, and why:
- FP8 GEMM against its fake-quantised fp32 reference: 1e-5 relative (norm). Both multiply the same FP8 values
  (exact in fp32) and differ only in the order fp32 sums them and where 1 / scale is applied.
- FP8 linear against the exact linear, per GEMM, relative (Frobenius) error: E4M3 rounds each operand element
  to 3 mantissa bits, a relative error uniform in +-2^-4 (RMS ~2^-4 / sqrt(3) = 0.036 per element and operand);
  a product's two operands give ~0.05, and a dot product of K terms of random signs averages the errors of its
  terms: the output's relative error stays ~0.05 (errors and values both grow as sqrt(K)). E5M2 (tensorwise
  output gradient, 2 mantissa bits) doubles it for dgrad and wgrad: ~0.07. Bounds: 0.06 forward (E4M3 x E4M3),
  0.1 for the gradients, with Gaussian data (amax ~4 sigma: no element is flushed below E4M3's range).
  A bf16 linear is ~100x closer (8 bits: 2^-9), so the tests tell FP8 from bf16 apart (lower bound 5e-3).
- TP-sharded against unsharded (per-shard scales): a shard whose amax is smaller gets a larger scale, so its
  elements round on a finer grid; both are FP8 roundings of the same values, each within the bound above of
  the exact product, so the two are within twice it of each other; checked at 0.1.
"""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from engine.config import build_config, resolve
from engine.distributed.fp8 import (E4M3, E5M2, amax_scale, check_fp8_device, linear_dgrad, linear_forward,
                                    linear_wgrad, quantize, reference_linear_fp8)
from engine.distributed.tp_linear import TPComm, WgradHandOver
from engine.distributed.wgrad import MainGrad, attach_main_grad, fused_linear, linear_grads
from engine.errors import ConfigError
from engine.ops.dispatch import check_fp8, load_op, resolve_ops
from tests.engine.helpers import REPO, TINY_FAST, deterministic_fields, loss_lines, run_engine, run_engine_batch

RECIPES = ("tensorwise", "rowwise")


def checkpoint_state(path) -> dict:
    """A checkpoint's whole state, flattened: {key: tensor or value} (DCP read back through torch.save)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = path.parent / (path.name + ".pt")
    dcp_to_torch_save(str(path), str(out))
    flat: dict = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = value
    walk("", torch.load(out, weights_only=False))
    return flat


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def operands(n=64, k=96, m=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g), torch.randn(m, k, generator=g) * 0.02, torch.randn(n, m, generator=g) * 1e-3)


@pytest.mark.parametrize("recipe", RECIPES)
def test_fp8_gemms_match_their_reference_and_the_exact_linear(recipe):
    x, w, g = operands()
    y, dx, dw = linear_forward(x, w, recipe), linear_dgrad(g, w, recipe), linear_wgrad(g, x, recipe, torch.float32)
    ry, rdx, rdw = reference_linear_fp8(x, w, g, recipe)
    for got, ref in ((y, ry), (dx, rdx), (dw, rdw)):
        assert rel(got, ref) < 1e-5
    exact = (x.double() @ w.double().t(), g.double() @ w.double(), g.double().t() @ x.double())
    for got, ref, bound in ((y, exact[0], 0.06), (dx, exact[1], 0.1), (dw, exact[2], 0.1)):
        assert 5e-3 < rel(got, ref) < bound  # FP8, not bf16 or fp32 (see the module docstring)


@pytest.mark.parametrize("recipe", RECIPES)
def test_fp8_linear_autograd_against_the_exact_gradients(recipe):
    """The engine's linear (fused_linear with a recipe): forward and both gradients through autograd, with and without
    gradient-accumulation fusion into an fp32 main_grad (same values: the fused path adds the same FP8 product)."""
    x, w, g = operands(seed=1)
    for fused in (False, True):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        if fused:
            main = MainGrad(torch.zeros_like(w))
            attach_main_grad(wr, main)
        y = fused_linear(xr, wr, recipe)
        y.backward(g)
        dw = main.grad if fused else wr.grad
        assert rel(y.detach(), x.double() @ w.double().t()) < 0.06
        assert rel(xr.grad, g.double() @ w.double()) < 0.1
        assert rel(dw, g.double().t() @ x.double()) < 0.1
        assert rel(dw, reference_linear_fp8(x, w, g, recipe)[2]) < 1e-5


def _first_write_case(device: str, dtype: torch.dtype) -> None:
    """MainGrad.weight_grad with --fp8 tensorwise on `device`: while the buffer holds the zeros FlatBuffers.zero_grads
    wrote, the wgrad GEMM writes its product into it (torch._scaled_mm out=, read at the dispatcher: no add onto the
    buffer); later micro-batches add; zeroing again writes again. The result is the always-add path's bit for bit
    (0 + p = p). An unfused gradient added first (FlatBuffers' hook) turns the write off."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Writes(TorchDispatchMode):  # which calls wrote into or added onto the gradient buffer
        def __init__(self, grad):
            super().__init__()
            self.grad, self.calls = grad, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            target = kwargs.get("out", args[0] if func.overloadpacket is torch.ops.aten.add_ else None)
            if isinstance(target, torch.Tensor) and target.data_ptr() == self.grad.data_ptr():
                self.calls.append(func.overloadpacket.__name__)
            return func(*args, **kwargs)

    x, w, _ = (t.to(device, dtype) for t in operands(seed=3))
    gs = [operands(seed=s)[2].to(device, dtype) for s in (4, 5, 6)]

    def backward(main: MainGrad, g) -> list[str]:
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        attach_main_grad(wr, main)
        with Writes(main.grad) as writes:
            fused_linear(xr, wr, "tensorwise").backward(g)
        return writes.calls

    zeros = torch.zeros(w.shape, dtype=torch.float32, device=device)
    main = MainGrad(zeros.clone())
    assert [backward(main, g) for g in gs] == [["_scaled_mm"], ["add_"], ["add_"]]
    always = MainGrad(zeros.clone())
    always.add(zeros)  # an add of zeros: the same zeros, no longer known as such
    assert [backward(always, g) for g in gs] == [["add_"], ["add_"], ["add_"]]
    assert torch.equal(main.grad, always.grad)
    main.grad.zero_()
    main.reset(zeroed=True)
    assert backward(main, gs[0]) == ["_scaled_mm"]
    ref = reference_linear_fp8(x.float(), w.float(), gs[0].float(), "tensorwise")[2]
    # The product itself, fp32 out. CPU sums in fp32: 1e-5 (the module docstring). Hopper's FP8 tensor cores add
    # inside an MMA with ~14 mantissa bits (DeepSeek-V3 report, 3.3.2; cuBLAS promotes to fp32 between MMAs): 2^-14
    # relative, measured 6.8e-5 on an H200 at this shape; bound 2^-12 (4x margin), still 200x under FP8's own 0.05.
    assert rel(main.grad.cpu(), ref.cpu()) < (2.0**-12 if device == "cuda" else 1e-5)
    unfused = torch.randn_like(zeros)
    hooked = MainGrad(zeros.clone())
    hooked.add(unfused)
    assert backward(hooked, gs[0]) == ["add_"] and torch.equal(hooked.grad, unfused + main.grad)


def test_a_steps_first_fp8_weight_gradient_is_written_into_the_zeroed_buffer_and_the_rest_added():
    """_first_write_case on CPU (the emulation). A CUDA graph capture also turns the write off (its replays would
    write again): no capture on CPU, that branch is the GPU's only."""
    _first_write_case("cpu", torch.float32)


@pytest.mark.gpu
def test_the_first_fp8_weight_gradient_is_written_on_the_gpu_bit_for_bit_as_added():
    """_first_write_case with bf16 operands on cuBLAS's FP8 GEMM (fp32 out= into the buffer)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a CUDA GPU of compute capability 8.9+")
    _first_write_case("cuda", torch.bfloat16)


def test_scale_follows_amax_and_zero_amax_is_handled():
    t = torch.tensor([[0.5, -3.0], [0.0, 0.25]])
    assert amax_scale(t, E4M3, None, False).item() == pytest.approx(448.0 / 3.0)
    assert amax_scale(t * 10, E4M3, None, False).item() == pytest.approx(448.0 / 30.0)  # scale follows amax
    rows = amax_scale(t, E4M3, -1, False)
    assert rows.flatten().tolist() == pytest.approx([448.0 / 3.0, 448.0 / 0.25])
    assert amax_scale(t, E4M3, -1, True).flatten().tolist() == [128.0, 1024.0]  # floor to a power of 2
    assert amax_scale(t, E5M2, None, False).item() == pytest.approx(57344.0 / 3.0)
    zero = torch.zeros(4, 16)
    q, s = quantize(zero, E4M3, None)
    assert s.item() == 1.0 and torch.equal(q.float(), zero)
    q, s = quantize(torch.cat([zero[:1], torch.ones(1, 16)]), E4M3, -1)  # an all-zero row beside a non-zero one
    assert s.flatten().tolist() == [1.0, 448.0] and torch.isfinite(q.float()).all()
    assert torch.equal(linear_forward(zero, torch.randn(8, 16), "tensorwise"), torch.zeros(4, 8))


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_overflow_is_scaled_not_inf_and_underflow_flushes(dtype):
    """Values far beyond FP8's range (1e6 > 448 and 57344) are mapped into it by the scale: the largest lands on
    the format's max, nothing is inf or nan, and the dequantised value is back within the format's rounding.
    Values 2^-40 below the amax are beneath FP8's smallest subnormal after scaling and flush to 0 (the known
    cost of one scale per tensor: what rowwise scaling and E5M2's range reduce)."""
    t = torch.tensor([1e6, -2.5e5, 3.0, 1e6 * 2.0**-40])
    q, s = quantize(t, dtype, None)
    qf = q.float()
    assert torch.isfinite(qf).all() and qf.abs().max().item() == torch.finfo(dtype).max
    back = qf / s
    tol = 2.0**-3 if dtype == E4M3 else 2.0**-2  # half a unit in the last place, relative, with margin
    assert ((back[:2] - t[:2]).abs() / t[:2].abs()).max() < tol
    assert back[3].item() == 0.0  # underflow: flushed
    y = linear_forward(torch.full((16, 16), 1e30), torch.full((16, 16), 1e-3), "tensorwise")
    assert torch.isfinite(y).all()  # fp32 output of 1e30 x 1e-3 x 16: representable, computed without overflow


@pytest.mark.parametrize("recipe", RECIPES)
def test_tp_sharded_fp8_linear_equals_the_unsharded(recipe):
    """Column-parallel (weight rows split) and row-parallel (input features split, partials summed: the TP
    all-reduce), each shard scaled by its own amax, against the unsharded FP8 linear and the exact one. The
    collectives themselves run at TP 2 in tests/parallel (same code path: tp_linear.py's GEMM calls)."""
    x, w, g = operands(n=64, k=128, m=64, seed=2)
    w = w * torch.linspace(0.2, 5.0, w.shape[0]).unsqueeze(1)  # shards of different amax: different scales
    full = linear_forward(x, w, recipe)
    col = torch.cat([linear_forward(x, part, recipe) for part in w.chunk(2, 0)], dim=1)
    row = sum(linear_forward(xp, wp, recipe) for xp, wp in zip(x.chunk(2, 1), w.chunk(2, 1)))
    exact = x.double() @ w.double().t()
    for sharded in (col, row):
        assert rel(sharded, full) < 0.1 and rel(sharded, exact) < 0.06
    dx_row = torch.cat([linear_dgrad(g, wp, recipe) for wp in w.chunk(2, 1)], dim=1)
    dx_col = sum(linear_dgrad(gp, wp, recipe) for gp, wp in zip(g.chunk(2, 1), w.chunk(2, 0)))
    for dx in (dx_row, dx_col):
        assert rel(dx, linear_dgrad(g, w, recipe)) < 0.1 and rel(dx, g.double() @ w.double()) < 0.1


def test_tp_linear_grads_and_hand_over_take_the_recipe():
    """linear_grads (the row-parallel backward) with a recipe is the FP8 pair; the MLP region's hand-over keeps the
    operands whatever the recipe (its node computes FC2's wgrad with TPComm.fp8)."""
    x, w, g = operands(seed=3)
    dx, dw = linear_grads(g, x, w, None, (True, True), "tensorwise")
    assert torch.equal(dx, linear_dgrad(g, w, "tensorwise")) and torch.equal(dw, linear_wgrad(g, x, "tensorwise", w.dtype))
    hand = WgradHandOver()
    assert hand.weight_grad(g, x, w, "rowwise") is None and hand.grad_out is g
    assert TPComm(size=2, group=None, fp8="rowwise").fp8 == "rowwise"


def test_refusals_name_field_value_and_fix():
    with pytest.raises(ConfigError, match="--fp8.*8.9"):
        check_fp8_device("tensorwise", "cuda", (8, 0))  # A100: no FP8 tensor cores
    check_fp8_device("tensorwise", "cuda", (9, 0))  # H100 / H200
    check_fp8_device("rowwise", "cpu", None)  # the emulation
    with pytest.raises(ConfigError, match="--fp8"):
        resolve(build_config({"fp8": "e4m3"}))
    with pytest.raises(ConfigError, match="--head-dim"):
        resolve(build_config({"fp8": "tensorwise", "head_dim": 24}))
    with pytest.raises(ConfigError, match="--fp8-weight-cache.*--fp8 is rowwise.*add --fp8 tensorwise"):
        resolve(build_config({"fp8": "rowwise", "fp8_weight_cache": True}))
    assert resolve(build_config({"fp8": "tensorwise", "fp8_weight_cache": True, "cuda_graphs": True})).cuda_graphs
    # --fsdp-fp8-all-gather's own refusals: tests/parallel/test_fsdp.py (the CLI); --cuda-graphs is refused by DP 2
    ag = {"fsdp": True, "fsdp_fp8_all_gather": True, "fp8": "tensorwise", "micro_batch_size": 2}
    assert resolve(build_config(ag), 2).fsdp_fp8_all_gather
    with pytest.raises(ConfigError, match="--cuda-graphs=True replays captured micro-batches.*DP 2"):
        resolve(build_config({**ag, "cuda_graphs": True}), 2)
    with pytest.raises(ConfigError, match="--optimizer='muon' is not supported with --fsdp"):
        resolve(build_config({**ag, "optimizer": "muon"}), 2)
    cfg = resolve(build_config({"fp8": "tensorwise"}))

    def no_fp8_path(x, w, *, main_grad=None):
        return x

    with pytest.raises(ConfigError, match="--op-gemm-fc1.*FP8 path.*compiled"):  # the fix names the version to use
        check_fp8(cfg, "quack", no_fp8_path)
    resolve_ops(cfg, "cpu")  # baseline has the path
    check_fp8(cfg, "compiled", load_op("gemm_fc1", "compiled"))  # and compiled (tests/ops/test_gemm_fc1_compiled.py)
    check_fp8(dataclasses.replace(cfg, fp8="off"), "quack", no_fp8_path)


# The CLI's refusal of an unknown recipe (exit 2, nothing written): tests/engine/test_bad_input.py's batch.


def test_fp8_training_learns_and_resumes_bit_for_bit(tmp_path):
    """A short CPU run with --fp8 tensorwise (the emulation): the loss falls, stays near the fp32 run's, and a resume
    from step 3 repeats steps 4-6 bit for bit (FP8 scales are recomputed from the restored tensors: no state), and the same
    checkpoint resumes with --fp8 off."""
    args = [*TINY_FAST, "--fp8", "tensorwise", "--eval-samples", "0", "--peak-tflops", "1"]
    ref = run_engine("pretrain", *args, "--save-every", "3", "--run-dir", str(tmp_path / "a"))
    lines = loss_lines(ref.stdout)
    losses = [float(deterministic_fields(line)[1]) for line in lines]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.3
    # MFU against both peaks (engine/flops.py): `mfu` against bf16's (here --peak-tflops), `mfu_fp8_peak` twice it
    records = [json.loads(r) for r in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "loss"]
    assert len(steps) == 6 and all(r["mfu"] > 0 and r["mfu_fp8_peak"] == pytest.approx(r["mfu"] / 2) for r in steps)
    # the linears keep their forward's FP8 copies: bit for bit the path that casts every backward operand again
    # (tests/engine/fp8_recast.py; tests/engine/test_fp8_saved.py for recompute, TP and the compiled cast)
    recast = subprocess.run([sys.executable, "-m", "tests.engine.fp8_recast", "pretrain", *args, "--save-every", "3",
                             "--run-dir", str(tmp_path / "r")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert recast.returncode == 0, recast.stderr[-3000:]
    assert [deterministic_fields(line) for line in loss_lines(recast.stdout)] == \
        [deterministic_fields(line) for line in lines]
    final, recast_final = (checkpoint_state(tmp_path / run / "checkpoints" / "step_00000006") for run in "ar")
    assert final.keys() == recast_final.keys() and len(final) > 10
    for name, value in final.items():  # model weights, fp32 masters, optimizer moments, trainer and data state
        if name.startswith("rng/") or name == "trainer.elapsed_s":  # torch's global generator, seeded anew by each
            continue  # process (training draws from its own generators); the wall clock
        assert torch.equal(value, recast_final[name]) if torch.is_tensor(value) else value == recast_final[name], name
    # Both resumes of step 3 in one process (tests/engine/engine_batch.py: one start-up), --fp8 off first: anything the
    # first left behind in the process could only break the bit-for-bit resume after it, never pass it.
    step3 = str(tmp_path / "a" / "checkpoints" / "step_00000003")
    switched, resumed = run_engine_batch([
        ["pretrain", *TINY_FAST, "--eval-samples", "0", "--run-dir", str(tmp_path / "c"), "--resume", step3],
        ["pretrain", *args, "--run-dir", str(tmp_path / "b"), "--resume", step3]])
    assert switched.returncode == 0 and resumed.returncode == 0, switched.stderr[-3000:] + resumed.stderr[-3000:]
    assert [deterministic_fields(line) for line in loss_lines(resumed.stdout)] == \
        [deterministic_fields(line) for line in lines[3:]]
    # FP8 keeps no state: the same checkpoint continues with --fp8 off (step 4 from the same weights, fp32 GEMMs:
    # within FP8's effect on the loss, observed 4e-4 relative on this model; bound 1e-2)
    step4 = float(deterministic_fields(loss_lines(switched.stdout)[0])[1])
    assert abs(step4 - losses[3]) / losses[3] < 1e-2 and "fp8" not in switched.stderr.lower()


@pytest.mark.slow  # two tiny CPU runs
@pytest.mark.parametrize("fp8", ["off", "tensorwise"])
def test_writing_a_steps_first_weight_gradients_trains_bit_for_bit_as_adding_them(tmp_path, fp8):
    """A 3-step CPU run at two micro-batches a step (the first writes its weight gradients, FP8 or not, over what
    the last step left in the buffer, the second adds), against the same run clearing the buffer every step and
    adding every gradient (tests/engine/always_add.py): every [LOSS] field and the final checkpoint (weights, fp32
    masters, moments) bit for bit."""
    args = [*TINY_FAST, "--fp8", fp8, "--eval-samples", "0", "--num-steps", "3", "--grad-accum-steps", "2"]
    ref = run_engine("pretrain", *args, "--run-dir", str(tmp_path / "w"))
    always = subprocess.run([sys.executable, "-m", "tests.engine.always_add", "pretrain", *args, "--run-dir",
                             str(tmp_path / "a")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert always.returncode == 0, always.stderr[-3000:]
    lines = [deterministic_fields(line) for line in loss_lines(ref.stdout)]
    assert len(lines) == 3 and lines == [deterministic_fields(line) for line in loss_lines(always.stdout)]
    final, added = (checkpoint_state(tmp_path / run / "checkpoints" / "step_00000003") for run in "wa")
    assert final.keys() == added.keys() and len(final) > 10
    for name, value in final.items():
        if name.startswith("rng/") or name == "trainer.elapsed_s":  # each process's own seed; the wall clock
            continue
        assert torch.equal(value, added[name]) if torch.is_tensor(value) else value == added[name], name


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_fp8_gemms_on_the_gpu_match_the_reference(recipe):
    """cuBLAS / CUTLASS FP8 GEMMs in bf16 against the fp32 reference of the same quantisation (bf16 output rounding:
    2^-9 relative, so 1e-2), and against the exact linear as on CPU."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a CUDA GPU of compute capability 8.9+")
    x, w, g = (t.cuda().bfloat16() for t in operands(n=256, k=512, m=384, seed=4))
    y, dx = linear_forward(x, w, recipe), linear_dgrad(g, w, recipe)
    dw = linear_wgrad(g, x, recipe, torch.float32)
    ry, rdx, rdw = reference_linear_fp8(x, w, g, recipe)
    for got, ref in ((y, ry), (dx, rdx), (dw, rdw)):
        assert rel(got.float(), ref) < 1e-2
    assert rel(y, x.double() @ w.double().t()) < 0.06
    assert rel(dw, g.double().t() @ x.double()) < 0.1
