"""Milestone specs: every shipped file loads, and each kind of mistake is reported with its field path."""

import subprocess
from pathlib import Path

import pytest

from harness.spec import (
    JUDGE_GLOBS,
    METRICS,
    JobGate,
    MetricsGate,
    SpecError,
    compare,
    find_milestone,
    glob_match,
    load_milestone,
    load_milestones,
    render_argv,
)

REPO = Path(__file__).resolve().parents[2]

VALID = """
id = "{id}"
title = "Example"
goal = "Do the thing."
context = ["engine/config.py", {{ path = "docs/CONVENTIONS.md", include = true, lines = [1, 5] }}]
editable = ["engine/**"]

[[gates]]
kind = "protected"

[[gates]]
kind = "pytest"
selectors = ["tests/engine/test_x.py::test_y"]
min_collected = 2

[[gates]]
kind = "job"
name = "train"
task = "train"
timeout_s = 60
argv = ["pretrain", "--preset", "tiny", "--run-dir", "{{job_dir}}"]

[[gates]]
kind = "metrics"
rules = [{{ metric = "final_loss", op = "<=", value = 5.0 }}]

[budget]
max_turns = 3
max_tokens = 1000
max_wall_s = 60
max_attempts = 1
"""


def write(tmp_path: Path, text: str, name: str = "ex") -> Path:
    (tmp_path / "milestones").mkdir(exist_ok=True)
    path = tmp_path / "milestones" / f"{name}.toml"
    path.write_text(text)
    return path


def load_text(tmp_path: Path, text: str, name: str = "ex"):
    return load_milestone(write(tmp_path, text, name), root=tmp_path)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as info:
        load_text(tmp_path, text)
    return str(info.value)


# ---------------------------------------------------------------- shipped milestones


def test_every_shipped_milestone_loads():
    files = sorted((REPO / "milestones").glob("*.toml"))
    milestones = load_milestones(REPO / "milestones", root=REPO)
    assert [m.id for m in milestones] == [f.stem for f in files]
    assert {"demo-tiny", "alignment", "bitwise-single", "resume", "bitwise-dptp", "long-horizon", "perf",
            "production"} <= {m.id for m in milestones}
    for m in milestones:
        assert len(m.spec_hash) == 64 and m.source is not None
        assert m.is_protected("harness/records.py") and m.is_protected("milestones/" + m.id + ".toml")
        assert not any(m.is_editable(p) for p in ("tests/engine/test_config.py", "guards.toml", "pyproject.toml"))
        if m.id.startswith("op-"):  # stage 2: only the op's own folder
            op = m.id.removeprefix("op-")
            assert m.is_editable(f"engine/ops/{op}/new_version.py") and not m.is_editable("engine/train.py")
        else:
            assert m.is_editable("engine/train.py")


def test_every_metric_and_gate_kind_is_exercised_by_some_shipped_milestone():
    milestones = load_milestones(REPO / "milestones", root=REPO)
    kinds = {g.kind for m in milestones for g in m.gates}
    assert kinds == {"protected", "guards", "pytest", "job", "metrics"}
    used = {r.metric for m in milestones for g in m.gates if isinstance(g, MetricsGate) for r in g.rules}
    assert {"mfu", "final_loss", "loss_rel_diff", "loss_mean_rel_diff", "loss_max_abs_diff", "grad_norm_rel_diff",
            "val_loss", "steps", "state_bitwise_diff", "state_rel_diff"} <= used
    assert used <= set(METRICS)
    launchers = {g.launcher for m in milestones for g in m.job_gates()}
    assert "local" in launchers  # no shipped milestone needs SLURM yet (production runs on one 8-GPU node)
    tasks = {g.task for m in milestones for g in m.job_gates()}
    assert {"train", "prepare"} <= tasks


def test_demo_acceptance_test_is_hidden_material_and_protected_once_judged():
    demo = load_milestone(REPO / "milestones" / "demo-tiny.toml", root=REPO)
    hidden = REPO / demo.hidden
    files = sorted(p.relative_to(hidden).as_posix() for p in hidden.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert files == ["tests/milestones/test_demo_tiny.py"]
    # Never in git's view of the agent's tree at that path; once copied in for judging it is a test, hence protected.
    assert not (REPO / files[0]).exists()
    assert demo.is_protected(files[0]) and not demo.is_editable(files[0])
    assert not demo.allows_new_test("tests/conftest.py") and demo.allows_new_test("tests/engine/test_mine.py")


def test_spec_hash_covers_the_hidden_material(tmp_path):
    folder = tmp_path / "milestones" / "ex" / "hidden" / "tests"
    folder.mkdir(parents=True)
    (folder / "test_x.py").write_text("first\n")
    text = VALID.format(id="ex").replace('editable =', 'hidden = "milestones/ex/hidden"\neditable =')
    first = load_text(tmp_path, text).spec_hash
    (folder / "test_x.py").write_text("second\n")
    assert load_text(tmp_path, text).spec_hash != first
    assert "hidden 'engine/x' must be a folder under milestones/" in error_of(
        tmp_path, VALID.format(id="ex").replace('editable =', 'hidden = "engine/x"\neditable ='))


def test_spec_hash_covers_the_setup_patch(tmp_path):
    (tmp_path / "milestones" / "setup").mkdir(parents=True)
    patch = tmp_path / "milestones" / "setup" / "ex.patch"
    patch.write_text("first\n")
    text = VALID.format(id="ex").replace('editable =', 'setup = "milestones/setup/ex.patch"\neditable =')
    first = load_text(tmp_path, text).spec_hash
    assert load_text(tmp_path, text).spec_hash == first
    patch.write_text("second\n")
    assert load_text(tmp_path, text).spec_hash != first


def test_find_milestone_by_id_and_unknown_id(tmp_path):
    assert find_milestone("demo-tiny", home=REPO) == REPO / "milestones" / "demo-tiny.toml"
    with pytest.raises(SpecError, match="no milestone 'nope'; known: .*demo-tiny"):
        find_milestone("nope", home=REPO)


# ---------------------------------------------------------------- defaults filled by the loader


def test_loader_names_gates_and_binds_rules_to_the_only_job(tmp_path):
    m = load_text(tmp_path, VALID.format(id="ex"))
    assert [g.name for g in m.gates] == ["protected", "pytest", "train", "metrics"]
    rule = m.gate("metrics").rules[0]
    assert rule.job == "train"
    assert rule.describe() == "final_loss of train <= 5"
    assert m.context[0].path == "engine/config.py" and not m.context[0].include
    assert m.context[1].include and m.context[1].lines == (1, 5)
    assert m.budget.max_cost_usd is None


# ---------------------------------------------------------------- errors name the field path


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace('op = "<="', 'op = "=>"'), "ex.toml: gates[3].rules[0].op: unknown op '=>'"),
        (lambda t: t.replace('metric = "final_loss"', 'metric = "loss"'), "gates[3].rules[0].metric: unknown metric 'loss'"),
        (lambda t: t.replace('kind = "pytest"', 'kind = "pytests"'), "gates[1].kind: must be one of: protected, guards, pytest, job, metrics (got 'pytests')"),
        (lambda t: t.replace("min_collected = 2", "min_colected = 2"), "gates[1].min_colected: unknown field"),
        (lambda t: t.replace("max_turns = 3\n", ""), "budget.max_turns: Field required"),
        (lambda t: t.replace("max_turns = 3", "max_turns = 0"), "budget.max_turns: Input should be greater than 0 (got 0)"),
        (lambda t: t.replace('task = "train"', 'task = "training"'), "gates[2].task: Input should be 'train', 'prepare', 'stress' or 'bench' (got 'training')"),
        (lambda t: t.replace('"{job_dir}"]', '"{job_dir}", "--x", "{jobdir}"]'), "gates[2].argv[6]: unknown placeholder {jobdir}"),
        (lambda t: t.replace('"--run-dir", "{job_dir}"', '"--seed", "1"'), "gates[2].argv: train jobs must pass \"--run-dir\""),
        (lambda t: t.replace('argv = ["pretrain"', 'argv = ["bench"'), "gates[2].argv[0]: a train job runs `engine pretrain`"),
        (lambda t: t.replace('editable = ["engine/**"]', 'editable = ["engine/**", "harness/gates.py"]'), "editable[1]: 'harness/gates.py' lies in the judge"),
        (lambda t: t.replace('editable = ["engine/**"]', 'editable = ["../outside/**"]'), "editable[0]: glob '../outside/**' must not leave the repository"),
        (lambda t: t.replace('"engine/config.py", {', '"/etc/passwd", {'), "context[0].path: path '/etc/passwd' must be relative"),
        (lambda t: t.replace("lines = [1, 5]", "lines = [5, 1]"), "context[1].lines: lines [5, 1] must be [first, last]"),
        (lambda t: t.replace('id = "ex"', 'id = "other"'), "id: 'other' must equal the file name 'ex'"),
        (lambda t: t.replace('[[gates]]\nkind = "protected"\n', ""), "gates[0].kind: the first gate must be kind = \"protected\""),
        (lambda t: t.replace('value = 5.0 }', 'value = 5.0, job = "trian" }'), "gates[3].rules[0].job: no job gate named 'trian' before this gate (earlier jobs: train)"),
        (lambda t: t.replace('metric = "final_loss"', 'metric = "loss_rel_diff"'), "gates[3].rules[0].ref: loss_rel_diff compares against a reference: give exactly one of ref"),
        (lambda t: t.replace('value = 5.0 }', 'value = 5.0, ref = "milestones/refs/x.jsonl" }'), "gates[3].rules[0].ref: final_loss takes no reference"),
        (lambda t: t.replace('metric = "final_loss"', 'metric = "loss_rel_diff", ref = "engine/golden.jsonl"'), "gates[3].rules[0].ref: 'engine/golden.jsonl' is not protected, so the agent could edit its own reference"),
        (lambda t: t.replace('metric = "final_loss"', 'metric = "speedup"'), "gates[3].rules[0].metric: speedup comes from bench jobs; job 'train' is a train job"),
        (lambda t: t.replace('value = 5.0 }', 'value = 5.0, from_step = 9, to_step = 3 }'), "gates[3].rules[0].to_step: to_step 3 is before from_step 9"),
        (lambda t: t.replace('value = 5.0 }', 'value = nan }'), "gates[3].rules[0].value: value nan must be a finite number"),
        (lambda t: t.replace('timeout_s = 60', 'timeout_s = 60\ngpus = 8\nnproc = 4'), "gates[2].nproc: one process per GPU: nproc 4 != gpus 8"),
        (lambda t: t.replace('timeout_s = 60', 'timeout_s = 60\npartition = "gpu"'), "gates[2].partition: partition applies to launcher = \"slurm\" only"),
        (lambda t: t.replace('timeout_s = 60', 'timeout_s = 60\nenv = { ANTHROPIC_API_KEY = "x" }'), "gates[2].env: env 'ANTHROPIC_API_KEY': jobs may set only TEMPER_* variables"),
        (lambda t: t.replace('name = "train"', 'name = "protected"'), "gates[2].name: duplicate gate name 'protected' (also gates[0])"),
        (lambda t: t + "\n[[gates]]\nkind = \"metrics\"\nrules = []\n", "gates[4].rules: List should have at least 1 item"),
        (lambda t: t.replace("title = ", "title =="), "ex.toml: not valid TOML"),
        (lambda t: t.replace("min_collected = 2", 'min_collected = 2\nargs = ["-k", "x", "-x"]'),
         "gates[1].args: args[2]: '-x' is not a selection"),
        (lambda t: t.replace("min_collected = 2", 'min_collected = 2\nargs = ["-m"]'), "gates[1].args: args[0]: -m needs an expression"),
    ],
)
def test_errors_name_file_and_field_path(tmp_path, edit, expected):
    text = edit(VALID.format(id="ex"))
    assert text != VALID.format(id="ex"), "the edit did not change the spec"
    message = error_of(tmp_path, text)
    assert expected in message
    assert "\n" not in message  # one line, as the conventions say for user errors


def test_rule_without_job_is_ambiguous_after_two_jobs(tmp_path):
    second_job = '[[gates]]\nkind = "job"\nname = "other"\ntask = "train"\ntimeout_s = 5\nargv = ["pretrain", "--run-dir", "{job_dir}", "--resume", "{job_dir:train}/ckpt"]\n\n[[gates]]\nkind = "metrics"'
    text = VALID.format(id="ex").replace('[[gates]]\nkind = "metrics"', second_job)
    assert "gates[4].rules[0].job: several jobs run before this gate (train, other): name one" in error_of(tmp_path, text)
    fixed = text.replace('value = 5.0 }', 'value = 5.0, job = "other" }')
    m = load_text(tmp_path, fixed)
    other = m.gate("other")
    assert isinstance(other, JobGate)
    assert render_argv(other.argv, job_dir="/r/jobs/other", worktree="/w", job_dirs={"train": "/r/jobs/train"}) == [
        "pretrain", "--run-dir", "/r/jobs/other", "--resume", "/r/jobs/train/ckpt"
    ]


def test_placeholder_may_only_name_an_earlier_job(tmp_path):
    text = VALID.format(id="ex").replace('"{job_dir}"]', '"{job_dir}", "--resume", "{job_dir:later}"]')
    assert "gates[2].argv[6]: unknown placeholder {job_dir:later}" in error_of(tmp_path, text)


def test_several_problems_are_all_reported_on_one_line(tmp_path):
    text = VALID.format(id="ex").replace("max_turns = 3", "max_turns = -1").replace("max_attempts = 1", "max_attempts = 0")
    message = error_of(tmp_path, text)
    assert message.count("budget.max_") == 2 and "(+1 more" in message


def test_missing_file_and_missing_setup(tmp_path):
    with pytest.raises(SpecError, match="nope.toml: file not found"):
        load_milestone(tmp_path / "nope.toml")
    text = VALID.format(id="ex").replace("editable =", 'setup = "milestones/setup/none.patch"\neditable =')
    assert "setup: patch 'milestones/setup/none.patch' not found" in error_of(tmp_path, text)


def test_missing_files_lists_context_and_refs(tmp_path):
    text = VALID.format(id="ex").replace('metric = "final_loss"', 'metric = "loss_rel_diff", ref = "milestones/refs/r.jsonl"')
    m = load_text(tmp_path, text)
    assert m.missing_files(tmp_path) == ["engine/config.py", "docs/CONVENTIONS.md", "milestones/refs/r.jsonl"]
    assert m.missing_files(REPO) == ["milestones/refs/r.jsonl"]


# ---------------------------------------------------------------- protection and globs


def test_tests_are_protected_unless_a_test_glob_is_editable(tmp_path):
    m = load_text(tmp_path, VALID.format(id="ex"))
    assert m.is_protected("tests/engine/test_config.py")
    opened = load_text(tmp_path, VALID.format(id="ex").replace('editable = ["engine/**"]', 'editable = ["engine/**", "tests/engine/test_new_*.py"]'))
    assert not opened.is_protected("tests/engine/test_new_schedule.py")
    assert opened.is_editable("tests/engine/test_new_schedule.py")
    assert opened.is_protected("tests/engine/test_config.py")
    # A test glob never opens a conftest: it changes what every other test collects.
    assert load_text(tmp_path, VALID.format(id="ex").replace('editable = ["engine/**"]', 'editable = ["tests/**"]')).is_protected("tests/conftest.py")


def test_judge_wins_over_a_catch_all_editable_glob(tmp_path):
    m = load_text(tmp_path, VALID.format(id="ex").replace('editable = ["engine/**"]', 'editable = ["**"]'))
    for path in ("harness/spec.py", "guards/rules.py", "guards.toml", "milestones/ex.toml", "prompts/system.j2",
                 "pyproject.toml", "engine/conftest.py", "ENV_WHITELIST.md"):
        assert m.is_protected(path) and not m.is_editable(path), path
    assert m.is_editable("engine/model.py") and m.is_editable("README.md")
    assert set(JUDGE_GLOBS) <= set(m.protected_globs) and "tests/**" in m.protected_globs


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("engine/**", "engine/a.py", True),
        ("engine/**", "engine/ops/attn/k.py", True),
        ("engine/**", "engineX/a.py", False),
        ("engine/*.py", "engine/a.py", True),
        ("engine/*.py", "engine/ops/a.py", False),  # '*' stays inside one segment
        ("**/conftest.py", "conftest.py", True),  # '**/' also matches no folder at all
        ("**/conftest.py", "a/b/conftest.py", True),
        ("**/conftest.py", "a/b/myconftest.py", False),
        ("tests/test_?.py", "tests/test_a.py", True),
        ("tests/test_?.py", "tests/test_ab.py", False),
        ("engine/[ab].py", "engine/b.py", True),
        ("engine/[!ab].py", "engine/b.py", False),
        ("guards.toml", "guards.toml", True),
        ("guards.toml", "xguards.toml", False),
        ("a.b", "axb", False),  # '.' is literal
    ],
)
def test_glob_match(pattern, path, expected):
    assert glob_match(pattern, path) is expected


# ---------------------------------------------------------------- ops


def test_compare_ops_and_nan():
    assert compare("<=", 0.55, 0.55) and not compare("<", 0.55, 0.55)
    assert compare(">=", 0.56, 0.55) and compare(">", 0.56, 0.55) and not compare(">", 0.55, 0.55)
    assert compare("==", 0.0, 0.0) and not compare("==", 1e-12, 0.0)
    for op in ("<", "<=", ">", ">=", "=="):
        assert not compare(op, float("nan"), 5.0)  # a diverged run passes nothing
    with pytest.raises(ValueError, match="unknown op"):
        compare("=>", 1.0, 1.0)
