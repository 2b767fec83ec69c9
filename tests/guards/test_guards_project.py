"""The project's own engine/, harness/ and guards/ trees have zero findings, and must keep having none."""

from guards.config import load_config
from guards.runner import check_paths
from guards_testkit import REPO

def _project_paths():
    return [REPO / name for name in ("engine", "harness", "guards") if (REPO / name).is_dir()]


def test_project_has_no_findings():
    result = check_paths(_project_paths(), load_config(REPO / "guards.toml"), cwd=REPO)
    assert result.files > 10
    assert result.findings == [], "\n".join(f.to_text() for f in result.findings)


def test_guards_toml_keeps_the_layers_and_forbidden_imports():
    """guards.toml (the owner's file) keeps the lines the packages rely on: the engine and the guards never import the
    harness, the harness never imports the engine (the judge imports nothing an agent can edit), and the guards' and
    the harness's own layers are declared; test_project_has_no_findings runs under them."""
    config = load_config(REPO / "guards.toml")
    assert config.forbidden["engine"] == ("harness",) and config.forbidden["guards"] == ("harness",)
    assert config.forbidden["harness"] == ("engine",)
    assert {"engine", "guards", "harness"} <= set(config.layers)
