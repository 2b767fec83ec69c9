"""guards.toml and ENV_WHITELIST.md: the real files load as documented; broken ones fail with a clear message."""

import pytest
from guards.config import GuardsConfigError, LayerMap, load_config, parse_whitelist
from guards_testkit import REPO

GOOD_WHITELIST = "| name | why |\n| --- | --- |\n| `RANK` | launcher |\n| `TEMPER_OP_*` | overrides |\n"


def _write(tmp_path, toml: str, whitelist: str | None = GOOD_WHITELIST):
    (tmp_path / "guards.toml").write_text(toml)
    if whitelist is not None:
        (tmp_path / "ENV_WHITELIST.md").write_text(whitelist)
    return tmp_path / "guards.toml"


def test_project_whitelist_matches_its_table():
    """Reference: the first column of every table row, read here with a plain split of the Markdown."""
    text = (REPO / "ENV_WHITELIST.md").read_text()
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| `")]
    whitelist = parse_whitelist(REPO / "ENV_WHITELIST.md")
    assert whitelist.names == {r.strip("`") for r in rows if not r.endswith("*`")}
    assert set(whitelist.prefixes) == {r.strip("`")[:-1] for r in rows if r.endswith("*`")}
    assert whitelist.allows("TEMPER_OP_ATTENTION") and whitelist.allows_prefix("TEMPER_OP_")
    assert not whitelist.allows("TEMPER_OPX") and not whitelist.allows_prefix("TEMPER_")


def test_project_config_loads():
    config = load_config(REPO / "guards.toml")
    assert config.env_modules["engine"] == "engine/env.py"
    engine = config.layers["engine"]
    assert engine.layer_of("engine.errors") == 0
    assert engine.layer_of("engine.model.attention") == engine.layer_of("engine.model") == 4
    assert engine.layer_of("engine") == len(engine.layers) - 1
    assert engine.layer_of("engine.brand_new") is None  # "engine" covers only engine/__init__.py


def test_most_specific_layer_entry_wins():
    layers = LayerMap("pkg", (("pkg.ops.base",), ("pkg.ops",), ("pkg",)))
    assert layers.layer_of("pkg.ops.base.x") == 0
    assert layers.layer_of("pkg.ops.basement") == 1  # a prefix matches whole dotted parts only
    assert layers.layer_of("pkg") == 2


@pytest.mark.parametrize("toml,whitelist,needle", [
    ("[ssot\n", GOOD_WHITELIST, "not valid TOML"),
    ("", GOOD_WHITELIST, "env_whitelist"),
    ('[ssot]\nenv_whitelist = "ENV_WHITELIST.md"\n', None, "not found"),
    ('[ssot]\nenv_whitelist = "ENV_WHITELIST.md"\n', "| name |\n| --- |\n| RANK |\n", "not a variable name in backticks"),
    ('[ssot]\nenv_whitelist = "ENV_WHITELIST.md"\n', "no table at all\n", "no table rows"),
    ('[ssot]\nenv_whitelist = "ENV_WHITELIST.md"\n[ssott]\n', GOOD_WHITELIST, "unknown key(s) ssott"),
    ('[ssot]\nenv_whitelist = "ENV_WHITELIST.md"\n[dag.engine]\nlayers = [["harness.x"]]\n', GOOD_WHITELIST,
     "not inside package"),
    ('[ssot]\nenv_whitelist = "ENV_WHITELIST.md"\n[dag.engine]\nlayers = [["engine.a"], ["engine.a"]]\n', GOOD_WHITELIST,
     "more than one place"),
    ('[ssot]\nenv_whitelist = "ENV_WHITELIST.md"\n[dag]\nforbidden = { engine = "harness" }\n', GOOD_WHITELIST,
     "must be a list of strings"),
])
def test_malformed_config_raises_a_clear_error(tmp_path, toml, whitelist, needle):
    with pytest.raises(GuardsConfigError) as info:
        load_config(_write(tmp_path, toml, whitelist))
    assert needle in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(GuardsConfigError, match="not found"):
        load_config(tmp_path / "guards.toml")
