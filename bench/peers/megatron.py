"""Peer `megatron-core` (0.19.x): GPTModel with its local (no Transformer Engine) layer spec, at a layout.

Set up as Megatron's own training loop does (megatron/training: get_model, get_megatron_optimizer,
get_forward_backward_func, and the config hooks train() installs): TransformerConfig sized to the engine's shapes
(RMSNorm, SwiGLU, no biases, GQA, RoPE, untied LM head over the padded vocabulary, no dropout), bf16 parameters in
Float16Module, its DistributedDataParallel with fp32 gradient buffers (`--accumulate-allreduce-grads-in-fp32`)
and, at DP > 1, the distributed optimizer (ZeRO-1: fp32 master weights and Adam moments sharded over DP) with the
gradient reduce-scatter and the parameter all-gather overlapped (`--overlap-grad-reduce --overlap-param-gather`),
gradient clipping. The layout (bench/peers/layout.py) sets TP (`tensor_model_parallel_size`), sequence
parallelism, DP over the remaining ranks, and recompute: `selective` is Megatron's `recompute_granularity=
'selective'` (core attention, its default module), `full` recomputes whole layers (uniform, 1 layer per unit).

Without Transformer Engine or Apex (neither is on the GPU image) its optimizer is torch's AdamW (it says so at
import) and its core attention is the unfused local DotProductAttention: that is what this spec costs, and why
selective recompute (of exactly that attention) is its users' choice at seq 4096. One stand-in: the local spec's
torch norm refuses sequence parallelism (`WrappedTorchNorm` asserts it off; Apex's FusedLayerNorm is what allows
it), so with sp=on the norms are torch.nn.RMSNorm with their weights marked `sequence_parallel`, exactly what
FusedLayerNorm does, which makes finalize_model_grads all-reduce their gradients over TP. The row's versions name it.
"""

import torch
import torch.nn.functional as F

from engine.config import EngineConfig

__all__ = ["build_model", "build_step", "transformer_config"]


def transformer_config(cfg: EngineConfig, layout):
    """Megatron's TransformerConfig for the engine's shapes at `layout` (its own validation runs here)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    recompute = {"none": {}, "selective": {"recompute_granularity": "selective"},
                 "full": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}}
    return TransformerConfig(
        num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads,
        num_query_groups=cfg.num_kv_heads, kv_channels=cfg.head_dim, ffn_hidden_size=cfg.ffn_hidden_size,
        normalization="RMSNorm", layernorm_epsilon=cfg.rms_norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, attention_softmax_in_fp32=True, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, tensor_model_parallel_size=layout.tp, sequence_parallel=layout.sp,
        init_method_std=cfg.init_std, **recompute[layout.ac])


def _sp_norm(config, hidden_size: int, eps: float = 1e-5, **_):
    """torch.nn.RMSNorm with its weight marked for sequence parallelism, as Apex's FusedLayerNorm marks it."""
    norm = torch.nn.RMSNorm(hidden_size, eps=eps)
    norm.weight.sequence_parallel = config.sequence_parallel
    return norm


def _layer_spec(config, layout):
    """(the block spec GPTModel takes, stand-ins): the local spec, its norms swapped for _sp_norm under sp."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    if not layout.sp:
        return spec, []
    spec.submodules.input_layernorm = _sp_norm
    spec.submodules.pre_mlp_layernorm = _sp_norm
    return TransformerBlockSubmodules(layer_specs=[spec] * config.num_layers, layer_norm=_sp_norm), \
        ["RMSNorm(sequence_parallel)"]


def build_model(cfg: EngineConfig, layout, *, seed: int = 0, cpu_init: bool = False):
    """(GPTModel, TransformerConfig, stand-ins) at `layout`, its matmul parameters checked against the engine's; model
    parallelism and its CUDA RNG tracker are initialised here (tp x dp ranks launched). `cpu_init` builds on the CPU
    with no CUDA RNG (shape probes only)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from bench.peers.common import check_matmul_params, linear_params

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=layout.tp)
    if not cpu_init:
        model_parallel_cuda_manual_seed(seed)  # before the model: TP weights draw from its tracker
    config = transformer_config(cfg, layout)
    config.use_cpu_initialization = cpu_init
    spec, stand_ins = _layer_spec(config, layout)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=cfg.padded_vocab_size,
                     max_sequence_length=cfg.seq_length, position_embedding_type="rope",
                     rotary_base=int(cfg.rope_theta), share_embeddings_and_output_weights=False, parallel_output=True)
    weights = [p for n, p in model.named_parameters() if n.endswith(("linear_qkv.weight", "linear_proj.weight",
                                                                      "linear_fc1.weight", "linear_fc2.weight"))]
    check_matmul_params(cfg, linear_params(weights, model.output_layer.weight, cfg.vocab_size, tp=layout.tp),
                        "megatron-core")
    return model, config, stand_ins


def build_step(cfg: EngineConfig, variant: str, device: torch.device, layout, seed: int = 0):
    """(step, notes for the row); torch.distributed is initialised (bench/peers/run.py launches tp x dp ranks)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module

    from bench.peers.common import synthetic_batches

    if variant not in ("", "default"):
        raise ValueError(f"megatron-core has one variant (bf16 params, fp32 master), not {variant!r}")
    if device.type != "cuda":
        raise ValueError("megatron-core runs on CUDA only (it places tensors on torch.cuda.current_device())")
    model, config, stand_ins = build_model(cfg, layout, seed=seed)
    model.cuda(device)
    distopt = layout.dp > 1  # one DP rank has nothing to shard: plain DDP, as Megatron runs it
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=distopt,
                                               overlap_grad_reduce=distopt, overlap_param_gather=distopt)
    model = DistributedDataParallel(config, ddp_config, module=Float16Module(config, model))
    # the hooks megatron/training/training.py installs: no-sync across micro-batches and the overlapped reduce,
    # and the end-of-step gradient finalisation (DP sync, TP all-reduce of sequence-parallel norm gradients)
    if ddp_config.overlap_grad_reduce:
        config.no_sync_func = model.no_sync
        config.grad_sync_func = model.start_grad_sync
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=cfg.lr, weight_decay=cfg.weight_decay,
                                                       adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2,
                                                       adam_eps=cfg.adam_eps, clip_grad=cfg.grad_clip, bf16=True,
                                                       use_distributed_optimizer=distopt,
                                                       overlap_param_gather=distopt), [model])
    # one batch per DP rank (TP ranks, consecutive in Megatron's default order, share theirs)
    batches = synthetic_batches(cfg, device, seed + torch.distributed.get_rank() // layout.tp)
    positions = torch.arange(cfg.seq_length, device=device).expand(layout.mbs, -1)
    forward_backward = get_forward_backward_func()

    def forward_step(data_iterator, module):
        tokens, labels = next(data_iterator)
        per_token = module(tokens, positions, None, labels=labels)  # [b, s] fp32 cross-entropy

        def loss_func(output):
            loss = output.float().mean()
            return loss, {"lm loss": loss.detach()}

        return per_token, loss_func

    def step() -> float:
        """The mean loss over this DP rank's micro-batches, averaged over DP (as Megatron logs it)."""
        model.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
                                  num_microbatches=len(batches), seq_length=cfg.seq_length,
                                  micro_batch_size=layout.mbs, forward_only=False)
        optimizer.step()
        loss = torch.stack([x["lm loss"] for x in losses]).mean()
        torch.distributed.all_reduce(loss, group=_dp_group())
        return float(loss) / layout.dp

    notes = {"spec": "local", "distributed_optimizer": distopt, **({"stand-ins": "+".join(stand_ins)} if stand_ins else {})}
    return step, notes


def _dp_group():
    from megatron.core import parallel_state
    return parallel_state.get_data_parallel_group()


def probe(argv: list[str]) -> dict:
    """CPU shape probe (megatron-core's step needs CUDA): under torchrun with gloo, build the model at a layout with CPU
    initialisation and check its matmul parameters against the engine's; the facts a GPU run rests on, as a dict.

        torchrun --standalone --nproc-per-node 2 -m bench.peers.megatron tp=2,ac=selective -- --preset tiny --device cpu
    """
    import torch.distributed as dist

    from bench.peers.common import engine_config
    from bench.peers.layout import layout_flags, resolve_layout

    split = argv.index("--")
    flags = argv[split + 1:]
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    _, layout = resolve_layout(f"megatron-core:{','.join(argv[:split])}", engine_config(flags, world), world)
    cfg = engine_config([*flags, *layout_flags(layout)], world)
    model, config, stand_ins = build_model(cfg, layout, cpu_init=True)
    facts = {"layout": layout.record("megatron-core"), "stand_ins": stand_ins, "padded_vocab_size": cfg.padded_vocab_size,
             "sequence_parallel_params": sum(1 for p in model.parameters() if getattr(p, "sequence_parallel", False)),
             "recompute_granularity": config.recompute_granularity, "recompute_modules": config.recompute_modules,
             "sequence_parallel": config.sequence_parallel, "tp": config.tensor_model_parallel_size,
             "dp": world // config.tensor_model_parallel_size}
    dist.destroy_process_group()
    return facts


if __name__ == "__main__":
    import json
    import os
    import sys

    facts = probe(sys.argv[1:])
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(facts))
