"""--optimizer muon on one process: Newton-Schulz against the scalar polynomial it applies to singular values,
the engine's training against an independent loop (tests/engine/muon_reference.py), resume bit for bit, bad
flags and a resume with another optimizer refused. TP and DP: tests/parallel/test_muon_parallel.py.

Tolerances:
- NS in fp32 vs the quintic applied to the singular values in fp64: 1e-4 absolute (fp32 rounding of five
  rounds of three matmuls on a 64 x 256 matrix; observed ~1e-6). In bf16 (unit roundoff 3.9e-3, rounded again
  every step, and p's slope, up to 3.4, amplifies what the early steps round): 6e-2 on each singular value
  (observed 3.2e-2), and the band [0.68, 1.21] that p^5 maps [0.03, 1] into, widened by 2e-2 (observed inside
  [0.677, 1.142]).
- Engine vs the independent loop, 8 steps of tiny in fp32: logits of a fixed batch at rel. 1e-4. The two add
  the same products in another order (fused QKV, flat buffers, fp32 vs fp64 NS), ~1e-7 per step, which NS can
  amplify on its smallest singular directions (p'(0) = 3.4); observed 2.6e-7. Each negative control (no
  Nesterov; Q/K/V and gate/up orthogonalised as one fused matrix) lands >= 1e-3 away (observed 8.9e-3, 9.6e-3).
"""

import math

import pytest
import torch

from engine.checkpoint.store import check_compatible, meta_for
from engine.config import build_config, resolve
from engine.errors import ConfigError
from engine.optim.muon import assign_owners, newton_schulz
from tests.engine.adamw_reference import initial_weights, reference_logits
from tests.engine.helpers import deterministic_fields, loss_lines, run_engine
from tests.engine.muon_reference import KELLER, train_muon_reference
from tests.once import once_per_run
from tests.parallel.workers import fixed_tokens, make_config, single_run

MUON = {"optimizer": "muon"}


def _quintic_of(singular: torch.Tensor, steps: int) -> torch.Tensor:
    a, b, c = KELLER
    s = singular.double()
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return s


def _gaussian(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("shape", [(64, 256), (256, 64)])
def test_newton_schulz_applies_the_quintic_to_the_singular_values(shape):
    """NS(G) = U p^5(S / ||G||_F) V^T: the same singular vectors, the singular values mapped by the scalar
    polynomial. Tall and wide inputs alike (tall ones iterate on the transpose)."""
    g = _gaussian(*shape, seed=1)
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    want = (u * _quintic_of(s / g.norm(), 5)) @ vh
    got = newton_schulz(g.float(), 5, torch.float32)
    assert got.shape == g.shape and got.dtype == torch.float32
    assert (got.double() - want).abs().max().item() < 1e-4
    assert newton_schulz(g.float(), 4, torch.float32).sub(got).abs().max().item() > 1e-2  # the step count is used


def test_newton_schulz_in_bf16_is_near_orthogonal():
    """In bf16 (the GPU path) the singular values sit in the quintic's band: normalised singular values of a
    64 x 256 Gaussian lie in [0.06, 0.19], which five steps map into [0.68, 1.21]."""
    g = _gaussian(64, 256, seed=2)
    s_in = torch.linalg.svdvals(g) / g.norm()
    assert s_in.min() > 0.03
    got = torch.linalg.svdvals(newton_schulz(g.float(), 5, torch.bfloat16).double())
    assert got.min() > 0.68 - 2e-2 and got.max() < 1.21 + 2e-2, (got.min(), got.max())  # near-orthogonal
    want = _quintic_of(s_in, 5).sort(descending=True).values  # p is not monotonic: compare as sorted sets
    assert (got - want).abs().max() < 6e-2, (got - want).abs().max()
    raw = torch.linalg.svdvals(g / g.norm())
    assert raw.max() < 0.2  # the input was far from orthogonal: the band is NS's doing


def test_owners_are_whole_matrices_balanced_and_agreed():
    sizes = {"a": 100, "b": 60, "c": 50, "d": 40, "e": 10}
    owner = assign_owners(sizes, 2)
    load = [sum(n for k, n in sizes.items() if owner[k] == r) for r in range(2)]
    assert sum(load) == 260 and max(load) - min(load) <= max(sizes.values())  # greedy's bound: within one matrix
    assert {owner["a"], owner["b"]} == {0, 1}  # the two largest never share a rank
    assert assign_owners(dict(reversed(sizes.items())), 2) == owner  # a pure function of names and sizes
    assert set(assign_owners(sizes, 1).values()) == {0}


@pytest.mark.parametrize("flags, field", [
    ({"optimizer": "lion"}, "--optimizer"),
    ({"optimizer": "muon", "muon_momentum": 1.0}, "--muon-momentum"),
    ({"optimizer": "muon", "muon_momentum": -0.1}, "--muon-momentum"),
    ({"optimizer": "muon", "muon_ns_steps": 0}, "--muon-ns-steps"),
    ({"optimizer": "muon", "muon_update_rms": 0.0}, "--muon-update-rms"),
    ({"muon_ns_steps": 6}, "--muon-ns-steps"),  # a Muon knob without --optimizer muon would be ignored
    ({"muon_nesterov": False}, "--muon-nesterov"),
])
def test_bad_muon_flags_are_rejected_with_one_line(flags, field):
    with pytest.raises(ConfigError) as err:
        resolve(build_config(flags))
    text = str(err.value)
    assert text.startswith(field) and "\n" not in text and ": " in text  # field, value, then the fix


def test_resume_with_another_optimizer_is_refused(tmp_path):
    adamw, muon = resolve(build_config({})), resolve(build_config(MUON))
    layout = {"tp": 1, "dp": 1}
    with pytest.raises(ConfigError, match="^--optimizer='muon' differs from the checkpoint"):
        check_compatible(meta_for(adamw, 4, layout), muon, tmp_path, layout)
    with pytest.raises(ConfigError, match="use --optimizer muon"):
        check_compatible(meta_for(muon, 4, layout), adamw, tmp_path, layout)
    old = meta_for(adamw, 4, layout)
    del old["config"]["optimizer"]  # written before the field existed: AdamW's
    assert check_compatible(old, adamw, tmp_path, layout) is False
    with pytest.raises(ConfigError):
        check_compatible(old, muon, tmp_path, layout)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One GEMM blocking for every run compared bit for bit (and tiny GEMMs run faster on one thread of a busy
    machine than on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
@once_per_run
def muon_single(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # set up before the module's one_thread: a session fixture comes first
    try:
        run4 = single_run(MUON, 4, save_to=str(tmp_path_factory.mktemp("muon_ckpt")))
        return {"run8": single_run(MUON, 8), "run4": run4, "resumed": single_run({**MUON, "resume": run4["checkpoint"]}, 4)}
    finally:
        torch.set_num_threads(threads)


def test_one_process_matches_an_independent_muon_loop(muon_single, tmp_path):
    cfg = make_config({**MUON, "num_steps": 20}, 1, str(tmp_path))
    init, tokens = initial_weights(cfg), fixed_tokens(cfg.vocab_size)
    got = muon_single["run8"]
    weights, losses = train_muon_reference(init, cfg, 8)
    want = reference_logits(weights, cfg, tokens)
    assert _rel(got["logits"], want) < 1e-4, _rel(got["logits"], want)
    for step, ((loss, _), ref) in enumerate(zip(got["steps"], losses), start=1):
        assert math.isclose(loss, ref, rel_tol=1e-5), f"step {step}: {loss} vs {ref}"
    assert losses[-1] < losses[0] - 1.0  # it trains
    controls = {"no nesterov": train_muon_reference(init, cfg, 8, nesterov=False)[0],
                "fused qkv / fc1": train_muon_reference(init, cfg, 8, split=False)[0]}
    for what, w in controls.items():
        assert _rel(got["logits"], reference_logits(w, cfg, tokens)) > 1e-3, what


def test_resume_is_bitwise(muon_single):
    """Momentum and masters come back from the checkpoint: steps 5-8 after a resume at 4 print the same bits."""
    resumed = muon_single["resumed"]
    assert resumed["steps"] == muon_single["run8"]["steps"][4:]
    assert torch.equal(resumed["logits"], muon_single["run8"]["logits"])


@pytest.mark.gpu
def test_muon_on_cuda_in_bf16_trains_like_fp32_on_cpu(tmp_path):
    """The GPU path: bf16 compute and Newton-Schulz in bf16, the CuTeDSL ops, against the fp32 CPU run of the
    same seed and data (tiny, 8 steps). 3e-2 relative per step, as tests/engine/test_gpu_default_kernels.py
    allows bf16 against bf16: here each NS step also rounds to bf16 (4e-3), a few optimizer steps at lr 1e-2
    let that drift grow; a wrong update (NS of the wrong matrix, a missing scale) moves the loss by far more."""
    common = ["pretrain", "--preset", "tiny", "--optimizer", "muon", "--num-steps", "8", "--warmup-steps", "2",
              "--eval-samples", "0", "--no-save-final"]
    gpu = run_engine(*common, "--device", "cuda", "--run-dir", str(tmp_path / "gpu"), timeout=600)
    cpu = run_engine(*common, "--device", "cpu", "--run-dir", str(tmp_path / "cpu"), timeout=600)
    assert "Newton-Schulz steps in bfloat16" in gpu.stdout and "Newton-Schulz steps in float32" in cpu.stdout
    lg = [float(deterministic_fields(x)[1]) for x in loss_lines(gpu.stdout)]
    lc = [float(deterministic_fields(x)[1]) for x in loss_lines(cpu.stdout)]
    assert len(lg) == len(lc) == 8 and lg[-1] < lg[0] - 0.5
    for step, (a, b) in enumerate(zip(lg, lc), start=1):
        assert abs(a - b) / b < 3e-2, f"step {step}: cuda {a} vs cpu {b}"
