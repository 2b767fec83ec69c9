"""Stress tests: every CuTeDSL version runs for --stress-seconds next to noisy GPU neighbours.

    python -m pytest tests/ops/test_ops_stress.py --stress-seconds 60

Each version (gpu_cases shapes) runs forward + backward continuously on its own stream while cuBLAS
GEMMs, 1 GiB device copies, allocation churn and CUDA-graph replays run on other streams, with
cross-stream producer / consumer events around every call (tests/ops/stress_harness.py). Every
iteration is compared with the baseline's result on the same inputs; NaN/Inf, a relative error above
STRESS_TOL or a hang (no iteration within HANG_S) fails the test.

STRESS_TOL = 2e-2 compares two bf16 computations with each other (each within ~1e-2 of the exact
result, see test_ops_versions_gpu.py), so twice the single-version tolerance.

The negative controls prove the harness can fail: a version that corrupts every third result by 5%,
one that injects a NaN, and one that stalls its stream (a GPU sleep longer than the watchdog's
limit) must each be reported.
"""

import pytest
import torch

from engine.ops.dispatch import OP_NAMES, load_op, load_register
from tests.ops.gpu_cases import CASES
from tests.ops.stress_harness import StressCase, run_stress

STRESS_TOL = 2e-2
HANG_S = 60.0

VERSIONS = [(op, v) for op in OP_NAMES for v, spec in load_register(op).versions.items()
            if v != "baseline" and "cuda" in spec.devices]
# One case per op (its first), so a full run costs (versions x --stress-seconds).
PAIRS = [(next(c for c in CASES if c.op == op), v) for op, v in VERSIONS]


def _case(case, version_fn, baseline_fn, *, tol=STRESS_TOL) -> StressCase:
    return StressCase(name=f"{case.op}:{case.name}", make_inputs=lambda seed: case.make(seed, torch.bfloat16),
                      call=case.call, version=version_fn, baseline=baseline_fn, tol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("case,version", PAIRS, ids=[f"{c.op}-{v}" for c, v in PAIRS])
def test_version_survives_stress(case, version, stress_seconds):
    report = run_stress(_case(case, load_op(case.op, version), load_op(case.op, "baseline")), stress_seconds,
                        hang_s=HANG_S)
    print(f"{case.op}/{version}: {report.iterations} iterations, max rel. err {report.max_rel_err:.2e}, "
          f"neighbours {report.neighbour_iterations}")
    assert not report.failures, report.failures
    assert report.iterations >= 2
    assert all(n > 0 for n in report.neighbour_iterations.values()), report.neighbour_iterations


class _Broken:
    """A deliberately wrong 'version': the baseline with every `every`-th result damaged."""

    def __init__(self, fn, every: int, damage: str):
        self.fn, self.every, self.damage, self.calls = fn, every, damage, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        out = self.fn(*args, **kwargs)
        if self.calls % self.every:
            return out
        first = out[0] if isinstance(out, tuple) else out
        if self.damage == "scale":
            first = first * 1.05
        elif self.damage == "nan":
            first = first.clone()
            first.view(-1)[0] = float("nan")
        elif self.damage == "stall":
            # torch has no public "busy-wait on the GPU"; _sleep is what its own stream tests use.
            torch.cuda._sleep(int(3e9))  # ~2 s of GPU time on the op's stream: longer than the watchdog's 0.5 s
        return (first, *out[1:]) if isinstance(out, tuple) else first


@pytest.mark.gpu
@pytest.mark.parametrize("damage,expect", [("scale", "rel. error"), ("nan", "NaN/Inf"), ("stall", "hang")])
def test_negative_control_broken_version_is_caught(damage, expect):
    case = next(c for c in CASES if c.op == "rmsnorm")
    baseline = load_op("rmsnorm", "baseline")
    every = 1 if damage == "stall" else 3
    report = run_stress(_case(case, _Broken(baseline, every, damage), baseline), seconds=3.0,
                        hang_s=0.5 if damage == "stall" else HANG_S)
    assert report.failures, f"the harness missed a broken version ({damage})"
    assert any(expect in f for f in report.failures), report.failures
