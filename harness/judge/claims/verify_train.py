"""A finished train job's claims held against its own checkpoints: the steps of the contract in claims/__init__.py.

`verify_train` reads the job's printed lines from the judge's log, the checkpoints the judge asked it to leave,
and the data from the base commit (or the job's prepared shards); the job gate passes in how to run the job
again (`Rerun`), so the replay never builds an engine command of its own.
"""

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.jobs import JobResult, JobSpec, launch
from harness.judge.baseconfig import ConfigUnknown, base_file, expected_config, flag_values
from harness.judge.claims.batches import FILE, MISSING_COMMAND, BatchesError, batches_argv, read_batches
from harness.judge.claims.checkpoint_reader import list_checkpoints
from harness.judge.claims.contract import check_lr_contract
from harness.judge.claims.digits import digit_problems
from harness.judge.claims.evidence import Evidence, embedded_tokens, shard_tokens, verify_train_run
from harness.judge.claims.exactstep import batch_order, step_pairs, verify_exact_steps
from harness.judge.claims.keeper import CheckpointKeeper
from harness.judge.claims.saveplan import ReplayPlan, SavePlan, plan_replay
from harness.judge.judging import JobOutcome, Judging, cache_env, job_env, neutral, tail
from harness.judge.logparse import LogParseError, parse_engine_log, parse_eval_lines, parse_skip_lines
from harness.judge.manifests import python_env
from harness.spec import JobGate, referenced_jobs
from harness.workspace import Workspace

__all__ = ["Rerun", "verify_train", "judged_numbers", "kept_pairs", "replay_mismatches"]


@dataclass(frozen=True)
class Rerun:
    """How the job gate runs a job again: `render(job_dir)` is the gate's argv for a new folder, `start(argv, job_dir,
    stop_at)` runs it as the gate runs it (sandboxed, recorded) and kills it once it prints step `stop_at`."""

    render: Callable[[Path], list[str]]
    start: Callable[[list[str], Path, int], JobResult]


def verify_train(outcome: JobOutcome, judging: Judging, rerun: Rerun) -> tuple[list[str], dict[str, float]]:
    """Hold a finished train job's printed claims against its own final weights (claims/evidence.py): model size,
    the loss of the weights on held-out data drawn with the judging's seed, the applied lr; then the lr contract,
    the exact steps and, for a job verified on its final step alone, the replay. (problems, what was measured)."""
    ctx = judging.ctx
    defaults, presets = ctx.base_config()
    try:
        expected = expected_config(outcome.argv, defaults=defaults, presets=presets)
    except ConfigUnknown as err:
        return [f"the judge cannot state what the job was asked to run: {err}"], {}
    text = outcome.result.read_log()
    try:
        steps, evals = parse_engine_log(text), parse_eval_lines(text)
    except LogParseError as err:
        return [str(err)], {}
    if rounded := digit_problems(steps, evals):  # numbers rounded below the documented format (digits.py)
        return rounded, {}
    try:
        if expected.get("data_path"):
            validation = shard_tokens(Path(str(expected["data_path"])) / "validation")
            training = shard_tokens(Path(str(expected["data_path"])) / "train")
        elif not expected.get("hf_dataset") and not expected.get("tokenizer_path"):
            split = {name: base_file(ctx.repo, ctx.base, f"engine/data/corpus/{name}.jsonl") for name in ("train", "validation")}
            if None in split.values():
                return ["the base commit lacks engine/data/corpus/{train,validation}.jsonl to draw text from"], {}
            fields = {"text_field": str(expected.get("hf_text_field", "text")),
                      "text_template": str(expected.get("hf_text_template", ""))}
            validation = embedded_tokens(split["validation"], **fields)
            training = embedded_tokens(split["train"], **fields)
        else:
            return ["the judge can verify runs on the bundled corpus or on `engine prepare` shards (--data-path); "
                    "this job tokenizes another source on the fly"], {}
    except (OSError, ValueError, KeyError) as err:
        return [f"the judge cannot read the job's data: {err}"], {}
    plan, keeper = judging.saves[outcome.gate.name]
    ctx.progress("job", f"{outcome.job_id}: holding its claims against its own weights (model, held-out loss, "
                        f"applied lr) ...")
    started = time.monotonic()
    evidence = verify_train_run(plan.save_dir, expected_config=expected, printed_steps=steps, printed_evals=evals,
                                seed=judging.seed, validation=validation, training=training, device=judging.device,
                                # The applied lr is fitted from steps N-1 and N, which the judge asked for.
                                require_lr_check=plan.pairs_expected, check_schedule=not outcome.gate.lr_contract)
    ctx.progress("job", f"{outcome.job_id}: claims read back in {time.monotonic() - started:.1f} s")
    measured = judged_numbers(evidence)
    if plan.scope == "none" or any(v.startswith(("config:", "model shape", "checkpoint:")) for v in evidence.violations):
        return list(evidence.violations), measured  # another model, or no weights to hold a step against
    eos_id = (training or validation).eos_id  # where --document-mask starts a document, by the judge's tokenization
    contract, held = check_lr_contract(outcome.gate.lr_contract, printed_steps=steps, expected=expected,
                                       pairs=kept_pairs(plan, keeper), resumed="resume" in flag_values(outcome.argv))
    problems, exact = _verify_exact(outcome, judging, expected, steps, plan, keeper, text, eos_id)
    if not problems and not evidence.violations and plan.scope == "the final step":
        problems, replayed = _replay(outcome, judging, rerun, expected, steps, eos_id)
        exact.update(replayed)
    return [*problems, *evidence.violations, *contract], {**measured, **exact, **held}


def judged_numbers(evidence: Evidence) -> dict[str, float]:
    """The numbers of a job's evidence that the metrics gate reads: the judged val loss and its windows' digest (what
    `val_loss`, `val_loss_rel_diff` compare) and the fitted lr."""
    return {k: float(v) for k, v in (("judge_val_loss", evidence.judge_val_loss),
                                     ("judge_val_windows", evidence.judge_val_windows),
                                     ("lr_estimate", evidence.lr_estimate)) if v is not None}


def kept_pairs(plan: SavePlan, keeper: CheckpointKeeper | None) -> list[tuple[Path, Path]]:
    """(checkpoint N - 1, checkpoint N) pairs of a job: those the judge linked as they appeared and those left."""
    found = {p.name: p for p in (keeper.paths() if keeper else [])} | {p.name: p for p in list_checkpoints(plan.save_dir)}
    return step_pairs(sorted(found.values(), key=lambda p: p.name))


def _replay(outcome: JobOutcome, judging: Judging, rerun: Rerun, expected: dict[str, Any], steps: list[Any],
            eos_id: int) -> tuple[list[str], dict[str, float]]:
    """A job verified on its final step alone, replayed untimed up to a secret step (saveplan.plan_replay): its
    printed steps must equal the timed run's bit for bit, and the replay's steps from the secret one on must be
    exact on their batches."""
    gate = outcome.gate
    job_id = f"{outcome.job_id}-replay"
    # The timed run's checkpoints have been read; unless a later job resumes from them, their disk goes to the replay.
    if not any(gate.name in referenced_jobs(g.argv) for g in judging.milestone.gates if isinstance(g, JobGate)):
        shutil.rmtree(judging.saves[gate.name][0].save_dir, ignore_errors=True)
    replay_dir = neutral(judging.holder)
    argv = rerun.render(replay_dir)
    plan = plan_replay(argv, replay_dir, expected=expected, base_defaults=judging.ctx.base_config()[0],
                       free_bytes=shutil.disk_usage(replay_dir).free)
    if isinstance(plan, str):
        judging.flags.append(f"job {outcome.job_id}: {plan}; only its final step is verified exactly")
        return [], {}
    judging.ctx.progress("job", f"{job_id}: the job again, untimed, checkpointed around a secret step ({plan.saves}), "
                                "stopped two steps after it")
    result = rerun.start(plan.argv, replay_dir, plan.stop_at)
    text = result.read_log()
    if not result.signal_sent:
        ended = "did not finish in time" if result.state == "timeout" else f"exited {result.exit_code}"
        return [f"replay {job_id}: the job run again with the same argv and seed {ended} before printing step "
                f"{plan.stop_at}: {tail(text, 3)}"], {}
    try:
        replayed = {r.step: r for r in parse_engine_log(text)}
    except LogParseError as err:
        return [f"replay {job_id}: {err}"], {}
    if problems := replay_mismatches(steps, list(replayed.values()), plan, job_id):
        return problems[:8], {}
    # Only steps from the secret one on count: a replay that kept early checkpoints alone verifies nothing secret.
    late = [s for _, s in step_pairs(list_checkpoints(plan.save_dir)) if int(s.name.removeprefix("step_")) >= plan.step]
    if not late:
        return [f"replay {job_id}: it left no two consecutive checkpoints from step {plan.step - 1} on in "
                f"{plan.save_dir} (asked: {plan.saves} --keep-last 4, stopped at step {plan.stop_at})"], {}
    save = SavePlan(argv=plan.argv, save_dir=plan.save_dir, num_steps=plan.num_steps,
                    scope=f"a replay up to secret step {plan.step}")
    replay = JobOutcome(gate=gate, job_id=job_id, job_dir=replay_dir, result=result, argv=tuple(plan.argv))
    problems, exact = _verify_exact(replay, judging, expected, list(replayed.values()), save, None, text, eos_id)
    return [f"replay {job_id}: {p}" for p in problems], {"replay_step": float(plan.step),
                                                         "replay_exact_steps": exact.get("exact_steps", 0.0)}


def replay_mismatches(timed_steps: list[Any], replayed_steps: list[Any], plan: ReplayPlan, job_id: str) -> list[str]:
    """Steps 1..plan.stop_at whose printed loss, grad norm or lr differ between the timed run and its replay (bit for
    bit: both ran --deterministic), and the secret step missing from either: what rejects a run that works
    differently when it is replayed, or fully only on the steps the replay names (saveplan.py)."""
    timed, replayed = {r.step: r for r in timed_steps}, {r.step: r for r in replayed_steps}
    problems = []
    for step in range(1, plan.stop_at + 1):
        a, b = timed.get(step), replayed.get(step)
        if a is None or b is None:
            continue
        if (a.loss, a.grad_norm, a.lr) != (b.loss, b.grad_norm, b.lr):
            problems.append(f"step {step}: the timed run printed loss={a.loss} grad_norm={a.grad_norm} lr={a.lr}, the "
                            f"judge's replay of the same argv and seed (--deterministic, {plan.saves}) printed "
                            f"loss={b.loss} grad_norm={b.grad_norm} lr={b.lr}")
    if plan.step not in timed or plan.step not in replayed:
        problems.append(f"replay {job_id}: step {plan.step} is missing from the "
                        f"{'timed run' if plan.step not in timed else 'replay'}'s printed lines")
    return problems


def _verify_exact(outcome: JobOutcome, judging: Judging, expected: dict[str, Any], steps: list[Any],
                  plan: SavePlan, keeper: CheckpointKeeper | None, text: str,
                  eos_id: int) -> tuple[list[str], dict[str, float]]:
    """Each step the job left checkpoints N - 1 and N for, against the judge's forward and backward pass on the
    exact batch of step N as the base engine states it (claims/exactstep.py, claims/batches.py)."""
    progress = judging.ctx.progress
    pairs = kept_pairs(plan, keeper)
    if not pairs:
        return [f"exact steps: the job left no two consecutive checkpoints in {plan.save_dir} (the judge asked for "
                f"{plan.scope}), so no step's work can be verified"], {}
    try:  # skipped updates (--skip-spike-factor) shift which batch a step trained on
        order, problems, unknown = batch_order(parse_skip_lines(text), expected=expected)
    except LogParseError as err:
        return [str(err)], {}
    if order is None:
        if unknown:
            judging.flags.append(f"job {outcome.job_id}: {unknown}")
        return problems, {}
    world = outcome.gate.nproc * outcome.gate.nodes
    verified = [int(p.name.removeprefix("step_")) for _, p in pairs]
    wanted = {order.batch_of(s) for s in verified} | {order.skipped_batch(k) for k in order.skips if k.step in verified}
    # Every step where the job keeps them all: the same request for every job of one data setup (the resumed
    # runs of a milestone too), answered once.
    if plan.scope == "every step":
        wanted |= set(range(2, plan.num_steps + 1))
    batches = _base_batches(outcome, judging, sorted(wanted), world, expected)
    if isinstance(batches, str):
        return [batches], {}
    if batches is None:
        judging.flags.append(f"job {outcome.job_id}: exact steps not verified: the base engine has no `batches` command "
                             "to state what each step trains on")
        return [], {}
    started = time.monotonic()
    progress("job", f"{outcome.job_id}: recomputing {len(pairs)} step(s) on their exact batches "
                    f"(checkpoints {pairs[0][1].name}..{pairs[-1][1].name}) ...")

    def checked(step: int, done: int, total: int) -> None:
        elapsed = time.monotonic() - started
        progress.live("job", f"{outcome.job_id}: exact step {step} checked, {done}/{total} in {elapsed:.0f} s"
                             + (f", about {elapsed / done * (total - done):.0f} s left" if done < total else ""),
                      done, total)

    exact = verify_exact_steps(pairs, expected_config=expected, printed_steps=steps, batches=batches,
                               device=judging.device, eos_id=eos_id, order=order, on_checked=checked)
    progress("job", f"{outcome.job_id}: {len(exact.checked)} exact step(s) checked in {time.monotonic() - started:.1f} s")
    measured = {"exact_steps": float(len(exact.checked))}
    if exact.checked:
        measured["exact_grad_rel_max"] = max(c.grad_rel for c in exact.checked)
        if any(c.floor for c in exact.checked):  # bf16 / FP8: the judge's own error, which widened the bounds
            measured["exact_floor_grad_max"] = max(c.floor.get("grad", 0.0) for c in exact.checked)
            # the same, unweighted (claims/exactstep.py weighs each tensor by its own signal-to-noise ratio)
            measured["exact_grad_rel_plain_max"] = max(c.grad_rel_plain for c in exact.checked)
            measured["exact_floor_grad_plain_max"] = max(c.floor.get("grad_plain", 0.0) for c in exact.checked)
    return exact.violations, measured


def _base_batches(outcome: JobOutcome, judging: Judging, steps: list[int], world: int, expected: dict[str, Any]) -> Any:
    """{step: StepBatch} from `engine batches` of the base commit without the milestone's setup patch, run
    sandboxed (claims/batches.py); None when that engine has no such command; a str: why it failed."""
    ctx = judging.ctx
    args = batches_argv(outcome.argv, steps=steps, world_size=world, out=Path("OUT"))
    if tuple(args) in judging.batches:
        return judging.batches[tuple(args)]
    name = f"{outcome.job_id}-batches"
    log = ctx.record.job_dir(outcome.job_id) / "batches.log"
    with Workspace.scratch(ctx.repo, ctx.base) as checkout:
        tree = checkout.worktree
        if ctx.milestone.setup is not None:  # a setup may plant the data-order defect the milestone repairs
            setup = str((ctx.home / ctx.milestone.setup).resolve())
            if subprocess.run(["git", "-C", str(tree), "apply", "-R", "--check", setup], capture_output=True).returncode == 0:
                subprocess.run(["git", "-C", str(tree), "apply", "-R", setup], capture_output=True, check=True)
        out = neutral(judging.holder)
        argv = [sys.executable, "-m", "engine", *batches_argv(outcome.argv, steps=steps, world_size=world, out=out)]
        paths = python_env(tree, None)  # the judge's own checkout of the base
        env = {**cache_env(out), **job_env({**judging.env_overrides, **paths})}
        spec = JobSpec(name=name, argv=argv, timeout_s=600, env=env, cwd=tree, log_path=log, kill_grace_s=5.0,
                       **judging.sandbox(writable=(out,), readonly=(tree.parent,), cwd=tree))
        ctx.progress("job", f"{name}: the base engine states the batches of steps {steps[0]}..{steps[-1]}")
        result = launch(spec).wait(poll_s=0.2)
        text = result.read_log()
        if result.exit_code == 2 and MISSING_COMMAND in text:
            answer: Any = None
        elif result.exit_code != 0:
            answer = (f"exact steps: the base engine could not state the batches of job {outcome.job_id} (exit "
                      f"{result.exit_code}): {tail(text, 3)}")
        else:
            try:
                answer = read_batches(out / FILE, seq_length=int(expected["seq_length"]),
                                      vocab_size=int(expected["vocab_size"]))
            except BatchesError as err:
                answer = f"exact steps: {err}"
    judging.batches[tuple(args)] = answer
    return answer
