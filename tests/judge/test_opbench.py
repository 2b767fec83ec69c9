"""The op milestones' judge (issue 11, stage 2): harness/opbench.py runs an op version in the sandbox, the
judge checks it with its own fp32 math, the base's baseline process and its own clock
(harness/judge/opjudge.py).

On CPU with small shapes, in the loop tests' mini project (the real engine): an honest new rmsnorm
version is accepted with a speedup near 1 (the same math); a version with wrong math, and a version that
answers repeated calls from a cache, are rejected by name; a patch that slows the engine's own
`baseline.py` does not raise the speedup (the reference runs the base commit's baseline).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.judge.opcases import OPS, call_op, draw_cases, make_inputs, reference, result_names
from harness.judge.tensorfile import TensorFileError, read_tensors, write_tensors
from tests.loop.loop_helpers import git, home, project_template, temper  # noqa: F401 -- fixtures

REPO = Path(__file__).resolve().parents[2]

__all__: list[str] = []


# ---------------------------------------------------------------- units


def test_tensor_files_round_trip_and_refuse_what_does_not_fit(tmp_path: Path) -> None:
    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(7), "c": torch.zeros(0, 4),
               "d": torch.randn(2, 3, 4)[:, 1],  # a non-contiguous view
               "e": torch.randn(10, 3)[2:5]}  # a contiguous view into a larger storage
    write_tensors(tmp_path / "t", tensors)
    back = read_tensors(tmp_path / "t")
    assert set(back) == set(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    data = (tmp_path / "t").read_bytes()
    (tmp_path / "short").write_bytes(data[:-3])
    with pytest.raises(TensorFileError, match="does not fit"):
        read_tensors(tmp_path / "short")
    header, _, body = data.partition(b"\n")
    entries = json.loads(header)
    entries["a"]["dtype"] = "object"
    (tmp_path / "dtype").write_bytes(json.dumps(entries).encode() + b"\n" + body)
    with pytest.raises(TensorFileError, match="malformed"):
        read_tensors(tmp_path / "dtype")
    with pytest.raises(TensorFileError, match="more than"):
        read_tensors(tmp_path / "t", max_bytes=10)


def test_cases_are_drawn_from_the_seed_and_respect_the_contracts() -> None:
    for op in OPS:
        a, b, c = draw_cases(op, 11, 6), draw_cases(op, 11, 6), draw_cases(op, 12, 6)
        assert a == b and a != c
        for case in a:
            if op == "attention":
                assert case.dims["heads_q"] % case.dims["heads_kv"] == 0 and case.dims["head_dim"] in (64, 128)
            if "hidden" in case.dims:
                assert case.dims["hidden"] % 8 == 0
            if op == "gemm_output":
                assert case.dims["vocab_local"] % 128 == 0 and case.dims["vocab_local"] - 128 < case.dims["vocab_size"] <= case.dims["vocab_local"]


@pytest.mark.parametrize("op", OPS)
def test_the_judges_fp32_math_matches_the_engines_baseline(op: str) -> None:
    """Two independent writings of each contract (the judge's einsum/explicit forms and engine/ops/*/baseline.py,
    in fp32 on CPU) agree to 1e-5 relative: fp32 rounding of different summation orders, nothing more."""
    from engine.ops.dispatch import load_op

    fn = load_op(op, "baseline")
    for case in draw_cases(op, 5, 2, scale=0.1):
        inputs = make_inputs(case, dtype=torch.float32)
        want = reference(case, inputs)
        outs = call_op(fn, case, inputs)
        torch.autograd.backward(outs, [inputs[f"dout.{i}"] for i in range(len(outs))])
        for name in result_names(case):
            value = outs[int(name[4:])] if name.startswith("out.") else inputs[name[len("grad."):]].grad
            err = float((value.detach() - want[name]).norm() / want[name].norm().clamp_min(1e-30))
            assert err < 1e-5, f"{case.label()} {name}: {err:.2e}"


# ---------------------------------------------------------------- judged end to end (CPU)

MILESTONE = """
id = "op-cpu"
title = "a new rmsnorm version (CPU-sized)"
goal = "x"
editable = ["engine/ops/rmsnorm/**"]

[requires]
device = "cpu"

[[gates]]
kind = "protected"

[[gates]]
kind = "job"
name = "bench"
task = "bench"
timeout_s = 300
bench = { op = "rmsnorm", version = "mine", shape = { tokens = 2048, hidden = 1024 }, cases = 3, case_scale = 0.1, reps = 30, rounds = 1 }

[[gates]]
kind = "job"
name = "stress"
task = "stress"
timeout_s = 300
bench = { op = "rmsnorm", version = "mine", shape = { tokens = 256, hidden = 512 }, seconds = 2, rounds = 1 }

[[gates]]
kind = "metrics"
# CPU timings swing 10x on a loaded 2-core machine: the rule exercises the metric, not a speed goal.
rules = [{ job = "bench", metric = "speedup", op = ">=", value = 0.01 }]

[budget]
max_turns = 1
max_tokens = 1
max_wall_s = 60
max_attempts = 1
"""

REGISTER = """
[versions.mine]
entry = "engine.ops.rmsnorm.mine:rmsnorm"
devices = ["cpu", "cuda"]
requires = []
description = "a new version"
"""

HONEST = '''"""rmsnorm written out in fp32, rounded once."""

import torch

__all__ = ["rmsnorm"]


def _norm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rmsnorm(x, weight, *, eps, residual=None, residual_scale=1.0):
    if residual is None:
        return _norm(x, weight, eps)
    s = (residual.float() + residual_scale * x.float()).to(residual.dtype)
    return _norm(s, weight, eps), s
'''

WRONG = HONEST.replace("* weight.float()", "")  # forgets the weight: right norm, wrong scale

CACHED = HONEST.replace('''def rmsnorm(x, weight, *, eps, residual=None, residual_scale=1.0):
''', '''_SEEN = {}


def rmsnorm(x, weight, *, eps, residual=None, residual_scale=1.0):
    key = (x.data_ptr(), tuple(x.shape), residual is None)
    if key in _SEEN:  # a repeated buffer: answer from the cache (keeps the graph alive through x and weight)
        out, s = _SEEN[key]
        keep = 0 * (x.sum() + weight.sum() + (0 if residual is None else residual.sum()))
        return out + keep if residual is None else (out + keep, s + keep)
    result = _rmsnorm(x, weight, eps=eps, residual=residual, residual_scale=residual_scale)
    _SEEN[key] = (result.detach(), None) if residual is None else (result[0].detach(), result[1].detach())
    return result


def _rmsnorm(x, weight, *, eps, residual=None, residual_scale=1.0):
''')


# Wrong (fast) math, plus a hook that hands in the reference process's files as its own when it exits:
# the judge must keep each role's files out of the other's sight.
COPYCAT = WRONG + '''

import atexit
import shutil
import sys
from pathlib import Path


def _hand_in_the_references_files():
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    for root in (out.parent, out.parent.parent, Path("/tmp")):
        for other in root.rglob("*.tensors"):
            if out not in other.parents:
                shutil.copyfile(other, out / other.name)


if "--out" in sys.argv:
    atexit.register(_hand_in_the_references_files)
'''


# Honest math, plus a "harmless" wrapper around a torch function the bench checksums with: the bench cannot
# vouch for measurements taken with tools the version replaced, so it refuses to hand them in.
REBIND = HONEST + '''

_real_dot = torch.dot
torch.dot = lambda a, b: _real_dot(a, b)
'''


@pytest.fixture
def op_home(home: Path) -> Path:
    (home / "milestones" / "op-cpu.toml").write_text(MILESTONE)
    git(home, "add", "-A")
    git(home, "commit", "-q", "-m", "op milestone")
    return home


def _patch(home: Path, tmp_path: Path, files: dict[str, str]) -> Path:
    clone = tmp_path / f"clone-{len(list(tmp_path.glob('clone-*')))}"
    git(tmp_path, "clone", "-q", str(home), str(clone))
    for rel, text in files.items():
        path = clone / rel
        path.write_text(path.read_text() + text if rel.endswith("register.toml") else text)
    git(clone, "add", "-A")
    patch = clone.with_suffix(".patch")
    patch.write_text(git(clone, "diff", "--cached"))
    return patch


def _judge(home: Path, patch: Path) -> tuple[int, dict]:
    proc = temper(home, "gate", "op-cpu", "--patch", str(patch), "--json", timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def _gate(verdict: dict, name: str) -> dict:
    return next(g for g in verdict["gates"] if g["name"] == name)


def _version(source: str) -> dict[str, str]:
    return {"engine/ops/rmsnorm/mine.py": source, "engine/ops/rmsnorm/register.toml": REGISTER}


def test_an_honest_version_is_accepted_and_a_cached_one_rejected(op_home: Path, tmp_path: Path) -> None:
    rc, verdict = _judge(op_home, _patch(op_home, tmp_path, _version(HONEST)))
    assert rc == 0 and verdict["accepted"], json.dumps(verdict, indent=1)[-4000:]
    bench = _gate(verdict, "bench")["metrics"]
    # The same math both sides, but CPU timings on a shared 2-core machine swing by 10x under load: only sanity.
    assert bench["max_rel_err"] < 1e-2 and 0 < bench["speedup"] < float("inf"), bench
    assert _gate(verdict, "stress")["metrics"]["iterations"] >= 1

    rc, verdict = _judge(op_home, _patch(op_home, tmp_path, _version(CACHED)))
    assert rc == 1 and not verdict["accepted"]
    failed = _gate(verdict, "bench")
    assert not failed["passed"] and any("cached" in v and "disagree" in v for v in failed["violations"]), failed


@pytest.mark.slow
def test_wrong_math_copied_answers_rebound_tools_and_a_slowed_baseline_are_all_caught(op_home: Path, tmp_path: Path) -> None:
    rc, verdict = _judge(op_home, _patch(op_home, tmp_path, _version(WRONG)))
    assert rc == 1
    failed = _gate(verdict, "bench")
    assert any("from the judge's fp32 result" in v and "out.0" in v for v in failed["violations"]), failed

    rc, verdict = _judge(op_home, _patch(op_home, tmp_path, _version(COPYCAT)))
    assert rc == 1, "a candidate handed in the reference process's files"
    failed = _gate(verdict, "bench")
    assert any("from the judge's fp32 result" in v for v in failed["violations"]), failed

    rc, verdict = _judge(op_home, _patch(op_home, tmp_path, _version(REBIND)))
    assert rc == 1
    failed = _gate(verdict, "bench")
    assert "exited 3" in failed["summary"] and "rebound what the bench measures with (import): torch.dot" in failed["log_tail"], failed

    baseline = (op_home / "engine/ops/rmsnorm/baseline.py").read_text()
    slowed = baseline.replace("    if residual is None:\n        return _norm(x, weight, eps)",
                              "    import time\n    time.sleep(1.0)\n    if residual is None:\n        return _norm(x, weight, eps)")
    assert slowed != baseline
    rc, verdict = _judge(op_home, _patch(op_home, tmp_path, {**_version(HONEST), "engine/ops/rmsnorm/baseline.py": slowed}))
    bench = _gate(verdict, "bench")["metrics"]
    # Had the patched baseline.py been the reference, each reference call would take >= 1000 ms.
    assert bench["reference_ms"] < 1000, f"the patch's slowed baseline.py was timed as the reference: {bench}"


def test_checksum_rows_keep_no_autograd_history() -> None:
    """A row written from outputs that carry autograd history would chain every call's graph to the rows
    (memory grows by the outputs' size per call: the stress job ran a GPU out of memory this way)."""
    from harness.opbench import _Checksums

    case = draw_cases("gemm_fc1", 1, 1, scale=0.05)[0]
    inputs = make_inputs(case, dtype=torch.float32)
    out = call_op(lambda x, w: torch.nn.functional.linear(x, w)[:, : w.shape[0] // 2], case, inputs)[0]
    results = {"out.0": out, "grad.x": inputs["x"] * 1.0, "grad.w": inputs["w"] * 1.0}
    checks = _Checksums(case, {k: v.shape for k, v in results.items()}, torch.device("cpu"), 3, rows=2)
    checks.record(0, results)
    assert not checks.rows.requires_grad and checks.rows.grad_fn is None


def test_torch_rebinding_its_own_callables_is_not_taken_for_the_version() -> None:
    """torch._dynamo wraps torch.manual_seed when it first loads; flash-attn-4 and quack import it, so an honest
    attention or LM-head version was refused as a rebinding on the H200 (exit 3). The bench loads those parts of
    torch before its snapshot; a fresh process shows that nothing torch does to itself then counts."""
    code = ("from harness import opbench\n"
            "opbench._load_self_patching_torch()\n"
            "before = opbench._snapshot()\n"
            "import torch._dynamo, torch._inductor.config\n"
            "print(opbench._rebound(before))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout
