"""Peer `torchtitan` (0.3.x): its Llama3 model and the parts of its trainer that run a step.

Built as torchtitan's Trainer builds it (torchtitan/trainer.py): the model config from its own classes
(`Llama3Model.Config`, `Llama3TransformerBlock.Config`, `make_gqa_config`, `make_ffn_config`, RoPE,
RMSNorm) sized to the engine's shapes (fused QKV, GQA, SwiGLU FFN, untied LM head over the padded
vocabulary), built on the meta device, `parallelize_llama` at the peer's layout (bench/peers/layout.py: its
ParallelDims with TP x FSDP degrees, a 2-D mesh when both are > 1, TP with its sequence-parallel plan; its
`selective` op-level SAC or `full` AC policy; per-block torch.compile; FSDP2's MixedPrecisionPolicy: fp32 master
parameters, bf16 compute, fp32 gradient reduction), `init_weights`, its optimizer container (AdamW, fused) and its
cross-entropy loss. The step is its train_step without logging: GAS forward/backward passes inside its SPMD
context with the loss divided by the global token count (summed over the DP ranks), its clip_grad_norm_,
optimizer step; each DP rank draws its own batches. Attention: its default flex backend with
the block-causal mask of one document per row (that is plain causal attention). Its `varlen` backend
needs torch >= 2.12 (GQA and num_splits in varlen_attn), so it is not offered.
torchtitan's llama3 has no muP scalings; they are elementwise and cost nothing measurable.

torchtitan 0.3.0 is written against torch 2.12; on an older torch `torch_compat` supplies the two names
its llama3 path imports from 2.12 without changing any work it does (see there). The stand-ins it
installed are reported with the peer's versions, so a table row says it ran with them.

On CPU (probes and tests, gloo; never on CUDA) three things differ, each named where it is done: the inner attention
is torchtitan's own SDPA backend (flex has no CPU backward), its meshes are built on "cpu", and FSDP2 reduces with
a plain SUM (gloo has no PREMUL_SUM).
"""

import inspect

import torch

from engine.config import EngineConfig

__all__ = ["build_step", "torch_compat"]


def torch_compat(fsdp=None, flex=None) -> list[str]:
    """Make torch < 2.12 offer what torchtitan 0.3.x's llama3 path imports from 2.12; the stand-ins in place.

    - `torch.distributed.fsdp.DataParallelMeshDims`: torchtitan builds one only for a mesh of more than one rank
      (then build_step picks its partial_dtensor backend, which does not); the stand-in raises if anything builds one.
    - `create_block_mask(separate_full_blocks=...)`: torch < 2.12 always stores fully unmasked blocks apart,
      which is what True asks for; the wrapper drops True and refuses False (torchtitan's batch-invariant mode).
    Must run before torchtitan is imported (it binds both at import); idempotent, and a later call reports the
    same stand-ins. `fsdp`/`flex` default to torch's modules.
    """
    if fsdp is None:
        import torch.distributed.fsdp as fsdp
    if flex is None:
        import torch.nn.attention.flex_attention as flex
    if not hasattr(fsdp, "DataParallelMeshDims"):
        class DataParallelMeshDims:
            """Stand-in for torch 2.12's type; building one means a path this peer does not support."""

            stand_in = True

            def __init__(self, *args, **kwargs):
                raise RuntimeError(f"torchtitan asked for DataParallelMeshDims (fully_shard over a multi-rank SPMD "
                                   f"mesh), which torch {torch.__version__} lacks")

        fsdp.DataParallelMeshDims = DataParallelMeshDims
    original = flex.create_block_mask
    if "separate_full_blocks" not in inspect.signature(original).parameters:
        def create_block_mask(*args, separate_full_blocks: bool = True, **kwargs):
            if not separate_full_blocks:
                raise RuntimeError(f"create_block_mask(separate_full_blocks=False) needs torch >= 2.12, "
                                   f"this is {torch.__version__}")
            return original(*args, **kwargs)

        create_block_mask.stand_in = True
        flex.create_block_mask = create_block_mask
    return [name for name, obj in (("DataParallelMeshDims", fsdp.DataParallelMeshDims),
                                   ("create_block_mask(separate_full_blocks)", flex.create_block_mask))
            if getattr(obj, "stand_in", False)]


def _model_config(cfg: EngineConfig, attn_backend: str):
    """torchtitan's llama3 config sized to the engine's shapes, with its llama3 initialisation (trunc-normal
    0.02, depth-scaled on the residual outputs, embedding N(0, 1), LM head dim^-0.5): the loss starts where
    every other row's does (ln V), so nothing about the step runs on out-of-range values."""
    from functools import partial

    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
    from torchtitan.models.common.param_init import depth_scaled_std
    from torchtitan.models.llama3 import Llama3Model, Llama3TransformerBlock

    h, vocab = cfg.hidden_size, cfg.padded_vocab_size

    def normal(std: float) -> dict:
        return {"weight": partial(torch.nn.init.trunc_normal_, std=std, a=-3 * std, b=3 * std)}

    ones = {"weight": torch.nn.init.ones_}
    layers = [Llama3TransformerBlock.Config(
        attention_norm=RMSNorm.Config(normalized_shape=h, eps=cfg.rms_norm_eps, param_init=ones),
        ffn_norm=RMSNorm.Config(normalized_shape=h, eps=cfg.rms_norm_eps, param_init=ones),
        attention=make_gqa_config(dim=h, n_heads=cfg.num_heads, n_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                                  wqkv_param_init=normal(0.02), wo_param_init=normal(depth_scaled_std(0.02, i)),
                                  fuse_qkv=True, inner_attention=get_attention_config(attn_backend),
                                  rope=ComplexRoPE.Config(dim=cfg.head_dim, max_seq_len=cfg.seq_length,
                                                          theta=cfg.rope_theta)),
        feed_forward=make_ffn_config(dim=h, hidden_dim=cfg.ffn_hidden_size, w1_param_init=normal(0.02),
                                     w2w3_param_init=normal(depth_scaled_std(0.02, i))),
    ) for i in range(cfg.num_layers)]
    return Llama3Model.Config(dim=h, vocab_size=vocab, layers=layers,
                              tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=h,
                                                              param_init={"weight": torch.nn.init.normal_}),
                              norm=RMSNorm.Config(normalized_shape=h, eps=cfg.rms_norm_eps, param_init=ones),
                              lm_head=Linear.Config(in_features=h, out_features=vocab, param_init=normal(h ** -0.5)))


def _causal_sdpa_for_cpu(model) -> None:
    """CPU probes only (flex attention has no CPU backward): each block's inner attention becomes torchtitan's own
    SDPA backend, causal. Every row is one document, so the block-causal mask flex gets is plain causal: the same
    math. build_step refuses it on CUDA, where the peer keeps its flex default."""
    from torchtitan.models.common.attention import ScaledDotProductAttention

    class CausalSDPA(ScaledDotProductAttention):
        def forward(self, q, k, v, *, attention_masks=None, **kwargs):
            return super().forward(q, k, v, **kwargs)

    for block in model.layers.values():
        block.attention.inner_attention = CausalSDPA(ScaledDotProductAttention.Config())


def build_step(cfg: EngineConfig, variant: str, device: torch.device, layout, *, attn_backend: str = "flex",
               seed: int = 0):
    """(model, step, notes for the row: its SPMD backend, the stand-ins installed) at `layout` (bench/peers/layout.py:
    tp x dp processes, dp sharded by FSDP2, TP on a 2-D mesh with torchtitan's sequence-parallel plan, `ac` its
    SelectiveAC / FullAC policy, `compile` its per-block torch.compile); torch.distributed is initialised
    (bench/peers/run.py launches via torchrun) with tp x dp ranks."""
    if variant not in ("", "default"):
        raise ValueError(f"torchtitan has one variant (fp32 master + bf16 compute), not {variant!r}")
    stand_ins = torch_compat()
    import torch.distributed as dist
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.llama3 import parallelize_llama

    from bench.peers.common import check_matmul_params, linear_params, synthetic_batches

    if device.type == "cpu":
        # CPU probes only (gloo; tests): torchtitan builds its meshes on tools.utils.device_type, which is "cuda"
        # whenever no accelerator is found; its ParallelDims reads the name it imported.
        import torchtitan.distributed.parallel_dims as titan_parallel_dims
        titan_parallel_dims.device_type = "cpu"
    world = dist.get_world_size()
    if world != layout.nproc:
        raise ValueError(f"torchtitan layout tp {layout.tp} x dp {layout.dp} needs {layout.nproc} processes, got {world}")
    # torchtitan's default SPMD backend hands fully_shard a DataParallelMeshDims whenever its mesh has more than one
    # rank, which only torch 2.12's fully_shard takes; there, on an older torch, its partial_dtensor backend (DTensor
    # on the model-parallel axes, FSDP2 on its own `fsdp` mesh) runs the same parallelism.
    backend = "partial_dtensor" if world > 1 and "DataParallelMeshDims" in stand_ins else "spmd_types"
    parallelism = ParallelismConfig(tensor_parallel_degree=layout.tp, data_parallel_shard_degree=layout.dp,
                                    spmd_backend=backend)
    training = TrainingConfig(local_batch_size=layout.mbs, seq_len=cfg.seq_length, max_norm=cfg.grad_clip,
                              mixed_precision_param="bfloat16", mixed_precision_reduce="float32")
    compile_config = CompileConfig(enable=layout.compile, components=["model", "loss"],
                                   enable_async_tensor_parallel=layout.async_tp)
    ac_config = {"none": None, "selective": SelectiveAC.Config(), "full": FullAC.Config()}[layout.ac]
    parallel_dims = ParallelDims.from_config(parallelism, world)
    if attn_backend not in ("flex", "sdpa") or (attn_backend == "sdpa" and device.type != "cpu"):
        raise ValueError(f"attention backend {attn_backend!r}: the peer runs torchtitan's flex (sdpa: CPU probes only)")
    model_config = _model_config(cfg, "flex")
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = model_config.build()
    if attn_backend == "sdpa":
        _causal_sdpa_for_cpu(model)
    model = parallelize_llama(model, parallel_dims=parallel_dims, training=training, parallelism=parallelism,
                              compile_config=compile_config, ac_config=ac_config, dump_folder="/tmp/torchtitan-peer")
    if device.type == "cpu":  # CPU probes: gloo has no PREMUL_SUM (FSDP2's reduce-scatter with a divide factor)
        from torch.distributed.fsdp import FSDPModule
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    counted = linear_params([m.weight for name, m in model.named_modules()
                             if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head")],
                            model.lm_head.weight, cfg.vocab_size)
    check_matmul_params(cfg, counted, "torchtitan")  # DTensor weights (TP, FSDP) report their global shape
    adamw = {"lr": cfg.lr, "betas": (cfg.adam_beta1, cfg.adam_beta2), "eps": cfg.adam_eps, "weight_decay": cfg.weight_decay}
    optimizers = OptimizersContainer.Config(param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                                                           optimizer_kwargs=adamw)],
                                            implementation="fused" if device.type == "cuda" else "foreach"
                                            ).build(model_parts=[model])
    loss_fn = CrossEntropyLoss.Config().build(compile_config=compile_config)
    # one batch per DP rank (TP ranks, consecutive in torchtitan's mesh, share theirs)
    batches = synthetic_batches(cfg, device, seed + dist.get_rank() // layout.tp)
    positions = torch.arange(cfg.seq_length, device=device).expand(layout.mbs, -1)
    masks = model.get_attention_masks(positions=positions)
    batch_mesh = parallel_dims.get_mesh("batch") if parallel_dims.dp_enabled else None
    train_context = dist_utils.get_spmd_context(parallel_dims=parallel_dims)
    local_tokens = torch.tensor(sum(int(y.numel()) for _, y in batches), device=device)

    def step() -> float:
        """torchtitan's train_step without its logging: the loss of each micro-batch over the global token count
        (FSDP2's gradient division is off, apply_fsdp_to_decoder), clip, step; returns the global mean loss."""
        optimizers.zero_grad()
        tokens = dist_utils.dist_sum_tensor(local_tokens, batch_mesh) if batch_mesh is not None else local_tokens
        total = torch.zeros((), device=device)
        for x, y in batches:
            with train_context():  # its trainer's SPMD context (sets the meshes for the spmd_types backend)
                loss, _ = loss_fn(model(x, positions, masks), y, tokens)
                loss.backward()
            total += loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()
        dist_utils.clip_grad_norm_(list(model.parameters()), cfg.grad_clip, foreach=True)
        optimizers.step()
        return dist_utils.dist_sum(total, batch_mesh) if batch_mesh is not None else float(total)

    notes = {"spmd_backend": backend, **({"stand-ins": "+".join(stand_ins)} if stand_ins else {})}
    return model, step, notes
