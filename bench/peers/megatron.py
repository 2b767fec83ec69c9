"""Peer `megatron-core` (0.19.x): GPTModel with its local (no Transformer Engine) layer spec.

Set up as Megatron's own training loop does (megatron/training: get_model, get_megatron_optimizer,
get_forward_backward_func): TransformerConfig sized to the engine's shapes (RMSNorm, SwiGLU, no biases,
GQA, RoPE, untied LM head over the padded vocabulary, no dropout), bf16 parameters in Float16Module,
DistributedDataParallel with fp32 gradient buffers, and its mixed-precision optimizer (fp32 master
weights and Adam moments, gradient clipping). Without Transformer Engine or Apex its optimizer is
torch's AdamW (it says so at import) and its core attention is the unfused local DotProductAttention:
that is what this spec costs, and why the issue names it. Fusions that need Apex / TE are off.
TP = the engine's --tp (tensor_model_parallel_size), no sequence parallelism unless the engine's has it.
"""

import torch
import torch.nn.functional as F

from engine.config import EngineConfig

__all__ = ["build_step"]


def build_step(cfg: EngineConfig, variant: str, device: torch.device, seed: int = 0):
    """step(); torch.distributed is initialised (bench/peers/run.py launches via torchrun)."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from bench.peers.common import check_matmul_params, linear_params, synthetic_batches

    if variant not in ("", "default"):
        raise ValueError(f"megatron-core has one variant (bf16 params, fp32 master), not {variant!r}")
    if device.type != "cuda":
        raise ValueError("megatron-core runs on CUDA only (it places tensors on torch.cuda.current_device())")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=cfg.tp)
    model_parallel_cuda_manual_seed(seed)
    sp = cfg.sequence_parallel and cfg.tp > 1
    config = TransformerConfig(
        num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads,
        num_query_groups=cfg.num_kv_heads, kv_channels=cfg.head_dim, ffn_hidden_size=cfg.ffn_hidden_size,
        normalization="RMSNorm", layernorm_epsilon=cfg.rms_norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, attention_softmax_in_fp32=True, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, tensor_model_parallel_size=cfg.tp, sequence_parallel=sp,
        init_method_std=cfg.init_std)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=cfg.padded_vocab_size, max_sequence_length=cfg.seq_length, position_embedding_type="rope",
                     rotary_base=int(cfg.rope_theta), share_embeddings_and_output_weights=False, parallel_output=True)
    model.cuda(device)
    weights = [p for n, p in model.named_parameters() if n.endswith(("linear_qkv.weight", "linear_proj.weight",
                                                                      "linear_fc1.weight", "linear_fc2.weight"))]
    check_matmul_params(cfg, linear_params(weights, model.output_layer.weight, cfg.vocab_size, tp=cfg.tp), "megatron-core")
    model = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                    module=Float16Module(config, model))
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=cfg.lr, weight_decay=cfg.weight_decay,
                                                       adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2,
                                                       adam_eps=cfg.adam_eps, clip_grad=cfg.grad_clip, bf16=True),
                                       [model])
    batches = synthetic_batches(cfg, device, seed)
    positions = torch.arange(cfg.seq_length, device=device).expand(cfg.micro_batch_size, -1)
    forward_backward = get_forward_backward_func()

    def forward_step(data_iterator, module):
        tokens, labels = next(data_iterator)
        per_token = module(tokens, positions, None, labels=labels)  # [b, s] fp32 cross-entropy

        def loss_func(output):
            loss = output.float().mean()
            return loss, {"lm loss": loss.detach()}

        return per_token, loss_func

    def step() -> float:
        model.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
                                  num_microbatches=len(batches), seq_length=cfg.seq_length,
                                  micro_batch_size=cfg.micro_batch_size, forward_only=False)
        optimizer.step()
        return float(torch.stack([x["lm loss"] for x in losses]).mean())

    return step
