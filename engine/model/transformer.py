"""The MiniCPM4 decoder: vocab-parallel embedding, N pre-norm decoder layers, final norm, LM head.

MiniCPM's muP scalings (cfg.mup): embedding output x scale_emb; residual branches x
scale_depth / sqrt(num_layers) (in DecoderLayer); LM head input / (hidden / dim_model_base).
With cfg.mup off every scaling is 1 and the model is exactly HF's LlamaForCausalLM.

With cfg.document_mask every forward takes the micro-batch's DocumentLayout (engine/model/documents.py)
and a token attends only within its document; a forward without one raises rather than quietly
attending across documents.
"""

import torch
import torch.distributed as dist
from torch import nn

from engine.config import EngineConfig
from engine.distributed import ParallelState, column_input, main_grad_of
from engine.distributed.collectives import all_gather_new
from engine.model.documents import DocumentLayout
from engine.model.init import Initializer
from engine.model.layers import DecoderLayer, RMSNormWeight, Rotary, VocabEmbedding, tp_comm
from engine.model.recompute import recompute_layer
from engine.model.tp_grads import TPGrads
from engine.ops import OpSet

__all__ = ["Transformer", "build_model", "IGNORE_INDEX"]

IGNORE_INDEX = -100


class Transformer(nn.Module):
    def __init__(self, cfg: EngineConfig, par: ParallelState, ops: OpSet, device, dtype):
        super().__init__()
        self.cfg, self.par, self.ops = cfg, par, ops
        self.embed = VocabEmbedding(cfg, par, device, dtype)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.seq_length, device)
        self.layers = nn.ModuleList(DecoderLayer(cfg, par, ops, device, dtype) for _ in range(cfg.num_layers))
        self.final_norm = RMSNormWeight(cfg.hidden_size, device, dtype)
        self.lm_head = nn.Parameter(torch.empty(self.embed.local, cfg.hidden_size, device=device, dtype=dtype))
        self.emb_scale = cfg.scale_emb if cfg.mup else 1.0
        self.logit_divisor = cfg.hidden_size / cfg.dim_model_base if cfg.mup else 1.0
        self.residual_scale = self.layers[0].residual_scale
        self.recompute = cfg.activation_checkpointing  # none, selective or full (engine/model/recompute.py)
        self.tp = tp_comm(cfg, par)

    def tp_grads(self) -> TPGrads:
        """What TP asks of each parameter's gradient, as its layers declare it (engine/model/tp_grads.py)."""
        return TPGrads.of(self, self.par, self.tp.sequence_parallel)

    @torch.no_grad()
    def init_weights(self) -> None:
        init = Initializer(self.cfg, self.lm_head.device)
        self.embed.init_shard(init, "embed")
        self.rotary.init_shard(init, "rotary")
        for i, layer in enumerate(self.layers):
            layer.attn_norm.init_shard(init, f"layers.{i}.attn_norm")
            layer.attn.init_shard(init, f"layers.{i}.attn")
            layer.mlp_norm.init_shard(init, f"layers.{i}.mlp_norm")
            layer.mlp.init_shard(init, f"layers.{i}.mlp")
        self.final_norm.init_shard(init, "final_norm")
        full = init.matrix("lm_head", (self.embed.padded, self.cfg.hidden_size))
        self.lm_head.copy_(full[self.embed.start:self.embed.start + self.embed.local])

    def _check_documents(self, documents: DocumentLayout | None) -> None:
        if self.cfg.document_mask and documents is None:
            raise ValueError("--document-mask is on but the forward got no DocumentLayout: build one per micro-batch "
                             "with engine.model.documents.batch_documents")
        if documents is not None and (not self.cfg.document_mask
                                      or documents.reset_positions != self.cfg.reset_position_ids):
            raise ValueError(f"the DocumentLayout does not match the config (document_mask={self.cfg.document_mask}, "
                             f"reset_position_ids={self.cfg.reset_position_ids}): build it with batch_documents")

    def hidden_states(self, tokens: torch.Tensor, documents: DocumentLayout | None = None) -> torch.Tensor:
        """tokens [b, s] -> final normed hidden states [b, s, h], already divided for the LM head.
        Sequence parallel: this TP rank's block of rows of them, [b * s / tp, h]."""
        self._check_documents(documents)
        seq_len = tokens.shape[1]
        residual = self.embed(tokens)
        if self.emb_scale != 1.0:
            residual = residual * self.emb_scale
        branch = None
        for layer in self.layers:
            if self.recompute != "none" and torch.is_grad_enabled():
                residual, branch = recompute_layer(layer, self.recompute, residual, branch, self.rotary, seq_len,
                                                   documents)
            else:
                residual, branch = layer(residual, branch, self.rotary, seq_len, documents)
        hidden, _ = self.ops.rmsnorm(branch, self.final_norm.weight, eps=self.cfg.rms_norm_eps,
                                     residual=residual, residual_scale=self.residual_scale)
        if self.logit_divisor != 1.0:
            hidden = hidden / self.logit_divisor
        return hidden

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None,
                documents: DocumentLayout | None = None) -> torch.Tensor:
        """Sum of cross-entropy over tokens whose label is not -100 (fp32 scalar).

        The caller divides by the global count of valid tokens (across micro-batches and DP ranks),
        so every token weighs the same however the batch is split. `labels` None: the full logits
        instead (`logits`; a forward, so that --fsdp gathers the parameters as in training).
        """
        hidden = self.hidden_states(tokens, documents)
        if labels is None:
            return self._full_logits(hidden, tokens)
        hidden = column_input(hidden.reshape(-1, hidden.shape[-1]), self.tp)
        return self.ops.gemm_output(hidden, self.lm_head, labels.reshape(-1), vocab_start=self.embed.start,
                                    vocab_size=self.cfg.vocab_size, tp_group=self.par.tp_group,
                                    main_grad=main_grad_of(self.lm_head))

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor, documents: DocumentLayout | None = None) -> torch.Tensor:
        """Full logits [b, s, vocab_size] in fp32, gathered across TP: for tests and export checks only."""
        return self(tokens, None, documents)

    def _full_logits(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp.sequence_parallel:
            hidden = all_gather_new(hidden, self.par.tp_group, self.par.tp_size)[0].view(*tokens.shape, -1)
        local = hidden.float() @ self.lm_head.float().t()
        if self.par.tp_size > 1:
            parts = [torch.empty_like(local) for _ in range(self.par.tp_size)]
            dist.all_gather(parts, local.contiguous(), group=self.par.tp_group)
            local = torch.cat(parts, dim=-1)
        return local[..., : self.cfg.vocab_size]


def build_model(cfg: EngineConfig, par: ParallelState, ops: OpSet, dtype: torch.dtype) -> Transformer:
    """Construct on the meta device (no memory), materialise this rank's shards, initialise them."""
    with torch.device("meta"):
        model = Transformer(cfg, par, ops, "meta", dtype)
    model.to_empty(device=par.device)
    model.init_weights()
    return model
