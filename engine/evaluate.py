"""Validation loss and bits per byte.

Bits per byte is tokenizer-agnostic: the summed cross-entropy of the evaluated targets in bits,
divided by the UTF-8 bytes those targets stand for (the tokenizer's per-id byte lengths, as
parameter-golf's val_bpb counts them). An evaluation always reads the same first samples of the
validation split, in order, so numbers are comparable across steps and runs. With --document-mask
they are read as training reads them, each token within its own document.
"""

import math

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.distributed import ParallelState
from engine.model import batch_documents

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, samples, cfg: EngineConfig, par: ParallelState,
             token_bytes: torch.Tensor) -> tuple[float, float, int]:
    """Returns (val_loss in nats per token, val_bpb, evaluated target tokens)."""
    was_training = model.training
    model.eval()
    mbs, dp = cfg.micro_batch_size, par.dp_size
    n = min(len(samples), cfg.eval_steps * mbs * dp)
    totals = torch.zeros(3, dtype=torch.float64, device=par.device)  # nats, tokens, bytes
    token_bytes = token_bytes.to(par.device)
    for start in range(0, n - n % (mbs * dp), mbs * dp):
        rows = range(start + par.dp_rank * mbs, start + (par.dp_rank + 1) * mbs)
        batch = torch.stack([samples[i] for i in rows])
        documents = batch_documents(cfg, batch[:, :-1], samples.shards.eos_id, par.device)
        batch = batch.to(par.device)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        totals[0] += model(inputs, labels, documents).double()
        totals[1] += labels.numel()
        totals[2] += token_bytes[labels].sum().double()
    if dp > 1:
        dist.all_reduce(totals, group=par.dp_group)
    model.train(was_training)
    nats, tokens, nbytes = totals.tolist()
    if tokens == 0:
        return float("nan"), float("nan"), 0
    return nats / tokens, nats / math.log(2) / max(nbytes, 1.0), int(tokens)
