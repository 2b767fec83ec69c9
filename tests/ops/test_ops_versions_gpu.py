"""Every non-baseline (CuTeDSL) version against an fp32 reference and against the baseline (GPU).

For each registered CUDA version and each case of gpu_cases.CASES: fresh random bf16 inputs, the
forward outputs and every input gradient (with random output gradients) are compared with the
op's contract computed in fp32 on fp32 copies of the same inputs (gpu_cases' `reference`, plain torch in this
process), by ||x - ref|| / ||ref||.

Tolerance REL_TOL = 1e-2 (METHOD.md: bf16 operands land between 1e-3 and 1e-2; each bf16 rounding
is <= 2^-9 relative, and sums of many rounded terms average out to a few 1e-3). The version must
also be no less accurate than the bf16 baseline on the same inputs by more than a factor of 2
(+ 1e-3): a kernel that is merely "within 1e-2" but much worse than torch is flagged too.

The versions and the baseline run in the engine's process (the `engine` fixture, tests/ops/versions_gpu_calls.py)
on the inputs and upstream gradients drawn here, and hand back outputs and gradients; the reference and every
assertion stay here: this process never imports the engine. The versions are read from the protected registers.
"""

import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.ops.gpu_cases import CASES

REL_TOL = 1e-2
ROOT = Path(__file__).resolve().parents[2]
CALLS = "tests.ops.versions_gpu_calls"

VERSIONS = [(p.parent.name, v) for p in sorted((ROOT / "engine" / "ops").glob("*/register.toml"))
            for v, spec in tomllib.loads(p.read_text(encoding="utf-8"))["versions"].items()
            if v != "baseline" and "cuda" in spec["devices"]]
PAIRS = [(case, version) for case in CASES for op, version in VERSIONS if op == case.op]


def _rel(x, ref):
    x, ref = x.detach().double(), ref.detach().double().to(x.device)
    assert torch.isfinite(x).all(), "non-finite values"
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _leaves(inputs):
    return [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.requires_grad]


def _reference(case, inputs, seed):
    """(outputs, {leaf: gradient}, upstream gradients) of the fp32 reference on fp32 copies of `inputs`."""
    x = {k: (v.detach().float().requires_grad_() if k in _leaves(inputs) else v) for k, v in inputs.items()}
    outs = case.reference(x)
    g = torch.Generator(device="cuda").manual_seed(seed + 100)
    # A scalar output (the loss sum of gemm_output) gets 1 / 8191, as a mean over tokens would
    # give it: versions that scale stored gradients in backward must apply it exactly.
    gouts = [torch.randn(o.shape, generator=g, device="cuda") if o.dim() else torch.full((), 1 / 8191, device="cuda")
             for o in outs]
    torch.autograd.backward(outs, gouts)
    return [o.detach() for o in outs], {k: x[k].grad if x[k].grad is not None else torch.zeros_like(x[k])
                                        for k in _leaves(inputs)}, gouts


@pytest.mark.gpu
@pytest.mark.parametrize("case,version", PAIRS, ids=[f"{c.op}-{v}-{c.name}" for c, v in PAIRS])
def test_version_matches_fp32_reference_and_baseline(case, version, engine):
    for seed in (11, 12):  # two fresh input draws
        inputs = case.make(seed, torch.bfloat16)
        ref_out, ref_grads, gouts = _reference(case, inputs, seed)
        runs = engine.call(f"{CALLS}:run", case.op, case.name, [version, "baseline"], inputs, gouts, _leaves(inputs))
        (out, grads), (base_out, base_grads) = ((runs[v]["out"], runs[v]["grad"]) for v in (version, "baseline"))
        assert [o.shape for o in out] == [o.shape for o in ref_out]
        assert [o.dtype for o in out] == [o.dtype for o in base_out]
        pairs = [(f"out{i}", out[i], base_out[i], ref_out[i]) for i in range(len(out))]
        pairs += [(f"grad {k}", grads[k], base_grads[k], ref_grads[k]) for k in ref_grads]
        for what, got, base, ref in pairs:
            err, base_err = _rel(got, ref), _rel(base, ref)
            assert err <= REL_TOL, f"{what}: rel. error {err:.2e} vs fp32 reference > {REL_TOL}"
            assert err <= 2 * base_err + 1e-3, f"{what}: rel. error {err:.2e}, baseline bf16 has {base_err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("case,version", PAIRS, ids=[f"{c.op}-{v}-{c.name}" for c, v in PAIRS])
def test_version_without_autograd_gives_its_forward(case, version, engine):
    """Evaluation runs every op under torch.no_grad, where a version may take another path (a kernel
    variant without the gradient outputs). Its outputs must be those it gives with autograd on, to
    within bf16 rounding: REL_TOL, the tolerance of the forward above (the variants may reduce in
    another order). quack's CE kernel without a gradient output took an online softmax that turned
    the padded vocabulary columns into NaN: every validation loss of the 0.5B preset was nan."""
    inputs = case.make(21, torch.bfloat16)
    got = engine.call(f"{CALLS}:forward_modes", case.op, case.name, version, inputs, _leaves(inputs))
    assert len(got["plain"]) == len(got["graded"])
    for i, (a, b) in enumerate(zip(got["plain"], got["graded"])):
        err = _rel(a, b)  # also asserts that the no-grad output is finite
        assert err <= REL_TOL, f"out{i}: no-grad output differs from the autograd one by {err:.2e} (rel.)"


TP_SHAPE = {"n": 512, "d": 4096, "v_padded": 73472, "vocab_size": 73448}  # MiniCPM4 vocab padded to 128 x 2


def _tp_inputs(seed: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n, d = TP_SHAPE["n"], TP_SHAPE["d"]
    h = torch.randn(n, d, generator=g)
    w = torch.randn(TP_SHAPE["v_padded"], d, generator=g) / d**0.5
    labels = torch.randint(0, TP_SHAPE["vocab_size"], (n,), generator=g)
    labels[::7] = -100
    labels[1] = TP_SHAPE["vocab_size"] - 1  # the last real column, next to rank 1's padding
    return h, w, labels


@pytest.mark.gpu
@pytest.mark.parametrize("version", [v for op, v in VERSIONS if op == "gemm_output"])
def test_gemm_output_vocab_parallel_two_ranks_on_one_gpu(version, engine):
    """Two real TP ranks (gloo, one GPU) vs the full-vocabulary fp32 reference, at TP=2 shard sizes."""
    h, w, labels = _tp_inputs()
    ranks = engine.call(f"{CALLS}:vocab_parallel", version, h, w, labels, TP_SHAPE["vocab_size"])
    h = h.cuda().bfloat16().float().requires_grad_()
    w = w.cuda().bfloat16().float().requires_grad_()
    logits = (h @ w.t())[:, :TP_SHAPE["vocab_size"]]  # padding columns never compete
    loss = F.cross_entropy(logits, labels.cuda(), ignore_index=-100, reduction="sum")
    loss.backward()
    v_local = TP_SHAPE["v_padded"] // 2
    assert ranks[0]["loss"].item() == ranks[1]["loss"].item()  # both ranks return the same loss
    for r, got in enumerate(ranks):
        assert abs(got["loss"].item() - loss.item()) <= 2e-3 * abs(loss.item()), (r, got["loss"].item(), loss.item())
        assert _rel(got["grad_h"].cuda(), h.grad) <= REL_TOL, r
        assert _rel(got["grad_w_shard"].cuda(), w.grad[r * v_local:(r + 1) * v_local]) <= REL_TOL, r
