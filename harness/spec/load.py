"""Loading a milestone file: TOML, pydantic validation, defaults, the checks across fields, and the spec's hash."""

import hashlib
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.spec.gates import JobGate, MetricRule, MetricsGate, ProtectedGate
from harness.spec.milestone import DRAW_NAME, DrawVar, Milestone, Requires
from harness.spec.vocab import (FIXED_PLACEHOLDERS, TASK_COMMAND, GATE_KINDS, JUDGE_GLOBS, JUDGED_PAIR_METRICS, METRICS,
                                OP_TASKS, PRINTED_DIFFS, SHAPE_KEYS, STATE_METRICS, SpecError, literal_prefix,
                                placeholders, glob_match)

__all__ = ["load_milestone", "load_milestones", "find_milestone"]


def _loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for i, item in enumerate(loc):
        # Pydantic inserts the discriminator value after a gate's index: gates.2.metrics.rules -> drop it.
        if (i >= 2 and loc[i - 2] == "gates" and isinstance(loc[i - 1], int) and item in GATE_KINDS):
            continue
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _pydantic_problems(err: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for e in err.errors():
        path = _loc(tuple(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            path = f"{path}.kind"
            msg = f"must be one of: {', '.join(GATE_KINDS)}" + (
                f" (got {e['input'].get('kind')!r})" if isinstance(e.get("input"), dict) and "kind" in e["input"] else ""
            )
        elif e["type"] == "extra_forbidden":
            msg = "unknown field (a typo?)"
        elif e["type"] not in ("missing", "value_error") and not isinstance(e.get("input"), (dict, list, type(None))):
            msg = f"{msg} (got {e['input']!r})"
        problems.append((path, msg))
    return problems


def _fill_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Name unnamed gates and give each metric rule its job, so later stages never guess."""
    seen: dict[str, int] = {}
    jobs_so_far: list[str] = []
    gates = []
    for gate in data["gates"]:
        gate = dict(gate)
        kind = gate["kind"]
        seen[kind] = seen.get(kind, 0) + 1
        if not gate.get("name"):
            gate["name"] = kind if seen[kind] == 1 else f"{kind}-{seen[kind]}"
        if kind == "job":
            jobs_so_far.append(gate["name"])
        if kind == "metrics" and len(jobs_so_far) == 1:
            gate["rules"] = [r if r.get("job") else {**r, "job": jobs_so_far[0]} for r in gate["rules"]]
        gates.append(gate)
    return {**data, "gates": gates}


def _cross_checks(m: Milestone) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if not isinstance(m.gates[0], ProtectedGate):
        problems.append(("gates[0].kind", "the first gate must be kind = \"protected\" (judge integrity runs before anything else)"))
    names: dict[str, int] = {}
    jobs: dict[str, JobGate] = {}
    for i, gate in enumerate(m.gates):
        where = f"gates[{i}]"
        if gate.name in names:
            problems.append((f"{where}.name", f"duplicate gate name {gate.name!r} (also gates[{names[gate.name]}])"))
        names[gate.name] = i
        if isinstance(gate, ProtectedGate) and i > 0:
            problems.append((f"{where}.kind", "only the first gate may be \"protected\""))
        if isinstance(gate, JobGate):
            problems += _job_checks(gate, where, jobs, m.draw)
            problems += _hardware_checks(m.requires, gate, where)
            jobs[gate.name] = gate
        if isinstance(gate, MetricsGate):
            if not jobs:
                problems.append((f"{where}.kind", "a metrics gate needs a job gate before it"))
                continue
            for j, rule in enumerate(gate.rules):
                problems += _rule_checks(m, rule, f"{where}.rules[{j}]", jobs)
    problems += _state_twins(m)
    problems += _draw_checks(m.draw)
    for i, glob in enumerate(m.editable):
        prefix = literal_prefix(glob)
        if prefix and not prefix.startswith("tests/") and any(
            glob_match(j, prefix) or glob_match(j, prefix.rstrip("/") + "/x") for j in JUDGE_GLOBS
        ):
            problems.append((f"editable[{i}]", f"{glob!r} lies in the judge ({', '.join(JUDGE_GLOBS[:5])}, ...), which is never editable"))
    return problems


def _state_twins(m: Milestone) -> list[tuple[str, str]]:
    """A printed-number comparison of two jobs needs a checkpoint comparison of the same two jobs beside it: bit
    for bit (`state_bitwise_diff == 0`) where the printed claim is exact, else `state_rel_diff` (or bitwise)."""
    rules = [(f"gates[{i}].rules[{j}]", r) for i, g in enumerate(m.gates) if isinstance(g, MetricsGate)
             for j, r in enumerate(g.rules)]
    state = {(r.job, r.ref_job, r.metric) for _, r in rules if r.metric in STATE_METRICS}
    problems = []
    for where, r in rules:
        if r.metric not in PRINTED_DIFFS or r.ref_job is None:
            continue
        exact = r.op in ("==", "<=") and r.value == 0
        wanted = ("state_bitwise_diff",) if exact else STATE_METRICS
        if not any((r.job, r.ref_job, metric) in state for metric in wanted):
            twin = (f'{{ job = "{r.job}", metric = "state_bitwise_diff", op = "==", value = 0, ref_job = "{r.ref_job}" }}'
                    if exact else f'{{ job = "{r.job}", metric = "state_rel_diff", op = "<=", value = ..., ref_job = "{r.ref_job}" }}')
            problems.append((f"{where}.metric", f"{r.metric} of job {r.job} against job {r.ref_job} claims "
                                                f"{'bit-for-bit ' if exact else ''}agreement from printed numbers alone: "
                                                f"add {twin} (the judge compares the two jobs' checkpoints)"))
    return problems


def _hardware_checks(requires: Requires, gate: JobGate, where: str) -> list[tuple[str, str]]:
    """A job may use only the hardware the milestone declares, so `temper milestones` and the judge's
    "needs ..." answer tell the truth."""
    problems = []
    if gate.gpus and requires.device == "cpu":
        problems.append((f"{where}.gpus", f"the job uses {gate.gpus} GPU(s) but requires.device is \"cpu\"; "
                                          "set [requires] device = \"cuda\" (or \"any\") and gpus"))
    elif gate.gpus > max(requires.gpus, 0) and requires.device != "cpu":
        problems.append((f"{where}.gpus", f"the job uses {gate.gpus} GPUs per node, requires.gpus is {requires.gpus}"))
    if gate.launcher == "slurm" and not requires.slurm:
        problems.append((f"{where}.launcher", "a SLURM job needs [requires] slurm = true"))
    if gate.kill_at_step is not None and gate.task != "train":
        problems.append((f"{where}.kill_at_step", "only train jobs print the [LOSS] step lines it waits for"))
    return problems


def _draw_checks(draw: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems = []
    for name, entry in draw.items():
        if not re.fullmatch(DRAW_NAME, name) or name in FIXED_PLACEHOLDERS and name != "seed":
            problems.append((f"draw.{name}", f"a drawn name matches {DRAW_NAME} and is none of {', '.join(FIXED_PLACEHOLDERS[:2])}, "
                                             f"{', '.join(FIXED_PLACEHOLDERS[3:])}"))
        elif (entry == "epoch-crossing") != (name == "corpus"):
            problems.append((f"draw.{name}", "corpus = \"epoch-crossing\" is the one corpus entry; seeds are \"small\", "
                                             "\"large\" or \"any\""))
    return problems


def _drawn_names(draw: Mapping[str, Any]) -> set[str]:
    """The placeholders a [draw] table offers: {name}, {name.key} of table choices, {seed} always."""
    names = {"seed"}
    for name, entry in draw.items():
        names.add(name)
        if isinstance(entry, DrawVar):
            names |= {f"{name}.{key}" for key in entry.keys()}
    return names


def _drawn_nproc(gate: JobGate, where: str, draw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A drawn nproc names a drawn value whose every choice is a process count the judge can start here."""
    if isinstance(gate.nproc, int):
        return []
    name, _, key = gate.nproc.strip("{}").partition(".")
    entry = draw.get(name)
    if not isinstance(entry, DrawVar) or (key and key not in entry.keys()) or (not key and entry.keys()):
        return [(f"{where}.nproc", f"{gate.nproc} names no drawn number of the [draw] table")]
    if gate.gpus or gate.launcher != "local":
        return [(f"{where}.nproc", "a drawn process count is for local CPU jobs")]
    if not all(isinstance(v, int) and 1 <= v <= 8 for v in entry.values_of(key)):
        return [(f"{where}.nproc", f"{gate.nproc} must draw whole numbers 1..8, not {entry.values_of(key)}")]
    return []


def _job_checks(gate: JobGate, where: str, earlier: dict[str, JobGate], draw: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems = _drawn_nproc(gate, where, draw)
    if gate.task in OP_TASKS:
        if gate.bench is None:
            problems.append((f"{where}.bench", f"a {gate.task} job needs a bench table: op, shape (and version, reps, ...)"))
        elif missing := [k for k in _op_shape_keys(gate.bench.op) if k not in gate.bench.shape]:
            problems.append((f"{where}.bench.shape", f"a {gate.bench.op} shape needs {', '.join(missing)}"))
        if gate.argv:
            problems.append((f"{where}.argv", f"a {gate.task} job runs the judge's own op bench (harness/opbench.py): "
                                              "leave argv out and describe the work in its bench table"))
        if gate.nproc != 1 or gate.nodes != 1 or gate.launcher != "local" or gate.gpus > 1:
            problems.append((f"{where}.nproc", f"a {gate.task} job is one local process on at most one GPU"))
        return problems
    if gate.bench is not None:
        problems.append((f"{where}.bench", f"only bench and stress jobs take a bench table (this is a {gate.task} job)"))
    expected = TASK_COMMAND[gate.task]
    if not gate.argv or gate.argv[0] != expected:
        got = repr(gate.argv[0]) if gate.argv else "nothing"
        problems.append((f"{where}.argv[0]", f"a {gate.task} job runs `engine {expected}`: argv must start with {expected!r} (got {got})"))
    if gate.gpus and gate.nproc != gate.gpus:
        problems.append((f"{where}.nproc", f"one process per GPU: nproc {gate.nproc} != gpus {gate.gpus}"))
    if gate.partition and gate.launcher != "slurm":
        problems.append((f"{where}.partition", "partition applies to launcher = \"slurm\" only"))
    if gate.task == "train":
        try:
            run_dir = gate.argv[gate.argv.index("--run-dir") + 1]
        except (ValueError, IndexError):
            run_dir = ""
        if run_dir != "{job_dir}":
            problems.append((f"{where}.argv", "train jobs must pass \"--run-dir\", \"{job_dir}\" so the metrics land in the job's folder"))
    drawn = _drawn_names(draw)
    for k, arg in enumerate(gate.argv):
        for name in placeholders(arg):
            if name in FIXED_PLACEHOLDERS or name in drawn:
                continue
            if name.startswith("job_dir:") and name[len("job_dir:"):] in earlier:
                continue
            problems.append((f"{where}.argv[{k}]", f"unknown placeholder {{{name}}}: use {{job_dir}}, {{worktree}}, {{seed}}, {{device}}, {{data}}, {{job_dir:NAME}} of an earlier job ({', '.join(earlier) or 'none'}) or a name of the [draw] table ({', '.join(sorted(drawn))})"))
    return problems


def _op_shape_keys(op: str) -> tuple[str, ...]:
    return SHAPE_KEYS[op]


def _rule_checks(m: Milestone, rule: MetricRule, where: str, jobs: dict[str, JobGate]) -> list[tuple[str, str]]:
    problems = []
    info = METRICS[rule.metric]
    if not rule.job:
        problems.append((f"{where}.job", f"several jobs run before this gate ({', '.join(jobs)}): name one"))
    elif rule.job not in jobs:
        problems.append((f"{where}.job", f"no job gate named {rule.job!r} before this gate (earlier jobs: {', '.join(jobs)})"))
    elif jobs[rule.job].task not in info.tasks:
        problems.append((f"{where}.metric", f"{rule.metric} comes from {'/'.join(info.tasks)} jobs; job {rule.job!r} is a {jobs[rule.job].task} job"))
    if info.needs_ref and (rule.ref is None) == (rule.ref_job is None):
        problems.append((f"{where}.ref", f"{rule.metric} compares against a reference: give exactly one of ref (a file) or ref_job (an earlier job)"))
    if not info.needs_ref and (rule.ref is not None or rule.ref_job is not None):
        problems.append((f"{where}.ref", f"{rule.metric} takes no reference"))
    if rule.ref_job is not None:
        if rule.ref_job not in jobs:
            problems.append((f"{where}.ref_job", f"= {rule.ref_job!r}: no job gate of that name before this gate: name "
                                                 f"one of the earlier jobs ({', '.join(jobs) or 'none'})"))
        elif rule.ref_job == rule.job:
            problems.append((f"{where}.ref_job", f"= {rule.ref_job!r} is the rule's own job, which cannot be its own "
                                                 f"reference: name another earlier job ({', '.join(j for j in jobs if j != rule.job) or 'none'})"))
        elif jobs[rule.ref_job].task not in info.tasks:
            problems.append((f"{where}.ref_job", f"= {rule.ref_job!r} is a {jobs[rule.ref_job].task} job; {rule.metric} "
                                                 f"compares with a {'/'.join(info.tasks)} job: name one"))
    if rule.metric in JUDGED_PAIR_METRICS:
        if rule.ref is not None:
            problems.append((f"{where}.ref", f"= {rule.ref!r}: {rule.metric} compares two jobs' judged losses of one "
                                             "judging, not a file: give ref_job (an earlier train job) instead"))
        if rule.from_step is not None or rule.to_step is not None:
            problems.append((f"{where}.from_step", f"{rule.metric} compares the final weights' judged losses: leave out "
                                                   "from_step and to_step"))
        for name in (rule.job, rule.ref_job):
            if name in jobs and not jobs[name].verify:
                problems.append((f"{where}.job", f"{rule.metric} needs job {name!r}'s judged val loss, which the judge "
                                                 f"measures only when it verifies the job: job {name!r} has verify = "
                                                 "false; remove it"))
    if rule.metric in STATE_METRICS:
        if rule.ref is not None:
            problems.append((f"{where}.ref", f"{rule.metric} compares two jobs' checkpoints: give ref_job, not a file"))
        for name in (rule.job, rule.ref_job):
            if name in jobs and not jobs[name].verify:
                problems.append((f"{where}.job", f"{rule.metric} reads job {name!r}'s checkpoints, which the judge makes "
                                                 f"a job save only when it verifies it: job {name!r} has verify = false"))
    if rule.ref is not None and not m.is_protected(rule.ref):
        problems.append((f"{where}.ref", f"{rule.ref!r} is not protected, so the agent could edit its own reference: keep references under milestones/"))
    if rule.from_step is not None and rule.to_step is not None and rule.from_step > rule.to_step:
        problems.append((f"{where}.to_step", f"to_step {rule.to_step} is before from_step {rule.from_step}"))
    return problems


def load_milestone(path: str | Path, root: str | Path | None = None) -> Milestone:
    """Read and validate one milestone file. `root` is the repository root the spec's paths are
    relative to (default: the folder above milestones/). Raises SpecError naming file and field path."""
    path = Path(path)
    root = Path(root) if root is not None else path.resolve().parent.parent
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(path, [("", "file not found")]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise SpecError(path, [("", f"not valid TOML: {err}")]) from None
    try:
        milestone = Milestone.model_validate(data)
    except ValidationError as err:
        raise SpecError(path, _pydantic_problems(err)) from None
    milestone = Milestone.model_validate(_fill_defaults(milestone.model_dump(mode="python", exclude_unset=False)))
    problems = _cross_checks(milestone)
    if milestone.id != path.stem:
        problems.insert(0, ("id", f"{milestone.id!r} must equal the file name {path.stem!r} (so `temper run {path.stem}` finds it)"))
    digest = hashlib.sha256(raw)
    if milestone.setup is not None:
        setup_file = root / milestone.setup
        if not setup_file.is_file():
            problems.append(("setup", f"patch {milestone.setup!r} not found under {root}"))
        else:
            digest.update(b"\0setup\0" + setup_file.read_bytes())
    if milestone.hidden is not None:
        folder = root / milestone.hidden
        if not folder.is_dir():
            problems.append(("hidden", f"folder {milestone.hidden!r} not found under {root}"))
        else:
            for file in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                digest.update(b"\0hidden\0" + file.relative_to(folder).as_posix().encode() + b"\0" + file.read_bytes())
    if problems:
        raise SpecError(path, problems)
    milestone._source = path
    milestone._spec_hash = digest.hexdigest()
    return milestone


def load_milestones(directory: str | Path, root: str | Path | None = None) -> list[Milestone]:
    """Every `*.toml` in `directory`, sorted by id; the first bad file raises."""
    return [load_milestone(p, root) for p in sorted(Path(directory).glob("*.toml"))]


def find_milestone(name: str, home: str | Path | None = None) -> Path:
    """`demo-tiny` -> <home>/milestones/demo-tiny.toml; an existing path is returned as is."""
    as_path = Path(name)
    if as_path.suffix == ".toml" and as_path.is_file():
        return as_path
    if home is None:
        from harness.settings import temper_home

        home = temper_home()
    candidate = Path(home) / "milestones" / f"{name}.toml"
    if not candidate.is_file():
        known = sorted(p.stem for p in (Path(home) / "milestones").glob("*.toml"))
        raise SpecError(candidate, [("", f"no milestone {name!r}; known: {', '.join(known) or 'none'}")])
    return candidate
