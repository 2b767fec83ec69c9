"""Optimizer side: flat parameter / fp32 gradient buffers, mixed-precision AdamW, LR schedules."""

from engine.optim.buffers import Bucket, Entry, FlatBuffers
from engine.optim.optimizer import MixedPrecisionAdamW, Segment
from engine.optim.schedule import lr_at

__all__ = ["FlatBuffers", "Entry", "Bucket", "MixedPrecisionAdamW", "Segment", "lr_at"]
