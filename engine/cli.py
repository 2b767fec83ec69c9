"""`python -m engine <command>`: pretrain, prepare, export-hf, export-int8, eval-int8, warmup-kernels, batches, env,
config-reference.

Every EngineConfig field becomes a flag (`--micro-batch-size`, booleans as `--tensorboard` /
`--no-tensorboard`) with its default and meaning in `--help`. Only the flags a user actually gives
override the preset and the `--config` file. Bad input exits 2 with one line naming the fix.
"""

import argparse
import sys
from dataclasses import MISSING, fields
from typing import Any, Callable

from engine.config import EngineConfig, build_config, flag_name
from engine.errors import EXIT_DIVERGED, EXIT_USAGE, ConfigError, TrainingDiverged

__all__ = ["main", "build_parser", "config_from_args", "config_reference"]

# EngineConfig fields `plan` takes as flags: every layout is planned with them (engine/plan.py models their memory
# and speed); the layout's own fields (tp, fsdp, mbs, GAS, recompute) are what it ranks
PLAN_FIELDS = ("fp8", "fp8_weight_cache")

_GROUP_TITLES = {
    "run": "run", "model": "model (presets fill these)", "batch": "batch", "optim": "optimizer and schedule",
    "data": "data", "eval": "evaluation", "output": "checkpoints and output", "parallel": "parallelism",
    "kernels": "kernels (empty: register.toml default; TEMPER_OP_<OP> overrides)", "perf": "performance",
}


def _add_config_flags(parser: argparse.ArgumentParser, only: tuple[str, ...] = ()) -> None:
    """A flag per EngineConfig field (`only`: just those fields, for a command that reads no others)."""
    parser.add_argument("--config", default=argparse.SUPPRESS, metavar="RUN.TOML",
                        help="TOML file of EngineConfig fields; flags given here override it")
    groups: dict[str, Any] = {}
    for f in fields(EngineConfig):
        if only and f.name not in only:
            continue
        group_name = f.metadata["group"]
        if group_name not in groups:
            groups[group_name] = parser.add_argument_group(_GROUP_TITLES[group_name])
        _add_field_flag(groups[group_name], f)


def _add_field_flag(group, f) -> None:
    """EngineConfig field `f` as a flag: its name, type, help and default, absent from the namespace when not given."""
    default = f.default if f.default is not MISSING else None
    # argparse %-formats help strings: escape the literal percent signs.
    help_text = f"{f.metadata['help']} (default: {default!r})".replace("%", "%%")
    kind = f.type if isinstance(f.type, type) else {"int": int, "float": float, "bool": bool, "str": str}[f.type]
    if kind is bool:
        group.add_argument(flag_name(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                           default=argparse.SUPPRESS, help=help_text)
    else:
        bare = {"nargs": "?", "const": f.metadata["bare"]} if f.metadata.get("bare") else {}
        group.add_argument(flag_name(f.name), dest=f.name, type=kind, default=argparse.SUPPRESS,
                           metavar=kind.__name__.upper(), help=help_text, **bare)


def _toml(value: Any) -> str:
    """A default as it is written in a run.toml or preset."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def config_reference() -> str:
    """docs/configuration.md, generated from EngineConfig and the presets so it cannot drift from them."""
    from engine.config import PRESETS_FILE, load_preset, preset_names

    out = ["# Configuration reference", "",
           "<!-- Generated: `python -m engine config-reference > docs/configuration.md`. Do not edit by hand; "
           "tests/assist/test_docs.py fails when this file and EngineConfig disagree. -->", "",
           "Every field of `EngineConfig` (`engine/config.py`, the single source of truth) is a flag of "
           "`python -m engine pretrain` and `warmup-kernels` (`prepare` takes the ones it reads: data source, tokenizer, "
           "vocabulary), a key of a `--config run.toml` file (flat or "
           "under `[engine]`), and a key a preset in `engine/model_spec.toml` may set. A run takes the field's default, "
           "then the preset's value (`--preset`), then the `--config` file's, then the flags given. Booleans are "
           "`--name` / `--no-name`. A bad value stops the run before anything is written, with one line naming the "
           "flag, the value and the fix (exit 2). The resolved config is the `[CONFIG]` line of every run's header.", ""]
    for group, title in _GROUP_TITLES.items():
        out += [f"## {title}", "", "| flag | type | default | meaning |", "| --- | --- | --- | --- |"]
        for f in fields(EngineConfig):
            if f.metadata["group"] != group:
                continue
            kind = f.type if isinstance(f.type, str) else f.type.__name__
            flag = f"`{flag_name(f.name)}` / `--no-{flag_name(f.name)[2:]}`" if kind == "bool" else f"`{flag_name(f.name)}`"
            out.append(f"| {flag} | {kind} | `{_toml(f.default)}` | {_cell(f.metadata['help'])} |")
        out.append("")
    names = preset_names()
    presets = {name: load_preset(name) for name in names}
    keys = [f.name for f in fields(EngineConfig) if any(f.name in values for values in presets.values())]
    out += ["## Presets", "", f"What each preset of `{PRESETS_FILE.name}` sets (empty: the field's default).", "",
            "| field | " + " | ".join(f"`{n}`" for n in names) + " |", "| --- |" + " --- |" * len(names)]
    for key in keys:
        out.append(f"| `{key}` | " + " | ".join(f"`{_toml(presets[n][key])}`" if key in presets[n] else "" for n in names) + " |")
    return "\n".join(out) + "\n"


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    names = {f.name for f in fields(EngineConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in names}
    return build_config(overrides, getattr(args, "config", ""))


class _Parser(argparse.ArgumentParser):
    """argparse that exits with EXIT_USAGE (2) and one line, like ConfigError."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m engine", description="Temper pretraining engine for MiniCPM4-style decoders.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    pretrain = sub.add_parser("pretrain", help="train a model (torchrun for several processes)",
                              description="Train a MiniCPM4-style decoder. Precedence: field default < --preset "
                                          "(engine/model_spec.toml) < --config < flags.")
    _add_config_flags(pretrain)

    from engine.data.prepare import PREPARE_FIELDS

    prepare = sub.add_parser("prepare", help="tokenize a dataset into memory-mapped token shards",
                             description="Tokenize a Hub dataset or local files (parquet, arrow, json/jsonl, csv, txt; "
                                         "needs the [data] extra) into the shards `pretrain --data-path` reads. "
                                         "Preparing your own data: docs/data.md.")
    _add_config_flags(prepare, PREPARE_FIELDS)
    prepare.add_argument("--out", required=True, help="output folder for the shards and index.json")
    prepare.add_argument("--num-proc", type=int, default=1, help="tokenizer worker processes")

    export = sub.add_parser("export-hf", help="write HF safetensors + config.json from a checkpoint")
    export.add_argument("--checkpoint", required=True, help="checkpoint folder (a step_* folder or a save dir: newest)")
    export.add_argument("--out", required=True, help="output folder (replaced atomically)")
    export.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="weight dtype to write")

    int8 = sub.add_parser("export-int8", help="write a checkpoint's weights as one zlib-compressed int8 file, read it "
                                              "back and evaluate it against the checkpoint",
                          description="Per-row symmetric int8 for 2-D weights of at least --quantize-min-numel elements, "
                                      "fp32 for the rest (norm gains, small matrices), zlib-compressed into one file "
                                      "(engine/checkpoint/int8_export.py); then the file is loaded back and val_loss / val_bpb of "
                                      "the original and the round-tripped weights are printed, with the file size.")
    int8.add_argument("--checkpoint", required=True, help="checkpoint folder (a step_* folder or a save dir: newest), "
                                                          "any TP layout")
    int8.add_argument("--out", required=True, help="output file (replaced atomically)")
    int8.add_argument("--quantize-min-numel", type=int, default=65_536,
                      help="2-D tensors with at least this many elements become int8; the rest stay fp32 (default: 65536)")
    int8.add_argument("--eval-samples", type=int, default=-1,
                      help="validation samples to evaluate both on (-1: the run's --eval-samples; 0: no evaluation)")
    int8.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                      help="where to evaluate (auto: cuda when available, in bf16; cpu in fp32)")

    check = sub.add_parser("eval-int8", help="verify an int8 export (its SHA-256) and evaluate its weights",
                           description="Read a file of export-int8 back: refuse it if truncated or corrupt, then print "
                                       "val_loss / val_bpb of its dequantised weights on the run's validation data "
                                       "(the same evaluation as export-int8's round trip).")
    check.add_argument("--int8", required=True, metavar="FILE", help="a file written by export-int8")
    check.add_argument("--eval-samples", type=int, default=-1,
                       help="validation samples to evaluate on (-1: the run's --eval-samples; 0: verify only)")
    check.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                       help="where to evaluate (auto: cuda when available, in bf16; cpu in fp32)")

    warm = sub.add_parser("warmup-kernels", help="compile the configured kernels into the on-disk cache")
    _add_config_flags(warm)

    env = sub.add_parser("env", help="print what the engine runs on: python, torch, CUDA, GPUs, NCCL, kernel libraries",
                         description="The facts of a run header's first lines, without a run (`temper doctor` reads "
                                     "them with --json).")
    env.add_argument("--json", action="store_true", help="one JSON object instead of key=value lines")

    sub.add_parser("config-reference", help="print docs/configuration.md: every EngineConfig field and preset, as markdown",
                   description="python -m engine config-reference > docs/configuration.md")

    plan = sub.add_parser("plan", help="rank the TP x DP-mode x mbs x GAS x recompute layouts of a preset on N GPUs by "
                                       "predicted step time, marking those that fit",
                          description="Predicted peak memory per GPU (a written-down model) and step time (measured MFU "
                                      "of the layouts, extrapolated where unmeasured) of every layout the engine "
                                      "accepts; marks those that fit with >= 5%% headroom and names the fastest "
                                      "(engine/plan.py).")
    plan.add_argument("--preset", required=True, help="model preset (engine/model_spec.toml)")
    plan.add_argument("--gpus", type=int, required=True, help="GPUs of the run (world size)")
    plan.add_argument("--gpu-mem-gib", type=float, required=True, help="memory of one GPU in GiB (H100 80, H200 141)")
    plan.add_argument("--seq-length", type=int, default=0, help="tokens per sample (0: the preset's)")
    plan.add_argument("--global-batch", type=int, default=0, help="samples per optimizer step (0: 4 per GPU)")
    plan.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak per GPU (default: H100 / H200)")
    plan.add_argument("--fsdp-knobs", choices=["off", "exact", "all"], default="exact",
                      help="--fsdp variants to rank besides FSDP2's defaults (off: none; measured on 4 x H200, "
                           "docs/benchmarks.md \"FSDP tuning\"): exact adds --fsdp-reshard-after-forward never (the "
                           "same sums), all also --fsdp-reduce-dtype bf16 (gradients rounded to bf16 before the sum)")
    for f in fields(EngineConfig):  # every layout planned with these, as pretrain takes them
        if f.name in PLAN_FIELDS:
            _add_field_flag(plan, f)
    plan.add_argument("--json", action="store_true", help="one JSON object instead of the table")

    batches = sub.add_parser("batches", help="write the token batches given optimizer steps of a run train on",
                             description="Write <out>/batches.json: the whole global batch of each of --steps for a "
                                         "pretrain run with these flags (engine/data/step_batches.py), without training.")
    _add_config_flags(batches)
    batches.add_argument("--steps", required=True, help="optimizer steps (1-based, as [LOSS] step=N): 7,8 or 2-8")
    batches.add_argument("--world-size", type=int, default=1, help="processes the run was launched on (DP = this / --tp)")
    batches.add_argument("--out", required=True, help="output folder for batches.json")
    return parser


def _pretrain(args: argparse.Namespace) -> int:
    from engine.train import pretrain

    return pretrain(config_from_args(args))


def _plan(args: argparse.Namespace) -> int:
    from engine.plan import plan, plan_lines

    given = {name: getattr(args, name) for name in PLAN_FIELDS if hasattr(args, name)}
    layouts = plan(args.preset, args.gpus, args.gpu_mem_gib, seq_length=args.seq_length, global_batch=args.global_batch,
                   peak_tflops=args.peak_tflops, fsdp_knobs=args.fsdp_knobs, **given)
    print("\n".join(plan_lines(layouts, args.gpu_mem_gib, as_json=args.json, **given)))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from engine.data.prepare import prepare_from_config

    prepare_from_config(config_from_args(args), out_dir=args.out, num_proc=args.num_proc)
    return 0


def _export(args: argparse.Namespace) -> int:
    from engine.checkpoint.hf_export import export_hf

    export_hf(args.checkpoint, args.out, dtype=args.dtype)
    return 0


def _export_int8(args: argparse.Namespace) -> int:
    from engine.checkpoint.int8_export import export_int8

    export_int8(args.checkpoint, args.out, min_numel=args.quantize_min_numel, eval_samples=args.eval_samples,
                device=args.device)
    return 0


def _eval_int8(args: argparse.Namespace) -> int:
    from engine.checkpoint.int8_export import eval_int8

    eval_int8(args.int8, eval_samples=args.eval_samples, device=args.device)
    return 0


def _warmup(args: argparse.Namespace) -> int:
    from engine.warmup import warmup_kernels

    return warmup_kernels(config_from_args(args))


def _env(args: argparse.Namespace) -> int:
    import json

    from engine.runinfo import environment

    facts = environment()
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        for key, value in facts.items():
            if isinstance(value, dict):
                value = " ".join(f"{k}={v}" for k, v in value.items())
            elif isinstance(value, list):
                value = ", ".join(value) or "none"
            print(f"{key}: {value}")
    return 0


def _config_reference(args: argparse.Namespace) -> int:
    sys.stdout.write(config_reference())
    return 0


def _batches(args: argparse.Namespace) -> int:
    from engine.data.step_batches import parse_steps, write_batches

    cfg = config_from_args(args)
    steps = parse_steps(args.steps)
    path = write_batches(cfg, steps=steps, world_size=args.world_size, out_dir=args.out)
    print(f"[BATCHES] wrote {path}: the whole global batch of step(s) {', '.join(map(str, steps))} "
          f"({cfg.micro_batch_size} x {cfg.seq_length} tokens per micro-batch, world size {args.world_size})")
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "pretrain": _pretrain, "prepare": _prepare, "export-hf": _export, "export-int8": _export_int8, "eval-int8": _eval_int8,
    "warmup-kernels": _warmup, "batches": _batches, "plan": _plan,
    "env": _env, "config-reference": _config_reference,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "batches":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:  # `batches` states the batches of a newer engine's runs too (engine/data/step_batches.py)
        print(f"batches: ignoring flags this engine does not know: {' '.join(unknown)}", file=sys.stderr)
    try:
        return _COMMANDS[args.command](args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except TrainingDiverged as err:
        print(f"error: training diverged: {err}", file=sys.stderr)
        return EXIT_DIVERGED
