"""EngineConfig: the single source of truth for every knob of the engine.

One direction only: model_spec.toml presets -> `--config run.toml` -> CLI flags -> EngineConfig.
Every field is a CLI flag (engine/cli.py derives them from the `help` metadata below). Fields a run
derives (gradient accumulation from the global batch, the padded vocabulary) are resolved once by
`resolve()` and logged, so the config printed in a run header is the config that ran.
"""

import dataclasses
import difflib
import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

__all__ = [
    "EngineConfig",
    "PRESETS_FILE",
    "LR_SCHEDULES",
    "OPTIMIZERS",
    "RECOMPUTE",
    "FP8_RECIPES",
    "FSDP_RESHARD",
    "FSDP_GRAD_SYNC",
    "FSDP_REDUCE_DTYPES",
    "MUON_FIELDS",
    "preset_names",
    "load_preset",
    "load_config",
    "build_config",
    "resolve",
    "to_dict",
    "flag_name",
    "parse_mix",
    "save_steps",
]

PRESETS_FILE = Path(__file__).with_name("model_spec.toml")
LR_SCHEDULES = ("cosine", "wsd", "constant", "linear")
OPTIMIZERS = ("adamw", "muon")
RECOMPUTE = ("none", "selective", "full")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
DTYPE_CHOICES = ("auto", "bf16", "fp32")
FP8_RECIPES = ("off", "tensorwise", "rowwise")
FSDP_RESHARD = ("default", "always", "never")
FSDP_GRAD_SYNC = ("micro-batch", "step")
FSDP_REDUCE_DTYPES = ("fp32", "bf16")


def _f(default: Any, help: str, group: str, bare: str = "") -> Any:
    """`bare`: the value a flag given without one means (a former boolean flag kept as an alias)."""
    return field(default=default, metadata={"help": help, "group": group, "bare": bare})


@dataclass(kw_only=True, frozen=True)
class EngineConfig:
    """Every behavioural knob of a run. Frozen: derive a new one with dataclasses.replace."""

    # --- run
    preset: str = _f("tiny", "model preset from engine/model_spec.toml (minicpm4-8b, minicpm4-0.5b, tiny, llama-tiny)", "run")
    seed: int = _f(1234, "seed for initialisation and data order; same seed -> identical [LOSS] lines", "run")
    device: str = _f("auto", "cpu, cuda, or auto (cuda when available)", "run")
    compute_dtype: str = _f("auto", "bf16, fp32, or auto (bf16 on cuda, fp32 on cpu); masters, grads and moments stay fp32", "run")
    num_steps: int = _f(50, "optimizer steps to run (the step count the schedule spans)", "run")
    deterministic: bool = _f(True, "bitwise-reproducible runs: torch.use_deterministic_algorithms, cuBLAS workspace pinned, deterministic attention backward (see docs/determinism.md for its cost)", "run")

    # --- model (presets fill these)
    vocab_size: int = _f(258, "tokenizer vocabulary size; the embedding is padded to --vocab-pad-multiple x TP", "model")
    vocab_pad_multiple: int = _f(128, "pad the vocabulary to a multiple of this times TP (Megatron pads to 128 x TP)", "model")
    hidden_size: int = _f(128, "model width", "model")
    num_layers: int = _f(4, "decoder layers", "model")
    num_heads: int = _f(4, "query heads", "model")
    num_kv_heads: int = _f(2, "key/value heads (GQA); must divide --num-heads", "model")
    head_dim: int = _f(32, "dimension of each attention head", "model")
    ffn_hidden_size: int = _f(384, "SwiGLU inner width (the gate and up projections each have this many rows)", "model")
    rms_norm_eps: float = _f(1e-6, "RMSNorm epsilon", "model")
    rope_theta: float = _f(10000.0, "RoPE base", "model")
    mup: bool = _f(True, "apply MiniCPM's muP scalings (--scale-emb, --scale-depth, --dim-model-base); off = llama-style, all 1", "model")
    scale_emb: float = _f(12.0, "muP: embedding output multiplier", "model")
    scale_depth: float = _f(1.4, "muP: residual branches are scaled by scale_depth / sqrt(num_layers)", "model")
    dim_model_base: int = _f(256, "muP: logits are divided by hidden_size / dim_model_base; matrices init with std / sqrt of it", "model")
    init_std: float = _f(0.1, "init std of embeddings and matrices (scaled as --mup says; residual outputs also / sqrt(2 L) without muP)", "model")

    # --- batch
    seq_length: int = _f(256, "tokens per sample (documents are packed with EOS to seq_length + 1)", "batch")
    micro_batch_size: int = _f(8, "samples per micro-batch per data-parallel rank", "batch")
    grad_accum_steps: int = _f(0, "micro-batches per step (0: derived from --global-batch-size, else 1)", "batch")
    global_batch_size: int = _f(0, "samples per optimizer step = mbs x GAS x DP (0: derived)", "batch")
    # Packed documents (engine/model/documents.py). Off: Megatron's default; MiniCPM's is undocumented (docs/document-masking.md).
    document_mask: bool = _f(False, "a token attends only to earlier tokens of its own document (documents end at EOS in "
                             "the packed window; varlen attention); off: plain causal attention across the window", "batch")
    reset_position_ids: bool = _f(False, "with --document-mask: RoPE positions restart at 0 at each document (Megatron's "
                                  "--reset-position-ids); off: positions run 0..seq-1 across the window", "batch")

    # --- optimizer and schedule
    optimizer: str = _f("adamw", "adamw (every tensor), or muon: orthogonalised momentum (Newton-Schulz) for the hidden "
                        "matrices (attention Q/K/V/O, MLP gate/up/down), AdamW for the embedding, norm gains and LM head "
                        "(engine/optim/muon.py); same --lr, muP multipliers and --weight-decay", "optim")
    muon_momentum: float = _f(0.95, "muon: momentum of the hidden matrices' gradient average, in [0, 1)", "optim")
    muon_nesterov: bool = _f(True, "muon: orthogonalise the Nesterov look-ahead (1 - m) g + m buf instead of buf", "optim")
    muon_ns_steps: int = _f(5, "muon: Newton-Schulz quintic iterations per matrix and step (1-20; 5 as Keller Jordan's Muon)",
                            "optim")
    muon_update_rms: float = _f(0.2, "muon: RMS of a matrix's update per unit lr: the orthogonalised update is scaled by "
                                "this x sqrt(max(rows, cols)); 0.2 matches AdamW's typical update RMS (Moonlight), so "
                                "AdamW's --lr and --weight-decay carry over", "optim")
    lr: float = _f(3e-4, "peak learning rate", "optim")
    min_lr_ratio: float = _f(0.1, "final learning rate as a fraction of --lr (cosine, wsd, linear)", "optim")
    lr_schedule: str = _f("cosine", "cosine (warmup + cosine), wsd (warmup-stable-decay, MiniCPM), constant, linear", "optim")
    warmup_steps: int = _f(0, "linear warmup steps from 0 to --lr", "optim")
    decay_steps: int = _f(0, "wsd: length of the final decay (0: 10% of --num-steps)", "optim")
    weight_decay: float = _f(0.1, "decoupled weight decay (lr x muP multiplier x wd per step) for matrices and embeddings, never norms; Muon's matrices too", "optim")
    adam_beta1: float = _f(0.9, "AdamW beta1", "optim")
    adam_beta2: float = _f(0.95, "AdamW beta2", "optim")
    adam_eps: float = _f(1e-8, "AdamW epsilon", "optim")
    grad_clip: float = _f(1.0, "clip the global gradient norm to this (0: no clipping)", "optim")
    skip_spike_factor: float = _f(0.0, "skip the update of a step whose loss exceeds this factor x the mean loss of the last --skip-spike-window steps; the step is retried on the next batch (0: off; else > 1)", "optim")
    skip_spike_window: int = _f(20, "accepted steps in the running mean --skip-spike-factor compares with (checking starts once it is full)", "optim")
    skip_spike_max_consecutive: int = _f(5, "stop the run (exit 3) at this many loss spikes in a row", "optim")

    # --- data
    hf_dataset: str = _f("", "HF datasets source: a Hub name or local parquet/arrow/json/jsonl files or folder (empty: the bundled tiny corpus)", "data")
    hf_dataset_config: str = _f("", "HF datasets configuration name", "data")
    hf_split: str = _f("train", "training split of --hf-dataset", "data")
    hf_val_split: str = _f("validation", "validation split of --hf-dataset (or of --hf-val-dataset)", "data")
    hf_val_dataset: str = _f("", "separate validation source (Hub name or files); empty: --hf-val-split of --hf-dataset", "data")
    hf_text_field: str = _f("text", "record field holding the text", "data")
    hf_text_template: str = _f("", "format template over record fields, e.g. '{title}\\n\\n{text}' (overrides --hf-text-field)", "data")
    tokenizer_path: str = _f("", "tokenizer.json, tokenizer.model, or a folder with one (empty: built-in byte tokenizer)", "data")
    data_path: str = _f("", "token shards written by `engine prepare` (skips tokenization)", "data")
    data_cache_dir: str = _f("", "where pretrain caches shards it prepares on the fly (empty: <run_dir>/data)", "data")

    # --- wall-clock budget and data mixing (issue 14; engine/optim/schedule.py, engine/data/mix.py)
    max_wall_s: float = _f(0.0, "stop training once this many seconds of training have passed (summed over resumes: the "
                           "checkpoint carries them; periodic evaluations and start-up not counted), then evaluate and "
                           "checkpoint; --num-steps still caps the run; ranks agree on the time (the slowest rank's) "
                           "every step (0: no budget)", "run")
    warmdown_frac: float = _f(0.0, "wsd: decay the learning rate linearly to the minimum over the last fraction of the "
                              "run, progress being max(step / --num-steps, elapsed / --max-wall-s), so the decay is "
                              "planned against the time budget as it unfolds (0: --decay-steps instead)", "optim")
    data_mix: str = _f("", "train on several prepared datasets (folders written by `engine prepare`) sampled by weight: "
                       "'path:weight,path:weight' (weights are normalised); validation is the first one's; replaces "
                       "--data-path", "data")
    data_mix_anneal: str = _f("", "the weights of the --data-mix sources from --data-mix-anneal-at on: 'path:weight,...' "
                              "(sources of --data-mix only; one left out gets 0)", "data")
    data_mix_anneal_at: float = _f(0.8, "with --data-mix-anneal: the fraction of --num-steps after which the anneal "
                                   "weights apply (steps round(at x num_steps) + 1 on)", "data")

    # --- evaluation
    eval_every: int = _f(0, "evaluate every N steps (0: only the final evaluation)", "eval")
    eval_samples: int = _f(64, "validation sequences (of --seq-length tokens) per evaluation: the first N of the validation split, the same whatever the layout (mbs, GAS, DP, TP); 0: no evaluation at all", "eval")

    # --- checkpoints and output
    run_dir: str = _f("", "folder for metrics.jsonl, the resolved config and checkpoints (empty: outputs/<preset>)", "output")
    save_dir: str = _f("", "checkpoint folder (empty: <run_dir>/checkpoints)", "output")
    save_every: int = _f(0, "checkpoint every N steps (0: only at the end, if --save-final)", "output")
    save_last: int = _f(0, "also checkpoint after each of the last N steps, whatever --save-every says (a judge holds the "
                           "final step against checkpoints N - 1 and N); --keep-last must keep them", "output")
    save_at: str = _f("", "also checkpoint after these steps, comma separated, e.g. 27,28,29 (a judge's replay asks for "
                          "the pairs it verifies; --keep-last must keep them)", "output")
    save_final: bool = _f(True, "checkpoint after the last step", "output")
    keep_last: int = _f(3, "keep this many most recently written checkpoints (by write order, not step number)", "output")
    resume: str = _f("", "'auto' (the newest checkpoint in --save-dir, by write order, that verifies against its checksums; "
                     "none: start afresh) or a checkpoint path (must verify)", "output")
    override_schedule: bool = _f(False, "on resume, accept a learning-rate schedule (--num-steps, --lr, --lr-schedule, "
                                 "--warmup-steps, ...) other than the checkpoint's; recorded in later checkpoints' meta.json", "output")
    async_save: bool = _f(False, "write checkpoints in a background thread from a host-memory copy, overlapping training "
                          "(published as `latest` only when complete; one at a time; exit waits for it)", "output")
    log_every: int = _f(1, "print the [LOSS] line every N steps", "output")
    tensorboard: bool = _f(False, "also write TensorBoard scalars under <run_dir>/tensorboard (needs the tensorboard package: pip install 'temper-train[tensorboard]')", "output")
    peak_tflops: float = _f(0.0, "peak bf16 dense TFLOP/s per device for MFU (0: from the GPU model; 989 for H100/H200)", "output")

    # --- parallelism
    tp: int = _f(1, "tensor-parallel size (consecutive ranks); data-parallel size = world size / tp", "parallel")
    sequence_parallel: bool = _f(False, "shard norms and residuals along the sequence across the TP group", "parallel")
    tp_comm_overlap: bool = _f(True, "overlap TP backward all-reduces with weight-gradient GEMMs (QKV: its own wgrad, as Megatron; FC1: FC2's wgrad)", "parallel")
    tp_fwd_chunks: int = _f(1, "row-parallel forward (O, FC2) at TP > 1 without sequence parallelism: the GEMM in N row "
                            "chunks, each chunk's all-reduce launched at once so it runs beside the next chunk's GEMM "
                            "(1: one GEMM, then its all-reduce)", "parallel")
    ddp_bucket_mb: float = _f(160.0, "data-parallel gradient bucket size in MB (10^6 bytes) of fp32 gradients; 160 = 40M elements", "parallel")
    overlap_grad_reduce: bool = _f(True, "reduce-scatter each gradient bucket as soon as the last micro-batch's backward fills it", "parallel")
    grad_accum_fusion: bool = _f(True, "weight-gradient GEMMs of QKV, O, FC1, FC2 and the LM head and the embedding's "
                                 "backward add into the fp32 gradient buffer directly (Megatron's gradient-accumulation "
                                 "fusion): no bf16 weight gradient and no separate add per micro-batch; FC1 and the LM head "
                                 "through their ops' main_grad, the norm weights stay unfused", "parallel")
    overlap_param_gather: bool = _f(True, "all-gather updated parameters asynchronously, waited on by the next forward's first use", "parallel")
    fsdp: bool = _f(False, "fully sharded data parallel (torch FSDP2, fully_shard per decoder layer over the DP ranks of "
                    "each TP rank's shards) instead of the ZeRO-1 distributed optimizer: fp32 parameters, gradients and "
                    "AdamW moments sharded over DP, bf16 all-gathered per layer and prefetched, gradients "
                    "reduce-scattered in fp32; needs DP >= 2 and --optimizer adamw; the ZeRO-1 knobs (--ddp-bucket-mb, "
                    "--overlap-grad-reduce, --overlap-param-gather) do not apply and --grad-accum-fusion is recorded "
                    "off (engine/sharding/fsdp.py)", "parallel")
    fsdp_reshard_after_forward: str = _f("default", "--fsdp: which decoder layers free their gathered bf16 weights "
                                         "after their forward (and gather them again in backward). default: all but "
                                         "the last (backward needs it at once; torchtitan's default); always: every "
                                         "layer (least memory); never: none, and the weights stay gathered across the "
                                         "step's micro-batches too (ZeRO-2-like: one all-gather per layer per step "
                                         "instead of two per micro-batch; + 2 bytes x this rank's parameters per GPU)",
                                         "parallel")
    fsdp_grad_sync: str = _f("micro-batch", "--fsdp: when gradients are reduce-scattered. micro-batch: after every "
                             "micro-batch's backward, summed into the sharded fp32 gradient (least memory); step: "
                             "accumulated unsharded in fp32 over the step's micro-batches and reduce-scattered once, on "
                             "the last one (GAS - 1 fewer reduce-scatters; + 4 bytes x this rank's parameters per GPU)",
                             "parallel")
    fsdp_reduce_dtype: str = _f("fp32", "--fsdp: dtype gradients are reduce-scattered in. fp32: summed in fp32 (as "
                                "ZeRO-1); bf16: half the bytes on the wire, each DP rank's gradient rounded to bf16 "
                                "before the sum (Megatron's --grad-reduce-in-bf16); not with --fsdp-grad-sync step "
                                "(FSDP2 would accumulate the micro-batches in bf16)", "parallel")
    fsdp_prefetch: int = _f(0, "--fsdp: layers whose all-gather is issued ahead of the one computing, in forward and "
                            "backward. 0: FSDP2's implicit prefetch (the next layer's all-gather is issued when the "
                            "host reaches it); N >= 1: explicit, issued when this layer starts (N more layers' bf16 "
                            "weights held)", "parallel")
    fsdp_fp8_all_gather: bool = _f(False, "--fsdp with --fp8 tensorwise: all-gather each FP8 linear's weight (QKV, O, "
                                   "FC1, FC2) as its FP8 copy, 1 byte an element instead of 2, cast by each DP rank "
                                   "from its shard with one scale for the whole weight (the amaxes all-reduced once a "
                                   "step): the same bits as casting the bf16-gathered weight (torchao's "
                                   "enable_fsdp_float8_all_gather; engine/sharding/fp8_all_gather.py); not with "
                                   "--fp8-weight-cache", "parallel")

    # --- kernels (empty: the op's register.toml default; TEMPER_OP_<OP> overrides)
    op_attention: str = _f("", "attention kernel version (see engine/ops/attention/register.toml)", "kernels")
    op_rmsnorm: str = _f("", "rmsnorm kernel version", "kernels")
    op_gemm_fc1: str = _f("", "fused fc1 + SwiGLU kernel version", "kernels")
    op_gemm_output: str = _f("", "fused LM head + cross-entropy kernel version", "kernels")
    op_rope: str = _f("", "rotary position embedding kernel version", "kernels")
    op_fp8_cast: str = _f("", "FP8 operand cast version (amax, scale, cast; with --fp8 only): baseline (plain torch) or "
                          "compiled (torch.compile: fused kernels); see engine/ops/fp8_cast/register.toml", "kernels")
    op_fp8_wgrad: str = _f("", "FP8 weight-gradient GEMM added into the fp32 gradient (with --fp8 tensorwise only): "
                           "baseline (torch._scaled_mm, then an add), cublaslt (cuBLASLt adding in its epilogue; the "
                           "CUDA default) or quack (quack's GEMM adding in its epilogue); see "
                           "engine/ops/fp8_wgrad/register.toml", "kernels")

    # --- performance
    activation_checkpointing: str = _f("none", "none; full: recompute each decoder layer in backward (saves most "
                                       "activation memory, costs ~1/3 more compute); selective: keep the matmul and "
                                       "attention outputs of each layer, recompute the cheap ops (torchtitan's per-op "
                                       "SAC policy; engine/model/recompute.py). The former boolean flag: a bare "
                                       "--activation-checkpointing still means full", "perf", bare="full")
    cuda_graphs: bool = _f(False, "capture a step's first micro-batch and a later one, forward and backward, as two CUDA "
                           "graphs and replay them for every later step's micro-batches (one launch instead of "
                           "hundreds; same bits as without; one CUDA GPU: TP 1, DP 1, no --document-mask; "
                           "engine/cuda_graph.py)", "perf")
    fp8: str = _f("off", "GEMMs of the decoder's linear layers (QKV, O, FC1, FC2) in FP8 with dynamic scaling "
                  "(torch._scaled_mm; docs/fp8.md): off; tensorwise (one scale per tensor, E4M3 forward, E5M2 output "
                  "gradients, torchao's default recipe); rowwise (a scale per row, E4M3 throughout, power-of-2 scales). "
                  "The LM head, embedding, norms, attention, fp32 master weights and optimizer are unchanged. CUDA: "
                  "compute capability 8.9+ (H100, H200); CPU runs the same numerics as an emulation for tests (no "
                  "speed-up); needs a gemm_fc1 version with an FP8 path (compiled, baseline; on CUDA --fp8 alone runs "
                  "compiled)", "perf")
    fp8_weight_cache: bool = _f(False, "with --fp8 tensorwise: cast each linear layer's weight to FP8 (both layouts) "
                                "once a step, on its first micro-batch, and reuse the copies for the step's other "
                                "micro-batches (TransformerEngine's is_first_microbatch): the same bits, GAS - 1 of "
                                "every GAS weight casts fewer, for 2 bytes a linear parameter held through the step "
                                "(docs/fp8.md)", "perf")
    fp8_fast_accum: bool = _f(False, "with --fp8: the forward GEMMs (y = x W^T) accumulate at the FP8 tensor cores' own "
                              "precision (torch._scaled_mm use_fast_accum), as torchao's float8 recipes do; the "
                              "backward GEMMs (dgrad, wgrad) keep the periodic fp32 promotion. Faster forward GEMMs "
                              "on Hopper, other bits than without (docs/fp8.md)", "perf")

    @property
    def padded_vocab_size(self) -> int:
        multiple = self.vocab_pad_multiple * self.tp
        return math.ceil(self.vocab_size / multiple) * multiple

    @property
    def dp_size_hint(self) -> int:
        """Data-parallel size implied by the resolved batch (global = mbs x GAS x DP)."""
        return self.global_batch_size // (self.micro_batch_size * self.grad_accum_steps)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_length


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


_FIELDS = {f.name: f for f in fields(EngineConfig)}
MUON_FIELDS = tuple(name for name in _FIELDS if name.startswith("muon_"))


def _check_keys(data: dict[str, Any], where: str) -> dict[str, Any]:
    out = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in _FIELDS:
            close = difflib.get_close_matches(name, list(_FIELDS), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see `python -m engine pretrain --help`"
            raise ConfigError(f"{where}: {key}", value, hint, "is not an EngineConfig field")
        out[name] = _coerce(name, value, where)
    return out


def _coerce(name: str, value: Any, where: str) -> Any:
    if name == "activation_checkpointing" and isinstance(value, bool):  # the field was a boolean until issue 31
        raise ConfigError(f"{where}: {name}", value, f"write {'full' if value else 'none'!r} (one of: "
                          f"{', '.join(RECOMPUTE)})", "is the former boolean form")
    kind = _FIELDS[name].type
    kind = kind if isinstance(kind, str) else kind.__name__
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }[kind]
    if not ok:
        words = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}[kind]
        raise ConfigError(f"{where}: {name}", value, f"give {words} (the default is {_FIELDS[name].default!r})",
                          "has the wrong type")
    return float(value) if kind == "float" else value


def preset_names() -> list[str]:
    with PRESETS_FILE.open("rb") as fh:
        return list(tomllib.load(fh))


def load_preset(name: str) -> dict[str, Any]:
    with PRESETS_FILE.open("rb") as fh:
        presets = tomllib.load(fh)
    if name not in presets:
        raise ConfigError("preset", name, f"choose one of: {', '.join(presets)}", "is not a known preset")
    return _check_keys(presets[name], f"preset {name}")


def load_config(path: str) -> dict[str, Any]:
    """Read a run.toml of EngineConfig fields (flat, or under an [engine] table)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError("config", path, "pass an existing TOML file", "does not exist")
    try:
        with file.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError("config", path, f"fix the TOML syntax ({err})", "does not parse") from err
    if "engine" in data and isinstance(data["engine"], dict):
        data = data["engine"]
    return _check_keys(data, path)


def build_config(overrides: dict[str, Any], config_path: str = "") -> EngineConfig:
    """Defaults < preset < --config file < explicit overrides (CLI flags the user actually gave)."""
    from_file = load_config(config_path) if config_path else {}
    preset = overrides.get("preset") or from_file.get("preset") or EngineConfig.preset
    values: dict[str, Any] = {}
    values.update(load_preset(preset))
    values.update(from_file)
    values.update(_check_keys(overrides, "flags"))
    values["preset"] = preset
    return EngineConfig(**values)


def _choice(cfg: EngineConfig, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in choices:
        raise ConfigError(flag_name(name), value, f"use one of: {', '.join(choices)}", "is not a valid choice")


def _positive(cfg: EngineConfig, *names: str, allow_zero: bool = False) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not (value > 0 or (value == 0 and allow_zero)):
            need = "0 or more" if allow_zero else "a positive number"
            raise ConfigError(flag_name(name), value, f"use {need}", "is out of range")


def _finite(cfg: EngineConfig) -> None:
    """nan and inf parse as floats (argparse's float(), TOML) and pass every range check written as `x < 0`:
    refuse them for every float field, before anything else reads one."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(flag_name(f.name), value, f"use a finite number (the default is {f.default})",
                              "is not a finite number")


def _check_budget_and_mix(cfg: EngineConfig) -> None:
    """--max-wall-s, --warmdown-frac and --data-mix* (issue 14). The mix specs are checked here for their syntax;
    build_data reads the folders (engine/data/mix.py)."""
    if cfg.max_wall_s < 0.0:  # nan and inf: _finite
        raise ConfigError("--max-wall-s", cfg.max_wall_s, "use seconds of training, e.g. 600 (0: no budget)", "is out of range")
    if not 0.0 <= cfg.warmdown_frac <= 1.0:
        raise ConfigError("--warmdown-frac", cfg.warmdown_frac, "use a fraction in (0, 1], e.g. 0.3 (0: off)", "is out of range")
    if cfg.warmdown_frac and cfg.lr_schedule != "wsd":
        raise ConfigError("--warmdown-frac", cfg.warmdown_frac, "add --lr-schedule wsd (its decay is what it plans), or "
                          "leave it out", f"does not apply to --lr-schedule {cfg.lr_schedule}")
    if cfg.warmdown_frac and cfg.decay_steps:
        raise ConfigError("--decay-steps", cfg.decay_steps, "give --warmdown-frac or --decay-steps, not both",
                          "contradicts --warmdown-frac")
    if cfg.max_wall_s and cfg.lr_schedule != "constant" and not cfg.warmdown_frac:
        raise ConfigError("--max-wall-s", cfg.max_wall_s, "add --lr-schedule wsd --warmdown-frac F (the decay planned "
                          "against the budget), or use --lr-schedule constant", f"with --lr-schedule {cfg.lr_schedule} "
                          "decays by steps alone, so the budget would cut the decay short")
    if cfg.max_wall_s and cfg.save_last:
        raise ConfigError("--save-last", cfg.save_last, "leave it out with --max-wall-s (the last step is not known in "
                          "advance; the final step is checkpointed with --save-final)", "needs a known last step")
    if cfg.data_mix_anneal and not cfg.data_mix:
        raise ConfigError("--data-mix-anneal", cfg.data_mix_anneal, "add --data-mix (the sources it re-weights), or "
                          "leave it out", "has no --data-mix to anneal")
    if not cfg.data_mix:
        return
    for other in ("data_path", "hf_dataset"):
        if getattr(cfg, other):
            raise ConfigError(flag_name(other), getattr(cfg, other), f"give --data-mix or {flag_name(other)}, not both "
                              "(--data-mix takes folders of `engine prepare`; a mix of one is --data-mix PATH:1)",
                              "contradicts --data-mix")
    sources = [path for path, _ in parse_mix(cfg.data_mix, "--data-mix")]
    if cfg.data_mix_anneal:
        for path, _ in parse_mix(cfg.data_mix_anneal, "--data-mix-anneal"):
            if path not in sources:
                raise ConfigError("--data-mix-anneal", cfg.data_mix_anneal, f"re-weight only sources of --data-mix "
                                  f"({', '.join(sources)})", f"names {path!r}, which --data-mix does not")
        if not 0.0 < cfg.data_mix_anneal_at < 1.0:
            raise ConfigError("--data-mix-anneal-at", cfg.data_mix_anneal_at, "use a fraction in (0, 1), e.g. 0.8",
                              "is out of range")
        if cfg.max_wall_s:
            raise ConfigError("--data-mix-anneal", cfg.data_mix_anneal, "leave out --max-wall-s, or the anneal (the "
                              "switch is a step of --num-steps, known in advance so the data order can be replayed)",
                              "needs a known last step")


def parse_mix(text: str, flag: str) -> list[tuple[str, float]]:
    """'path:weight,path:weight' -> [(path, weight), ...] in the order given (engine/data/mix.py reads the folders).

    A path may hold ':' (the weight is after the last one); weights are finite and >= 0, not all 0; a path at most once."""
    out: list[tuple[str, float]] = []
    for part in text.split(","):
        path, sep, weight = part.strip().rpartition(":")
        try:
            value = float(weight) if sep and path else math.nan
        except ValueError:
            value = math.nan
        if not (value >= 0.0 and math.isfinite(value)):
            raise ConfigError(flag, text, "write PATH:WEIGHT pairs joined by commas, e.g. data/web:0.7,data/code:0.3 "
                              "(weights finite and >= 0)", f"has a bad part {part.strip()!r}")
        if path in (p for p, _ in out):
            raise ConfigError(flag, text, "name each source once", f"names {path!r} twice")
        out.append((path, value))
    if not sum(w for _, w in out) > 0:
        raise ConfigError(flag, text, "give at least one source a positive weight", "has weights that are all 0")
    return out


def save_steps(cfg: EngineConfig) -> frozenset[int]:
    """The steps --save-at names: '5,6,7' -> {5, 6, 7}; each a step of the run (1..--num-steps), none twice."""
    if not cfg.save_at.strip():
        return frozenset()
    steps: list[int] = []
    for part in cfg.save_at.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= cfg.num_steps:
            raise ConfigError("--save-at", cfg.save_at, f"write step numbers from 1 to --num-steps {cfg.num_steps} joined "
                              "by commas, e.g. 27,28,29", f"has a bad part {part!r}")
        if int(part) in steps:
            raise ConfigError("--save-at", cfg.save_at, "name each step once", f"names step {part} twice")
        steps.append(int(part))
    return frozenset(steps)


def resolve(cfg: EngineConfig, world_size: int = 1) -> EngineConfig:
    """Validate everything that can be checked before any work, and fill derived fields.

    Raises ConfigError (one line, names field, value and fix) on the first problem found.
    """
    _choice(cfg, "device", DEVICE_CHOICES)
    _choice(cfg, "compute_dtype", DTYPE_CHOICES)
    _choice(cfg, "lr_schedule", LR_SCHEDULES)
    _choice(cfg, "optimizer", OPTIMIZERS)
    _choice(cfg, "activation_checkpointing", RECOMPUTE)
    _choice(cfg, "fp8", FP8_RECIPES)
    _choice(cfg, "fsdp_reshard_after_forward", FSDP_RESHARD)
    _choice(cfg, "fsdp_grad_sync", FSDP_GRAD_SYNC)
    _choice(cfg, "fsdp_reduce_dtype", FSDP_REDUCE_DTYPES)
    _finite(cfg)
    _positive(cfg, "num_steps", "vocab_size", "vocab_pad_multiple", "hidden_size", "num_layers", "num_heads",
              "num_kv_heads", "head_dim", "ffn_hidden_size", "seq_length", "micro_batch_size", "tp", "keep_last",
              "log_every", "lr", "init_std", "dim_model_base", "skip_spike_window", "skip_spike_max_consecutive",
              "rope_theta", "scale_emb", "scale_depth", "tp_fwd_chunks")
    _positive(cfg, "grad_accum_steps", "global_batch_size", "warmup_steps", "decay_steps", "eval_every", "eval_samples",
              "fsdp_prefetch", "save_every", "save_last", "weight_decay", "grad_clip", "peak_tflops", "rms_norm_eps", "adam_eps",
              allow_zero=True)
    if not cfg.ddp_bucket_mb > 0:
        raise ConfigError("--ddp-bucket-mb", cfg.ddp_bucket_mb, "use a positive size in MB (160 is Megatron's 40M elements)", "is out of range")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError("--num-kv-heads", cfg.num_kv_heads, f"use a divisor of --num-heads {cfg.num_heads}", "does not divide the query heads")
    if cfg.skip_spike_factor != 0.0 and not cfg.skip_spike_factor > 1.0:
        raise ConfigError("--skip-spike-factor", cfg.skip_spike_factor, "use 0 (off) or a factor above 1, e.g. 2",
                          "would skip ordinary steps")
    if not 0.0 <= cfg.min_lr_ratio <= 1.0:
        raise ConfigError("--min-lr-ratio", cfg.min_lr_ratio, "use a value in [0, 1]", "is out of range")
    if cfg.warmup_steps > cfg.num_steps:
        preset = load_preset(cfg.preset).get("warmup_steps") == cfg.warmup_steps  # where the value came from
        raise ConfigError("--warmup-steps", cfg.warmup_steps,
                          f"lower --warmup-steps to at most {cfg.num_steps}" +
                          (f" (the {cfg.preset} preset sets it to {cfg.warmup_steps})" if preset else "") +
                          f", or raise --num-steps to at least {cfg.warmup_steps}",
                          f"is longer than the run (--num-steps {cfg.num_steps})")
    if cfg.lr_schedule == "wsd" and cfg.warmup_steps + cfg.decay_steps > cfg.num_steps:
        raise ConfigError("--decay-steps", cfg.decay_steps, f"warmup {cfg.warmup_steps} + decay must fit in --num-steps {cfg.num_steps}", "is too long")
    if cfg.save_last > cfg.keep_last:
        raise ConfigError("--keep-last", cfg.keep_last, f"use at least --save-last {cfg.save_last}",
                          "would delete checkpoints --save-last asks for")
    if (named := len(save_steps(cfg))) > cfg.keep_last:
        raise ConfigError("--keep-last", cfg.keep_last, f"use at least {named}, one for each step of "
                          f"--save-at {cfg.save_at}", "would delete checkpoints --save-at asks for")
    if cfg.reset_position_ids and not cfg.document_mask:
        raise ConfigError("--reset-position-ids", True, "add --document-mask, or leave it out",
                          "without --document-mask would let a document attend to the previous one at negative distances")
    if cfg.override_schedule and not cfg.resume:
        raise ConfigError("--override-schedule", True, "use it with --resume (auto or a path), or leave it out",
                          "has no checkpoint whose schedule it would override")
    if cfg.resume not in ("", "auto") and not Path(cfg.resume).exists():
        raise ConfigError("--resume", cfg.resume, "pass 'auto' or an existing checkpoint folder", "does not exist")
    if not 0.0 <= cfg.muon_momentum < 1.0:
        raise ConfigError("--muon-momentum", cfg.muon_momentum, "use a value in [0, 1), e.g. 0.95", "is out of range")
    if not 1 <= cfg.muon_ns_steps <= 20:
        raise ConfigError("--muon-ns-steps", cfg.muon_ns_steps, "use 1 to 20 iterations (5 is the usual)", "is out of range")
    if not cfg.muon_update_rms > 0:
        raise ConfigError("--muon-update-rms", cfg.muon_update_rms, "use a positive RMS, e.g. 0.2", "is out of range")
    if cfg.optimizer != "muon":
        for name in MUON_FIELDS:
            if getattr(cfg, name) != _FIELDS[name].default:
                raise ConfigError(flag_name(name), getattr(cfg, name), "add --optimizer muon, or leave it out",
                                  f"has no effect with --optimizer {cfg.optimizer}")
    for beta in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(cfg, beta) < 1.0:
            raise ConfigError(flag_name(beta), getattr(cfg, beta), "use a value in [0, 1)", "is out of range")
    _check_budget_and_mix(cfg)

    # Parallel layout: TP groups of consecutive ranks, DP over the rest.
    if world_size % cfg.tp:
        launch = f"launch with torchrun --nproc-per-node {cfg.tp} (or a multiple of {cfg.tp}) -m engine pretrain ..."
        fix = f"{launch}, or pass --tp 1" if world_size == 1 else f"use a divisor of the world size {world_size}, or {launch}"
        raise ConfigError("--tp", cfg.tp, fix, f"does not divide the number of processes ({world_size})")
    if cfg.num_heads % cfg.tp:
        raise ConfigError("--tp", cfg.tp, f"use a TP size that divides --num-heads {cfg.num_heads}", "does not divide the query heads")
    if cfg.num_kv_heads % cfg.tp and cfg.tp % cfg.num_kv_heads:
        # tp > kv heads is fine when each KV head is replicated on tp / kv ranks (gradients summed over them)
        raise ConfigError("--tp", cfg.tp, f"use a TP size that divides --num-kv-heads {cfg.num_kv_heads} or is a multiple of it",
                          "neither divides nor is divided by the KV heads")
    if cfg.ffn_hidden_size % cfg.tp:
        raise ConfigError("--tp", cfg.tp, f"use a TP size that divides --ffn-hidden-size {cfg.ffn_hidden_size}", "does not divide the FFN")
    if cfg.sequence_parallel and cfg.seq_length % cfg.tp:
        raise ConfigError("--seq-length", cfg.seq_length, f"use a multiple of --tp {cfg.tp} with --sequence-parallel", "does not split across TP")
    if cfg.tp_fwd_chunks > 1 and cfg.sequence_parallel and cfg.tp > 1:
        raise ConfigError("--tp-fwd-chunks", cfg.tp_fwd_chunks, "use 1 with --sequence-parallel, or leave out --sequence-parallel",
                          "splits the all-reduce, which sequence parallelism replaces by a reduce-scatter")
    if cfg.tp_fwd_chunks > cfg.micro_batch_size * cfg.seq_length:
        raise ConfigError("--tp-fwd-chunks", cfg.tp_fwd_chunks,
                          f"use at most the micro-batch's {cfg.micro_batch_size * cfg.seq_length} tokens (2 to 4 is typical)",
                          "leaves chunks without rows")
    dp = world_size // cfg.tp
    if cfg.cuda_graphs and (cfg.tp > 1 or dp > 1):
        raise ConfigError("--cuda-graphs", True, "train on one GPU (TP 1, DP 1), or leave out --cuda-graphs",
                          f"replays captured micro-batches, which hold no TP or DP communication (this launch: "
                          f"TP {cfg.tp} x DP {dp})")
    if cfg.cuda_graphs and cfg.document_mask:
        raise ConfigError("--cuda-graphs", True, "leave out --document-mask or --cuda-graphs",
                          "replays one attention layout, and --document-mask changes it every micro-batch")

    fusion = _check_fsdp(cfg, world_size, dp)
    _check_fp8(cfg)
    if cfg.op_fp8_wgrad not in ("", "baseline") and (cfg.fp8 != "tensorwise" or not fusion):
        why = f"--fp8 is {cfg.fp8}" if cfg.fp8 != "tensorwise" else "gradient-accumulation fusion is off" + (
            " (--fsdp turns it off)" if cfg.fsdp else "")
        raise ConfigError("--op-fp8-wgrad", cfg.op_fp8_wgrad, "run --fp8 tensorwise with gradient-accumulation fusion "
                          "(the default; not with --fsdp), or leave out --op-fp8-wgrad",
                          f"adds tensorwise FP8 weight gradients into the fp32 accumulators of gradient-accumulation "
                          f"fusion, and here {why}: it would never run")

    # Batch: global = mbs x GAS x DP; either of GAS / global may be given, or both if consistent.
    mbs, gas, gbs = cfg.micro_batch_size, cfg.grad_accum_steps, cfg.global_batch_size
    if gas and gbs and gbs != mbs * gas * dp:
        raise ConfigError(
            "--global-batch-size", gbs,
            f"global batch {gbs} != mbs {mbs} x GAS {gas} x DP {dp}; set --grad-accum-steps {max(1, gbs // (mbs * dp))} "
            f"or --global-batch-size {mbs * gas * dp}", "is inconsistent")
    if gbs and not gas:
        if gbs % (mbs * dp):
            raise ConfigError("--global-batch-size", gbs, f"use a multiple of mbs {mbs} x DP {dp} = {mbs * dp}", "does not split into micro-batches")
        gas = gbs // (mbs * dp)
    gas = gas or 1
    gbs = mbs * gas * dp
    # With one TP rank there is no sequence to shard: the flag is a no-op, recorded as off.
    sp = cfg.sequence_parallel and cfg.tp > 1
    return dataclasses.replace(cfg, grad_accum_steps=gas, global_batch_size=gbs, sequence_parallel=sp,
                               grad_accum_fusion=fusion)


def _check_fp8(cfg: EngineConfig) -> None:
    """--fp8: FP8 GEMMs (cuBLAS / CUTLASS through torch._scaled_mm) need every dimension a multiple of 16: the
    widths each TP rank multiplies (hidden, head_dim, FFN shard) and the tokens of a micro-batch (a weight
    gradient's reduction; per forward row chunk of --tp-fwd-chunks). --fp8-weight-cache keeps tensorwise copies
    (one scale transposes with the weight; rowwise casts W per GEMM)."""
    if cfg.fp8_fast_accum and cfg.fp8 == "off":
        raise ConfigError("--fp8-fast-accum", True, "add --fp8 tensorwise (or rowwise), or leave out --fp8-fast-accum",
                          "sets how FP8 GEMMs accumulate, and this run has none (--fp8 off)")
    if cfg.fp8_weight_cache and cfg.fp8 != "tensorwise":
        raise ConfigError("--fp8-weight-cache", True, "add --fp8 tensorwise, or leave out --fp8-weight-cache",
                          f"keeps tensorwise FP8 copies of the weights, and --fp8 is {cfg.fp8}")
    if cfg.fp8 == "off":
        return
    for name, value in (("hidden_size", cfg.hidden_size), ("head_dim", cfg.head_dim)):
        if value % 16:
            raise ConfigError(flag_name(name), value, "use a multiple of 16, or leave out --fp8",
                              "is not a multiple of 16, which FP8 GEMMs need")
    if (cfg.ffn_hidden_size // cfg.tp) % 16:
        raise ConfigError("--ffn-hidden-size", cfg.ffn_hidden_size, f"use a multiple of 16 x --tp {cfg.tp}, or leave "
                          "out --fp8", "gives each TP rank an FFN shard that is not a multiple of 16, which FP8 GEMMs need")
    tokens = cfg.micro_batch_size * cfg.seq_length
    if tokens % (16 * cfg.tp_fwd_chunks):
        raise ConfigError("--seq-length", cfg.seq_length, f"make --micro-batch-size x --seq-length a multiple of 16 x "
                          f"--tp-fwd-chunks ({16 * cfg.tp_fwd_chunks}), or leave out --fp8",
                          f"gives {tokens} tokens per micro-batch, which FP8 GEMMs cannot split into multiples of 16")


ZERO1_FIELDS = ("ddp_bucket_mb", "overlap_grad_reduce", "overlap_param_gather")
FSDP_FIELDS = tuple(name for name in _FIELDS if name.startswith("fsdp_"))


def _check_fsdp(cfg: EngineConfig, world_size: int, dp: int) -> bool:
    """--fsdp against the launch and the other data-parallel knobs; returns --grad-accum-fusion as it will run
    (off under --fsdp: FSDP2 owns the unsharded gradient that the fused weight-gradient GEMMs would write)."""
    if not cfg.fsdp:
        for name in FSDP_FIELDS:
            if getattr(cfg, name) != _FIELDS[name].default:
                raise ConfigError(flag_name(name), getattr(cfg, name), "add --fsdp, or leave it out",
                                  "configures FSDP2, and this run uses the ZeRO-1 optimizer (no --fsdp)")
        return cfg.grad_accum_fusion
    if cfg.fsdp_reduce_dtype == "bf16" and cfg.fsdp_grad_sync == "step":
        raise ConfigError("--fsdp-reduce-dtype", cfg.fsdp_reduce_dtype, "use --fsdp-reduce-dtype fp32 with "
                          "--fsdp-grad-sync step, or --fsdp-grad-sync micro-batch", "would make FSDP2 accumulate "
                          "the step's micro-batch gradients in bf16 (--fsdp-grad-sync step accumulates in the "
                          "reduce dtype)")
    if cfg.fsdp_fp8_all_gather and cfg.fp8 != "tensorwise":
        raise ConfigError("--fsdp-fp8-all-gather", True, "add --fp8 tensorwise, or leave out --fsdp-fp8-all-gather",
                          f"gathers each weight's tensorwise FP8 copy (one scale a weight), and --fp8 is {cfg.fp8}"
                          + (" (a scale per row, which the GEMMs take along K: cast per GEMM, not once before the "
                             "gather)" if cfg.fp8 == "rowwise" else ""))
    if cfg.fsdp_fp8_all_gather and cfg.fp8_weight_cache:
        raise ConfigError("--fsdp-fp8-all-gather", True, "leave out --fp8-weight-cache (the weights arrive cast "
                          "already) or --fsdp-fp8-all-gather", "hands the linears the gathered FP8 copies, and "
                          "--fp8-weight-cache keeps copies cast from the gathered bf16 weights")
    if cfg.fsdp_prefetch >= cfg.num_layers:
        raise ConfigError("--fsdp-prefetch", cfg.fsdp_prefetch, f"use 0 to {cfg.num_layers - 1} (the layers after "
                          f"the first; 1 or 2 is usual)", f"reaches past the model's {cfg.num_layers} decoder layers")
    if cfg.optimizer != "adamw":
        raise ConfigError("--optimizer", cfg.optimizer, "use --optimizer adamw with --fsdp, or leave out --fsdp "
                          "(the ZeRO-1 optimizer runs Muon)", "is not supported with --fsdp (Muon orthogonalises whole "
                          "matrices, which --fsdp splits by rows over the DP ranks)")
    for name in ZERO1_FIELDS:
        if getattr(cfg, name) != _FIELDS[name].default:
            raise ConfigError(flag_name(name), getattr(cfg, name), "leave it out with --fsdp, or leave out --fsdp",
                              "configures the ZeRO-1 distributed optimizer, which --fsdp replaces (both were asked)")
    if dp < 2:
        raise ConfigError("--fsdp", True, f"launch DP >= 2 (world size = --tp x DP; e.g. torchrun --nproc-per-node "
                          f"{2 * cfg.tp} with --tp {cfg.tp}), or leave out --fsdp", f"has no data-parallel ranks to shard "
                          f"over (world size {world_size}, --tp {cfg.tp}: DP 1)")
    return False


def to_dict(cfg: EngineConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
