"""Validation loss and bits per byte.

Bits per byte is tokenizer-agnostic: the summed cross-entropy of the evaluated targets in bits,
divided by the UTF-8 bytes those targets stand for (the tokenizer's per-id byte lengths, as
parameter-golf's val_bpb counts them). An evaluation always reads the same first --eval-samples
samples of the validation split (engine.data.loader.eval_batches), so numbers are comparable across
steps, runs and layouts: mbs 1 x GAS 2, mbs 2, DP 2 and TP 2 evaluate the same tokens. With
--document-mask they are read as training reads them, each token within its own document.
"""

import math

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.data.loader import PackedSamples, eval_batches
from engine.distributed import ParallelState
from engine.model import batch_documents

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, samples: PackedSamples, cfg: EngineConfig, par: ParallelState,
             token_bytes: torch.Tensor) -> tuple[float, float, int]:
    """Returns (val_loss in nats per token, val_bpb, evaluated target tokens) over the first
    cfg.eval_samples validation samples, summed in fp64 across micro-batches and DP ranks."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=par.device)  # nats, tokens, bytes
    token_bytes = token_bytes.to(par.device)
    for inputs, labels in eval_batches(samples, num_samples=cfg.eval_samples, micro_batch_size=cfg.micro_batch_size,
                                       dp_rank=par.dp_rank, dp_size=par.dp_size):
        documents = batch_documents(cfg, inputs, samples.shards.eos_id, par.device)
        inputs, labels = inputs.to(par.device), labels.to(par.device)
        totals[0] += model(inputs, labels, documents).double()
        totals[1] += labels.numel()
        totals[2] += token_bytes[labels].sum().double()
    if par.dp_size > 1:
        dist.all_reduce(totals, group=par.dp_group)
    model.train(was_training)
    nats, tokens, nbytes = totals.tolist()
    if tokens == 0:
        return float("nan"), float("nan"), 0
    return nats / tokens, nats / math.log(2) / max(nbytes, 1.0), int(tokens)
