"""Where the documents of a packed window begin: what --document-mask and --reset-position-ids read.

Why and how: docs/engine/model.md, section `engine/model/documents.py`.
"""

from dataclasses import dataclass

import torch

from engine.config import EngineConfig

__all__ = ["DocumentLayout", "document_layout", "batch_documents"]


@dataclass(frozen=True)
class DocumentLayout:
    """Documents of one micro-batch of [b, s] tokens (see the module doc)."""

    cu_seqlens: torch.Tensor  # int32 [n + 1]: 0, document starts in the flattened tokens, b * s
    max_seqlen: int  # the longest document, in tokens
    reset_positions: bool  # RoPE positions restart at 0 in each document (else 0..s-1 along each row)

    def to(self, device: torch.device | str) -> "DocumentLayout":
        return DocumentLayout(cu_seqlens=self.cu_seqlens.to(device, non_blocking=True), max_seqlen=self.max_seqlen,
                              reset_positions=self.reset_positions)


def document_layout(inputs: torch.Tensor, eos_id: int, *, reset_positions: bool) -> DocumentLayout:
    """The documents of `inputs` [b, s] (host tokens): each starts at a row start or after an EOS."""
    if inputs.dim() != 2 or inputs.device.type != "cpu":
        raise ValueError(f"document_layout wants the loader's [b, s] tokens on the host (no device sync); got "
                         f"{tuple(inputs.shape)} on {inputs.device}")
    b, s = inputs.shape
    starts = torch.zeros(b, s, dtype=torch.bool)
    starts[:, 0] = True
    starts[:, 1:] = inputs[:, :-1] == eos_id
    offsets = starts.reshape(-1).nonzero().reshape(-1)
    cu_seqlens = torch.cat([offsets, torch.tensor([b * s])]).to(torch.int32)
    max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return DocumentLayout(cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, reset_positions=reset_positions)


def batch_documents(cfg: EngineConfig, inputs: torch.Tensor, eos_id: int,
                    device: torch.device | str) -> DocumentLayout | None:
    """The layout a micro-batch's forward needs on `device`, or None when --document-mask is off."""
    if not cfg.document_mask:
        return None
    return document_layout(inputs, eos_id, reset_positions=cfg.reset_position_ids).to(device)
