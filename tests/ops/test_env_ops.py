"""engine.env.op_override: only the ops the registers list have an override variable."""

import pytest

from engine.env import OVERRIDABLE_OPS, op_override
from engine.ops import FP8_OPS, OP_NAMES, OPS_ROOT, load_register


def test_overridable_ops_are_exactly_the_registered_ops():
    on_disk = {p.parent.name for p in OPS_ROOT.glob("*/register.toml")}
    assert OVERRIDABLE_OPS == on_disk == set(OP_NAMES) | set(FP8_OPS)


@pytest.mark.parametrize("op", sorted(OVERRIDABLE_OPS))
def test_each_op_reads_the_variable_its_register_names(op, monkeypatch):
    env = load_register(op).env
    monkeypatch.setenv(env, "baseline")
    assert op_override(op) == "baseline"
    monkeypatch.delenv(env)
    assert op_override(op) == ""


@pytest.mark.parametrize("name", ["secret", "ATTENTION", "attention_x", "", "../attention"])
def test_unknown_op_names_raise_naming_the_known_ones(name, monkeypatch):
    monkeypatch.setenv(f"TEMPER_OP_{name.upper()}", "leak")
    with pytest.raises(ValueError, match=r"not an op the engine registers \(known: attention, fp8_cast, fp8_wgrad, gemm_fc1"):
        op_override(name)
