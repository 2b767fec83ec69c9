"""EngineConfig: presets, precedence, validation messages, CLI flags for every field."""

import dataclasses
import subprocess
import sys

import pytest

from engine.cli import build_parser, config_from_args
from engine.config import EngineConfig, build_config, preset_names, resolve
from engine.errors import ConfigError
from tests.engine.helpers import REPO


def test_presets_exist_and_resolve():
    assert {"minicpm4-8b", "minicpm4-0.5b", "tiny", "llama-tiny"} <= set(preset_names())
    for name in preset_names():
        resolve(build_config({"preset": name}), world_size=1)


def test_minicpm4_8b_matches_the_published_config():
    import json
    from tests.conftest import SHARED

    cfg = build_config({"preset": "minicpm4-8b"})
    path = SHARED / "data" / "tokenizers" / "minicpm4" / "config.json"
    if not path.exists():
        pytest.skip("../shared/data is absent")
    hf = json.loads(path.read_text())
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.ffn_hidden_size, cfg.vocab_size) == (
        hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"], hf["num_key_value_heads"],
        hf["intermediate_size"], hf["vocab_size"])
    assert (cfg.scale_emb, cfg.scale_depth, cfg.dim_model_base, cfg.rms_norm_eps, cfg.rope_theta, cfg.init_std) == (
        hf["scale_emb"], hf["scale_depth"], hf["dim_model_base"], hf["rms_norm_eps"], hf["rope_theta"], hf["initializer_range"])
    assert cfg.head_dim * cfg.num_heads == hf["hidden_size"]
    assert cfg.padded_vocab_size == 73472  # multiple of 128 (x TP 1)
    assert dataclasses.replace(cfg, tp=2).padded_vocab_size == 73472  # 36736 per rank, 128-aligned


def test_precedence_defaults_preset_file_flags(tmp_path):
    run = tmp_path / "run.toml"
    run.write_text('seq_length = 64\nlr = 0.5\n[unused]\n'.replace("[unused]\n", ""))
    cfg = build_config({"lr": 0.25}, str(run))
    assert cfg.preset == "tiny"
    assert cfg.hidden_size == 128  # from the preset
    assert cfg.seq_length == 64  # from the file
    assert cfg.lr == 0.25  # the flag wins


def test_every_field_is_a_cli_flag():
    parser = build_parser()
    pretrain = parser._subparsers._group_actions[0].choices["pretrain"]
    dests = {a.dest for a in pretrain._actions}
    assert {f.name for f in dataclasses.fields(EngineConfig)} <= dests
    args = parser.parse_args(["pretrain", "--micro-batch-size", "3", "--no-mup", "--preset", "llama-tiny"])
    cfg = config_from_args(args)
    assert cfg.micro_batch_size == 3 and cfg.mup is False and cfg.preset == "llama-tiny"


def test_help_lists_fields_with_defaults():
    out = subprocess.run([sys.executable, "-m", "engine", "pretrain", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--global-batch-size" in out and "default: 0" in out and "--sequence-parallel" in out


@pytest.mark.parametrize("overrides,world,field,fragment", [
    ({"preset": "nope"}, 1, "preset", "choose one of"),
    ({"micro_batch_size": 2, "grad_accum_steps": 8, "global_batch_size": 64}, 2, "--global-batch-size",
     "global batch 64 != mbs 2 x GAS 8 x DP 2"),
    ({"global_batch_size": 30, "micro_batch_size": 4}, 1, "--global-batch-size", "multiple of mbs"),
    ({"num_kv_heads": 3}, 1, "--num-kv-heads", "divisor of --num-heads"),
    ({"tp": 3}, 6, "--tp", "divides --num-heads"),
    ({"tp": 2}, 3, "--tp", "divisor of the world size 3, or launch with torchrun --nproc-per-node 2"),
    ({"tp": 4}, 1, "--tp", "launch with torchrun --nproc-per-node 4 (or a multiple of 4) -m engine pretrain ..., or pass --tp 1"),
    ({"lr_schedule": "step"}, 1, "--lr-schedule", "cosine, wsd, constant, linear"),
    ({"warmup_steps": 100, "num_steps": 10}, 1, "--warmup-steps",
     "--warmup-steps=100 is longer than the run (--num-steps 10): lower --warmup-steps to at most 10, or raise"),
    ({"preset": "tiny", "num_steps": 5}, 1, "--warmup-steps",
     "lower --warmup-steps to at most 5 (the tiny preset sets it to 10), or raise --num-steps to at least 10"),
    ({"device": "tpu"}, 1, "--device", "auto, cpu, cuda"),
    ({"tp_fwd_chunks": 0}, 1, "--tp-fwd-chunks", "use a positive number"),
    ({"tp": 2, "sequence_parallel": True, "tp_fwd_chunks": 2}, 2, "--tp-fwd-chunks", "use 1 with --sequence-parallel"),
    ({"preset": "tiny", "seq_length": 8, "micro_batch_size": 2, "tp_fwd_chunks": 17}, 1, "--tp-fwd-chunks",
     "at most the micro-batch's 16 tokens"),
    ({"cuda_graphs": True, "tp": 2}, 2, "--cuda-graphs", "(this launch: TP 2 x DP 1): train on one GPU"),
    ({"cuda_graphs": True}, 2, "--cuda-graphs", "(this launch: TP 1 x DP 2): train on one GPU"),
    ({"cuda_graphs": True, "document_mask": True}, 1, "--cuda-graphs", "leave out --document-mask or --cuda-graphs"),
])
def test_bad_input_names_field_and_fix(overrides, world, field, fragment):
    with pytest.raises(ConfigError) as info:
        resolve(build_config(overrides), world_size=world)
    assert info.value.field == field
    assert fragment in str(info.value)


def test_batch_resolution():
    cfg = resolve(build_config({"micro_batch_size": 2, "global_batch_size": 16}), world_size=2)
    assert (cfg.grad_accum_steps, cfg.global_batch_size) == (4, 16)
    cfg = resolve(build_config({"micro_batch_size": 2, "grad_accum_steps": 3}), world_size=2)
    assert cfg.global_batch_size == 12
    cfg = resolve(build_config({"tp": 2, "micro_batch_size": 2, "grad_accum_steps": 8}), world_size=4)
    assert cfg.global_batch_size == 2 * 8 * 2  # DP = 4 / TP 2


def test_unknown_key_in_config_file_suggests_the_field(tmp_path):
    run = tmp_path / "run.toml"
    run.write_text("micro_batch_sise = 4\n")
    with pytest.raises(ConfigError, match="did you mean 'micro_batch_size'"):
        build_config({}, str(run))


def test_wrong_type_in_config_file(tmp_path):
    run = tmp_path / "run.toml"
    run.write_text('num_steps = "ten"\n')
    with pytest.raises(ConfigError, match="wrong type"):
        build_config({}, str(run))


def test_wrong_type_says_what_to_give(tmp_path):
    run = tmp_path / "run.toml"
    run.write_text("num_steps = 2.5\n")
    with pytest.raises(ConfigError, match=r"num_steps=2.5 has the wrong type: give an integer \(the default is 50\)"):
        build_config({}, str(run))


FLOAT_FIELDS = [f.name for f in dataclasses.fields(EngineConfig) if f.type in ("float", float)]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_non_finite_floats_are_refused(name, value):
    """nan passes any check written `x < 0`; every float field must refuse it (and inf) by name."""
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError, match=f"^{flag}={value} is not a finite number: use a finite number"):
        resolve(build_config({"preset": "tiny", name: value}), world_size=1)


@pytest.mark.parametrize("name,value,need", [("rope_theta", 0.0, "a positive number"),
                                             ("scale_emb", -1.0, "a positive number"),
                                             ("scale_depth", 0.0, "a positive number"),
                                             ("rms_norm_eps", -1e-6, "0 or more"),
                                             ("adam_eps", -1e-8, "0 or more")])
def test_model_and_optimizer_constants_in_range(name, value, need):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError, match=f"^{flag}={value} is out of range: use {need}"):
        resolve(build_config({"preset": "tiny", name: value}), world_size=1)


def test_kv_heads_replicated_when_tp_exceeds_them():
    cfg = resolve(build_config({"preset": "minicpm4-8b", "tp": 8}), world_size=8)
    assert cfg.tp == 8 and cfg.padded_vocab_size % (128 * 8) == 0


def test_numpy_is_a_dependency():
    """torch prints a NumPy warning on every run where numpy is missing: `pip install -e .` must bring it."""
    import re
    import tomllib
    with (REPO / "pyproject.toml").open("rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    assert any(re.match(r"numpy\b", d) for d in deps), deps
