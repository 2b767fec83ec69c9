"""CPU-sized op milestones for tests: the real stage-2 gates (the judge's op bench) on shapes two cores can run.

One place for them, and for the honest rmsnorm version both suites judge: tests/judge/test_opbench.py (the bench's
own checks, with a stress gate) and tests/adversarial (cheats against the op milestones' gates). `write_milestones`
puts them into a home repository's milestones/ folder (the caller commits).
"""

from pathlib import Path

__all__ = ["OP_CPU", "OP_CPU_ADVERSARIAL", "OP_GPU_ADVERSARIAL", "MILESTONES", "REGISTER", "HONEST", "write_milestones"]

def _milestone(ident: str, title: str, requires: str, gates: str) -> str:
    """An rmsnorm op milestone: only engine/ops/rmsnorm/ editable, `gates` after the diff policy, a speedup rule
    that exercises the metric (CPU timings swing 10x on a loaded 2-core machine: no speed goal here)."""
    return f"""
id = "{ident}"
title = "{title}"
goal = "x"
editable = ["engine/ops/rmsnorm/**"]

[requires]
{requires}

[[gates]]
kind = "protected"
{gates}
[[gates]]
kind = "metrics"
rules = [{{ job = "bench", metric = "speedup", op = ">=", value = 0.01 }}]

[budget]
max_turns = 1
max_tokens = 1
max_wall_s = 60
max_attempts = 1
"""


def _bench(task: str, table: str, *, timeout_s: int, gpus: int = 0) -> str:
    return f"""
[[gates]]
kind = "job"
name = "{task}"
task = "{task}"
{f"gpus = {gpus}" if gpus else ""}
timeout_s = {timeout_s}
bench = {{ op = "rmsnorm", version = "mine", {table} }}
"""


# tests/judge/test_opbench.py: the bench and the stress job on their own.
OP_CPU = _milestone("op-cpu", "a new rmsnorm version (CPU-sized)", 'device = "cpu"',
                    _bench("bench", "shape = { tokens = 1024, hidden = 512 }, cases = 3, case_scale = 0.1, reps = 20, rounds = 1",
                           timeout_s=300)
                    + _bench("stress", "shape = { tokens = 256, hidden = 512 }, seconds = 2, rounds = 1", timeout_s=300))

# tests/adversarial: the real op milestones' gates (policy, guards, the judge's bench) without the stress gate
# (test_opbench.py covers it), small enough to judge a cheat in about a minute on 2 cores. reps = 12: the
# protocol-forging cheat counts on it. 2048 tokens: a call of ~3.7 ms, so that one scheduling hiccup of the
# 2-core runner spread over 12 calls stays inside the judge's wall-clock allowance (50 % of the call + 0.3 ms);
# at 512 tokens (0.9 ms calls) an honest version was once rejected as doing work outside its calls.
_GUARDS = """
[[gates]]
kind = "guards"
paths = ["engine"]
"""
OP_CPU_ADVERSARIAL = _milestone(
    "op-cpu-adversarial", "a new rmsnorm version (CPU-sized, the adversarial suite's)", 'device = "cpu"',
    _GUARDS + _bench("bench", "shape = { tokens = 2048, hidden = 512 }, cases = 3, case_scale = 0.05, reps = 12, rounds = 1",
                     timeout_s=600))
OP_GPU_ADVERSARIAL = _milestone(
    "op-gpu-adversarial", "a new rmsnorm version (one GPU, the adversarial suite's)", 'device = "cuda"\ngpus = 1',
    _GUARDS + _bench("bench", "shape = { tokens = 8192, hidden = 4096 }, cases = 3, case_scale = 0.25, reps = 12, rounds = 1",
                     timeout_s=600, gpus=1))

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


MILESTONES = {"op-cpu": OP_CPU, "op-cpu-adversarial": OP_CPU_ADVERSARIAL, "op-gpu-adversarial": OP_GPU_ADVERSARIAL}


def write_milestones(home: Path) -> None:
    for name, text in MILESTONES.items():
        (home / "milestones" / f"{name}.toml").write_text(text)
