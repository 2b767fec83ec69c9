"""The job gate (MODEL = JobGate): an engine job (train, prepare) or the judge's op bench (bench, stress), sandboxed.

Engine jobs print through a pipe the judge owns into the judge's records (`runs/<id>/jobs/<job>/log` with line
arrival times); `{job_dir}` is a neutral folder the job may write, whose contents are claims. A train job is made
to save the checkpoints the judge verifies it from (claims/saveplan.py) and its claims are then re-derived by
the judge (harness/judge/claims/). An op job runs the judge's op bench (harness/opbench.py) in a checkout of the
base and in the judged one, alternately, judged by harness/judge/opjudge.py from their files and the judge's clock.
"""

import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.jobs import JobResult, JobSpec, launch
from harness.judge.baseconfig import ConfigUnknown, base_file, expected_config
from harness.judge.claims import Rerun, verify_train
from harness.judge.claims.evidence import embedded_tokens
from harness.judge.claims.keeper import CheckpointKeeper, draw_pairs
from harness.judge.claims.saveplan import SavePlan, plan_saves
from harness.judge.draws import DrawError, corpus_tokens, write_corpus
from harness.judge.hardware import wait_watching_gpus
from harness.judge.judging import JUDGE_ROOT, JobOutcome, Judging, cache_env, job_env, neutral, removed_after, tail
from harness.judge.live import StepProgress
from harness.judge.manifests import python_env
from harness.judge.opcases import result_names, timing_case
from harness.judge.opjudge import OpRun, judge_bench, judge_stress
from harness.records import scrub_file
from harness.settings import data_dir
from harness.spec import OP_TASKS, JobGate, referenced_jobs, render_argv
from harness.verdict import GateResult
from harness.workspace import Workspace

__all__ = ["MODEL", "run", "engine_spec", "run_engine_job"]

MODEL = JobGate


def run(gate: JobGate, judging: Judging) -> GateResult:
    if gate.task in OP_TASKS:
        return _op_job(gate, judging)
    ctx = judging.ctx
    gate = judging.draw.bind(gate)  # a drawn process count
    job_id = f"{judging.label}-{gate.name}"
    record_dir = _fresh_record_dir(judging, job_id)
    job_dir = neutral(judging.holder)  # the job's own folder: writable by it, so only claims live there
    try:
        argv = _render(gate, judging, job_dir)
    except (DrawError, ConfigUnknown, KeyError, ValueError) as err:
        return GateResult(name=gate.name, kind=gate.kind, passed=False,
                          summary=f"the judge cannot draw job {job_id}'s configuration: {err}")
    # Train jobs that end on their own are verified; one the judge interrupts has no final weights.
    verify = gate.task == "train" and gate.verify and gate.kill_at_step is None
    keeper = None
    if verify:
        plan = _save_plan(argv, job_dir, judging)
        argv = plan.argv
        if plan.sample_pairs:  # beside the holder: the same filesystem for hard links, out of the sandbox's sight
            judging.scratch.append(Path(tempfile.mkdtemp(dir=judging.holder.parent)))
            keeper = CheckpointKeeper(plan.save_dir, judging.scratch[-1], draw_pairs(plan.num_steps, plan.sample_pairs))
        judging.saves[gate.name] = (plan, keeper)
    kill = {"kill_pattern": rf"\[LOSS\] step={gate.kill_at_step} ", "kill_signal": gate.kill_signal} \
        if gate.kill_at_step is not None else {}
    spec = engine_spec(gate, judging, name=job_id, argv=argv, job_dir=job_dir, log_path=record_dir / gate.log,
                       timeout_s=gate.timeout_s, **kill,
                       on_line=StepProgress(job_id, steps=_planned_steps(argv, judging) if gate.task == "train" else None,
                                            show=lambda text, done, total: ctx.progress.live("step", text, done, total)))
    ctx.progress("job", f"{job_id} started ({gate.launcher}, {gate.task}): python -m engine {' '.join(argv)}")
    result, gpus_seen = run_engine_job(spec, gate, judging, keeper)
    outcome = JobOutcome(gate=gate, job_id=job_id, job_dir=job_dir, result=result, argv=tuple(argv),
                         kept=tuple(keeper.paths()) if keeper else ())
    judging.jobs[gate.name] = outcome
    log_tail = tail(result.read_log())
    if result.state == "timeout":
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail,
                          summary=f"job {job_id} did not finish within {gate.timeout_s:g} s and was killed")
    if gate.kill_at_step is not None and not result.signal_sent:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail,
                          summary=f"job {job_id} never printed step {gate.kill_at_step}, so the judge could not "
                                  f"interrupt it there ({gate.kill_signal})")
    if result.exit_code != gate.expect_exit or result.state == "cancelled":
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail,
                          summary=f"job {job_id} exited {result.exit_code} (expected {gate.expect_exit})"
                                  + (f": {result.detail}" if result.detail else ""))
    summary = f"job {job_id} exited {result.exit_code} after {result.elapsed_s:.1f} s"
    if gpus_seen is not None:
        if 0 < len(gpus_seen) < gate.gpus:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail,
                              summary=f"job {job_id} ran on {len(gpus_seen)} GPU(s) by the driver's count "
                                      f"(nvidia-smi), the milestone's job needs {gate.gpus}")
        if not gpus_seen:
            judging.flags.append(f"job {job_id}: the judge never saw its processes on a GPU (nvidia-smi)")
    if result.signal_sent:
        summary += f" ({result.signal_sent} sent by the judge at log line {result.signal_line})"
    if not verify:
        return GateResult(name=gate.name, kind=gate.kind, passed=True, summary=summary)
    problems, measured = verify_train(outcome, judging, _rerun(gate, judging, outcome))
    judging.jobs[gate.name] = replace(outcome, evidence=measured)
    if problems:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail, metrics=measured,
                          violations=tuple(problems),
                          summary=f"job {job_id}: {len(problems)} claim(s) its own weights contradict "
                                  "(checked with the judge's reference forward pass and optimizer state)")
    summary += "; claims verified against its weights" + (
        f" (judge val loss {measured['judge_val_loss']:.4f})" if "judge_val_loss" in measured else "") + (
        f"; {measured['exact_steps']:.0f} step(s) exact on their batch ({judging.saves[gate.name][0].scope} "
        f"kept for it)" if "exact_steps" in measured else "")
    return GateResult(name=gate.name, kind=gate.kind, passed=True, metrics=measured, summary=summary)


def engine_spec(gate: JobGate, judging: Judging, *, name: str, argv: list[str], job_dir: Path,
                log_path: Path, timeout_s: float, replay: bool = False, **extra: Any) -> JobSpec:
    """`python -m engine ARGV` for `gate` (torchrun for several processes), sandboxed: `job_dir` writable, and for
    the gate's own run (not the judge's `replay` of it) the earlier jobs' folders its argv names."""
    # A job sees only the earlier jobs' folders its argv names ({job_dir:NAME}, e.g. a checkpoint to resume; writable
    # for the gate's own run, read-only for the judge's replay of it): the others are hidden, so a run cannot replay
    # another run's files as its own.
    named = referenced_jobs(gate.argv)
    earlier = tuple(o.job_dir for n, o in judging.jobs.items() if n in named)
    unnamed = tuple(o.job_dir for n, o in judging.jobs.items() if n not in named and o.job_dir.exists())
    writable, readonly = ((job_dir,), earlier) if replay else ((job_dir, *earlier), ())
    several = gate.nproc > 1 or gate.nodes > 1
    # Caches a job writes go to its own folder: nothing compiled by one candidate reaches another judging.
    return JobSpec(
        name=name, argv=["-m", "engine", *argv] if several else [sys.executable, "-m", "engine", *argv],
        torchrun=several, launcher=gate.launcher, nproc=gate.nproc, nodes=gate.nodes, timeout_s=timeout_s,
        env={**gate.env, **judging.caches(job_dir), **job_env(judging.env_overrides, path=judging.ctx.unsandboxed)},
        cwd=judging.tree, log_path=log_path,
        gpus_per_node=gate.gpus, partition=gate.partition, kill_grace_s=10.0, **extra,
        **judging.sandbox(writable=writable, readonly=readonly, launcher=gate.launcher, hidden=unnamed),
    )


def run_engine_job(spec: JobSpec, gate: JobGate, judging: Judging,
                   keeper: CheckpointKeeper | None = None) -> tuple[Any, set[str] | None]:
    """Launch, record and wait for an engine job: (its JobResult, the GPUs seen running it or None)."""
    ctx = judging.ctx
    ctx.logs[spec.name] = spec.log_path
    job = launch(spec)
    ctx.record.job_started(spec.name, list(spec.argv), attempt=judging.attempt, launcher=gate.launcher,
                           job_id=job.job_id, log=spec.log_path)
    if gate.gpus > 0 and gate.launcher == "local":
        result, gpus_seen = wait_watching_gpus(job)
    elif keeper is not None:
        result, gpus_seen = _wait_keeping(job, keeper), None
    else:
        result, gpus_seen = job.wait(poll_s=0.5), None
    scrub_file(spec.log_path)
    ctx.record.job_finished(spec.name, attempt=judging.attempt, exit_code=result.exit_code,
                            duration_s=round(result.elapsed_s, 3), timed_out=result.state == "timeout", summary=result.detail)
    return result, gpus_seen


def _rerun(gate: JobGate, judging: Judging, outcome: JobOutcome) -> Rerun:
    """How the claims run this job again (the judge's untimed replay of it): the gate's own argv for a new folder,
    started as the gate starts it, read-only on the earlier jobs' folders and stopped at a printed step."""
    def start(argv: list[str], job_dir: Path, stop_at: int) -> JobResult:
        spec = engine_spec(gate, judging, name=f"{outcome.job_id}-replay", argv=argv, job_dir=job_dir,
                           log_path=judging.ctx.record.job_dir(outcome.job_id) / "replay.log", timeout_s=2 * gate.timeout_s,
                           replay=True, kill_pattern=rf"\[LOSS\] step={stop_at} ", kill_signal="SIGKILL")
        return run_engine_job(spec, gate, judging)[0]

    return Rerun(render=lambda job_dir: _render(gate, judging, job_dir), start=start)


def _fresh_record_dir(judging: Judging, job_id: str) -> Path:
    record_dir = judging.ctx.record.dir / "jobs" / job_id
    if record_dir.is_dir():  # left by a judging a crash cut short: its files must not mix with this run's
        shutil.rmtree(record_dir)
    return judging.ctx.record.job_dir(job_id)


def _render(gate: JobGate, judging: Judging, job_dir: Path) -> list[str]:
    """The job's argv with its placeholders filled: the fixed ones, the judging's draw, and {corpus}, the judge-cut
    corpus sized for this job's batch so that its run crosses an epoch boundary (harness/judge/draws.py)."""
    ctx = judging.ctx

    def render(drawn: dict[str, str]) -> list[str]:
        return render_argv(gate.argv, job_dir=job_dir, worktree=judging.tree, seed=judging.seed, device=judging.device,
                           data=data_dir(ctx.home), job_dirs={name: o.job_dir for name, o in judging.jobs.items()},
                           drawn=drawn)

    drawn = judging.draw.placeholders()
    if not any("{corpus}" in arg for arg in gate.argv):
        return render(drawn)
    defaults, presets = ctx.base_config()
    expected = expected_config(render({**drawn, "corpus": ""}), defaults=defaults, presets=presets)
    assert isinstance(gate.nproc, int)  # bound to the draw by the caller
    tokens, _ = corpus_tokens(expected, gate.nproc * gate.nodes, judging.draw.values["corpus"])
    if tokens not in judging.corpora:
        split = {name: base_file(ctx.repo, ctx.base, f"engine/data/corpus/{name}.jsonl") for name in ("train", "validation")}
        if None in split.values():
            raise DrawError("the base commit lacks engine/data/corpus/{train,validation}.jsonl to cut a corpus from")
        judging.corpora[tokens] = write_corpus(neutral(judging.holder), embedded_tokens(split["train"]).tokens,
                                               embedded_tokens(split["validation"]).tokens, tokens=tokens,
                                               offset=int(judging.draw.values["corpus"]["offset"]),
                                               description="cut by the judge from the base's bundled corpus")
    return render({**drawn, "corpus": str(judging.corpora[tokens])})


def _planned_steps(argv: list[str], judging: Judging) -> int | None:
    """The steps a train job's argv asks for, by the judge's reading of the base's config (for the progress bar)."""
    defaults, presets = judging.ctx.base_config()
    try:
        return int(expected_config(argv, defaults=defaults, presets=presets)["num_steps"])
    except (ConfigUnknown, KeyError, ValueError):
        return None


def _save_plan(argv: list[str], job_dir: Path, judging: Judging) -> SavePlan:
    """The job's argv made to leave the checkpoints the judge verifies it from (claims/saveplan.py)."""
    defaults, presets = judging.ctx.base_config()
    try:
        expected = expected_config(argv, defaults=defaults, presets=presets)
    except ConfigUnknown:
        expected = {}
    plan = plan_saves(argv, job_dir, expected=expected, base_defaults=defaults, device=judging.device,
                      free_bytes=shutil.disk_usage(job_dir).free)
    if plan.limits:
        judging.flags.append(plan.limits)
    return plan


def _wait_keeping(job: Any, keeper: CheckpointKeeper) -> Any:
    """Wait for a local job while `keeper` links the checkpoints it writes (claims/keeper.py)."""
    try:
        while (result := job.poll()) is None:
            keeper.poll()
            time.sleep(0.1)
    except KeyboardInterrupt:
        job.cancel()
        raise
    keeper.poll()
    return result


# ------------------------------------------------------------------ op jobs (bench, stress)


def _op_job(gate: JobGate, judging: Judging) -> GateResult:
    """A bench or stress gate: the judge's op bench (harness/opbench.py) in a checkout of the base (role
    `reference`, the base's baseline) and in the judged checkout (role `candidate`), alternately, each
    sandboxed, then judged by harness/judge/opjudge.py from their files and the judge's clock."""
    ctx = judging.ctx
    bench = gate.bench
    assert bench is not None  # the spec loader requires it for op tasks
    job_id = f"{judging.label}-{gate.name}"
    record_dir = _fresh_record_dir(judging, job_id)
    job_dir = neutral(judging.holder)
    shape = ",".join(f"{k}={v}" for k, v in bench.shape.items())
    common = ["--op", bench.op, "--device", judging.device, "--dtype", bench.dtype, "--seed", str(judging.seed),
              "--shape", shape, "--cases", str(bench.cases), "--case-scale", str(bench.case_scale),
              "--reps", str(bench.reps), "--segments", str(bench.segments), "--pace-us", f"{bench.pace_ms * 1e3:g}"]
    # Each role's files live in a folder of its own outside the judged checkout's holder and are hidden from
    # the other role: a candidate that could read the reference's outputs could hand them in as its own.
    # One compiled-kernel cache per role for the gate's rounds: a version compiles once per judging.
    places = {role: Path(tempfile.mkdtemp()) for role in ("reference", "candidate")}
    kernels = {role: neutral(place) for role, place in places.items()}
    runs: list[OpRun] = []
    started = time.monotonic()
    with removed_after(list(places.values())), Workspace.scratch(ctx.repo, ctx.base) as base_checkout:
        trees = {"reference": base_checkout.worktree, "candidate": judging.tree}
        for round_no in range(1, bench.rounds + 1):
            for role in ("reference", "candidate"):
                out = neutral(places[role])
                other = places["candidate" if role == "reference" else "reference"]
                seconds = bench.seconds if role == "candidate" else 0.0  # the reference gives the quiet call only
                version = "baseline" if role == "reference" else bench.version
                name = f"{role}-{round_no}"
                argv = [sys.executable, "-m", "harness.opbench", gate.task, *common, "--version", version,
                        "--seconds", str(seconds), "--out", str(out)]
                result, gpus_seen = _op_process(
                    gate, judging, name=f"{job_id}-{name}", argv=argv, tree=trees[role], log_path=record_dir / f"{name}.log",
                    writable=(out, kernels[role]), hidden=(other,), caches=kernels[role])
                judging.jobs[gate.name] = JobOutcome(gate=gate, job_id=job_id, job_dir=job_dir, result=result,
                                                     argv=tuple(argv))
                log_tail = tail(result.read_log())
                if result.state == "timeout" or result.exit_code != 0:
                    ended = f"did not finish within {gate.timeout_s:g} s" if result.state == "timeout" \
                        else f"exited {result.exit_code}"
                    return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail,
                                      summary=f"job {job_id}: the {role} process (round {round_no}, {bench.op} "
                                              f"{version}) {ended}" + (f": {result.detail}" if result.detail else ""))
                if gpus_seen is not None and not gpus_seen:
                    judging.flags.append(f"job {job_id} {name}: the judge never saw its process on a GPU (nvidia-smi)")
                runs.append(OpRun(role=role, round=round_no, out_dir=out, log_path=record_dir / f"{name}.log",
                                  line_times_path=result.line_times_path))
        names = result_names(timing_case(bench.op, bench.shape, judging.seed))
        if gate.task == "bench":
            problems, measured = judge_bench(op=bench.op, seed=judging.seed, cases=bench.cases, case_scale=bench.case_scale,
                                             dtype=bench.dtype, timing_names=names, runs=runs, segments=bench.segments,
                                             reps=bench.reps)
        else:
            problems, measured = judge_stress(timing_names=names, runs=runs, min_iterations=1 if bench.seconds > 0 else 0)
        judging.jobs[gate.name] = replace(judging.jobs[gate.name], evidence=measured)
        elapsed = time.monotonic() - started
        if problems:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, metrics=measured, violations=tuple(problems),
                              summary=f"job {job_id}: {len(problems)} problem(s) with {bench.op} {bench.version} found by "
                                      "the judge (its fp32 math, the reference process, its clock)")
        said = ", ".join(f"{k} {v:.4g}" for k, v in measured.items())
        return GateResult(name=gate.name, kind=gate.kind, passed=True, metrics=measured,
                          summary=f"job {job_id}: {bench.rounds} round(s) of reference and candidate in {elapsed:.1f} s; {said}")


def _op_process(gate: JobGate, judging: Judging, *, name: str, argv: list[str], tree: Path, log_path: Path,
                writable: tuple[Path, ...], hidden: tuple[Path, ...], caches: Path) -> tuple[Any, set[str] | None]:
    """One sandboxed op-bench process in `tree`, recorded like any job: (its JobResult, GPUs seen or None)."""
    ctx = judging.ctx
    paths = python_env(tree, None) if tree != judging.tree else {"PYTHONPATH": judging.env_overrides["PYTHONPATH"]}
    paths["PYTHONPATH"] += os.pathsep + str(JUDGE_ROOT)  # the checkout's engine first, then the judge's harness
    env = {**gate.env, **(judging.caches(caches) if tree == judging.tree else cache_env(caches)),
           **job_env({**judging.env_overrides, **paths})}
    spec = JobSpec(name=name, argv=argv, timeout_s=gate.timeout_s, env=env, cwd=tree, log_path=log_path,
                   gpus_per_node=gate.gpus, kill_grace_s=10.0,
                   **judging.sandbox(writable=writable, readonly=(tree.parent,), hidden=hidden, cwd=tree))
    ctx.logs[name] = log_path
    job = launch(spec)
    ctx.record.job_started(name, list(spec.argv), attempt=judging.attempt, launcher="local", job_id=job.job_id,
                           log=log_path)
    ctx.progress("job", f"{name} started: {' '.join(argv[2:5])} ...")
    result, gpus_seen = wait_watching_gpus(job) if gate.gpus else (job.wait(poll_s=0.5), None)
    scrub_file(log_path)
    ctx.record.job_finished(name, attempt=judging.attempt, exit_code=result.exit_code,
                            duration_s=round(result.elapsed_s, 3), timed_out=result.state == "timeout",
                            summary=result.detail)
    return result, gpus_seen
