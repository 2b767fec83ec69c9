"""exec-route and recognition beyond the fixtures' markers: the files Python can run that the guards cannot
read, the findings' text (route, place, fix), the allowlist per fact family, and the real engine."""

import importlib.util
import struct

import pytest
from guards.config import GuardsConfigError, load_config
from guards.runner import check_paths
from guards_testkit import FIXTURES, REPO, check_fixture

_TOML = """[ssot]
env_whitelist = "ENV_WHITELIST.md"

[exec-route]
packages = ["engine"]
data_suffixes = [".toml", ".md"]
"""


def _project(tmp_path, files: dict[str, bytes | str], toml: str = _TOML):
    (tmp_path / "guards.toml").write_text(toml)
    (tmp_path / "ENV_WHITELIST.md").write_text("| name | why |\n| --- | --- |\n| `RANK` | launcher |\n")
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return check_paths([tmp_path / "engine"], load_config(tmp_path / "guards.toml"), ["exec-route"], cwd=tmp_path)


def _pyc(flags: int) -> bytes:
    """A .pyc header as the interpreter writes it: magic, flags (0: timestamp-checked, 1 / 3: hash-based)."""
    return importlib.util.MAGIC_NUMBER + struct.pack("<I", flags) + b"\0" * 8 + b"\xe3"


def test_files_python_can_run_but_the_guards_cannot_read_are_refused(tmp_path):
    tag = importlib.util.cache_from_source("x.py").rpartition("/")[2][1:]  # ".cpython-311.pyc"
    refused = {
        "engine/payload.txt": b"import os\n",  # parses as Python; not a listed data type
        "engine/warmup.pth": b"import os\n",
        "engine/fast.cpython-311-x86_64-linux-gnu.so": b"\x7fELF",
        "engine/schedule.pyc": _pyc(0),  # outside __pycache__: imported without a source
        "engine/bundle.zip": b"PK\x03\x04",
        "engine/tool.pyw": b"print(1)\n",
        "engine/noext": b"print(1)\n",
        "engine/.hidden/payload.py": b"print(1)\n",  # the per-module walk skips hidden folders
        f"engine/__pycache__/orphan{tag}": _pyc(0),  # a cache without its source
        f"engine/__pycache__/ok{tag}".replace("ok", "hashed"): _pyc(3),  # hash-based: loaded on the source's hash alone
        "engine/__pycache__/notes.txt": b"x",
    }
    allowed = {"engine/__init__.py": "__all__ = []\n", "engine/ok.py": "X = 1\n", "engine/hashed.py": "X = 2\n",
               "engine/spec.toml": "a = 1\n", "engine/README.md": "# engine\n",
               f"engine/__pycache__/ok{tag}": _pyc(0)}  # the interpreter's own cache of engine/ok.py
    result = _project(tmp_path, {**refused, **allowed})
    flagged = {f.path: f.message for f in result.findings}
    assert set(flagged) == set(refused), "\n".join(f.to_text() for f in result.findings)
    assert all(f.rule == "exec-route" for f in result.findings)
    assert "[exec-route] data_suffixes: .toml, .md" in flagged["engine/payload.txt"]
    assert "hash-based" in flagged[f"engine/__pycache__/hashed{tag}"]
    assert "hidden folder" in flagged["engine/.hidden/payload.py"]


def test_a_code_suffix_is_never_data(tmp_path):
    with pytest.raises(GuardsConfigError, match=r"data_suffixes: \.pth is code"):
        _project(tmp_path, {}, _TOML.replace('".md"]', '".md", ".pth"]'))


def test_unknown_fact_family_is_a_config_error(tmp_path):
    with pytest.raises(GuardsConfigError, match=r"\[recognition\]: unknown key\(s\) pids"):
        _project(tmp_path, {}, _TOML + '\n[recognition]\npackages = ["engine"]\npids = ["engine/a.py"]\n')


def test_findings_name_the_route_the_place_and_the_fix():
    by_line = {(f.line, f.rule): f for f in check_fixture("execroute_bad")}
    source = (FIXTURES / "execroute_bad/engine/routes.py").read_text().splitlines()
    for needle, route in (('getattr(b, "ex" + "ec")', "`builtins.exec` (by getattr)"),
                          ("rp(str(", "`runpy.run_path`"),
                          ("pickle.loads(blob)", "`pickle.loads`: unpickling"),
                          ('torch.load(HERE / "state.pt")', "weights_only=True"),
                          ("[sys.executable, \"-c\", source]", "built at run time"),
                          ('"python3", "-c"', "'python3'"),
                          ("spec.loader.exec_module", "`.exec_module`")):
        line = next(i for i, text in enumerate(source, 1) if needle in text)
        finding = by_line[(line, "exec-route")]
        assert route in finding.message, finding.message
        assert "# guard: allow exec-route -- <why>" in finding.message
        assert finding.to_text().startswith(f"engine/routes.py:{line}:")
        assert "environment" in by_line[(line, "ssot")].message


def test_each_exec_route_is_found_by_the_rule_alone():
    only = {(f.path, f.line) for f in check_fixture("execroute_bad", ["exec-route"])}
    both = {(f.path, f.line) for f in check_fixture("execroute_bad", ["ssot"])}
    assert only == both and len(only) >= 30


def test_allowlist_is_per_family():
    """engine/atomic.py may read pids and writability (its guards.toml rows), not the hostname."""
    findings = [f for f in check_fixture("recognition_bad") if f.path == "engine/atomic.py"]
    assert [f.message.split(":")[0] for f in findings] == ["`socket.gethostname` reads the machine's name (hostname)"]
    assert "guards.toml [recognition] hostname" in findings[0].message


def test_the_engine_reads_only_the_facts_guards_toml_allows():
    """The real engine is clean under both rules, and each allowlisted file really uses its family (an entry
    that is no longer needed would be a silent exception)."""
    config = load_config(REPO / "guards.toml")
    result = check_paths([REPO / "engine"], config, ["exec-route", "recognition"], cwd=REPO)
    assert result.findings == [], "\n".join(f.to_text() for f in result.findings)
    empty = load_config(REPO / "guards.toml")
    object.__setattr__(empty.recognition, "allowed", {})
    flagged = {(f.path, f.message.split("(")[1].split(")")[0])
               for f in check_paths([REPO / "engine"], empty, ["recognition"], cwd=REPO).findings}
    listed = {(path, family) for family, paths in config.recognition.allowed.items() for path in paths}
    assert flagged == listed


def test_the_judge_runs_every_rule_by_default():
    """A guards gate without `rules` runs all of them: a rule the spec's list forgot would never judge anything."""
    from guards.rules import RULES
    from harness.spec import GUARD_RULES

    assert set(GUARD_RULES) == set(RULES)


def test_a_reviewers_suppression_works_and_a_candidates_new_one_is_refused(tmp_path):
    """`# guard: allow exec-route -- <why>` silences the line for a reviewer's real need; the judge refuses the same
    comment when a candidate adds it (new_suppressions reads both versions of the file)."""
    from guards.suppression import new_suppressions

    base = "import subprocess\n\n__all__ = []\n"
    line = 'subprocess.run(["python3", "-V"], check=True)'
    allowed = base + f"{line}  # guard: allow exec-route -- prints the interpreter's version into the run header\n"
    assert _project(tmp_path, {"engine/__init__.py": base + line + "\n"}).findings
    assert _project(tmp_path, {"engine/__init__.py": allowed}).findings == []
    assert new_suppressions({"engine/__init__.py": base}, {"engine/__init__.py": allowed})
    assert new_suppressions({"engine/__init__.py": allowed}, {"engine/__init__.py": allowed}) == []
