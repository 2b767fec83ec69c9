"""The project's own engine/, harness/ and guards/ trees have zero findings, and must keep having none."""

from guards.config import load_config
from guards.runner import check_paths
from guards_testkit import REPO

# What this package asks to add to guards.toml (the owner's file): forbidden imports, and layers for
# guards itself. The test proves the project is clean under them before anyone adds them.
PROPOSED_ADDITIONS = """
[dag]
# Packages that must never import another, at any depth (function-local imports included).
forbidden = { engine = ["harness"], guards = ["harness"] }

[dag.guards]
layers = [
  ["guards.findings", "guards.config"],
  ["guards.source", "guards.project"],
  ["guards.astutil", "guards.suppression"],
  ["guards.rules"],
  ["guards.runner", "guards.report"],
  ["guards.cli"],
  ["guards.__main__", "guards"],
]
"""


def _project_paths():
    return [REPO / name for name in ("engine", "harness", "guards") if (REPO / name).is_dir()]


def test_project_has_no_findings():
    result = check_paths(_project_paths(), load_config(REPO / "guards.toml"), cwd=REPO)
    assert result.files > 10
    assert result.findings == [], "\n".join(f.to_text() for f in result.findings)


def test_guards_toml_carries_the_proposed_additions():
    """The proposal above was merged into guards.toml (appending it again would declare [dag] twice):
    the project's config must keep both parts, and test_project_has_no_findings runs under it."""
    config = load_config(REPO / "guards.toml")
    assert config.forbidden["engine"] == ("harness",) and config.forbidden["guards"] == ("harness",)
    assert "guards" in config.layers
    for line in PROPOSED_ADDITIONS.splitlines():
        if line.strip() and not line.startswith("#"):
            assert line in (REPO / "guards.toml").read_text(), line
