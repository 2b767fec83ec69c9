"""Optimizer side: flat parameter / fp32 gradient buffers, mixed-precision AdamW, Muon for the hidden matrices, muP lr
multipliers, LR schedules, loss-spike skips."""

from engine.optim.buffers import Bucket, Entry, FlatBuffers
from engine.optim.mup import describe_multipliers, lr_multipliers
from engine.optim.muon import Muon, muon_parts
from engine.optim.optimizer import MixedPrecisionAdamW, Segment
from engine.optim.schedule import lr_at
from engine.optim.spike import LossSpikeGuard

__all__ = ["FlatBuffers", "Entry", "Bucket", "MixedPrecisionAdamW", "Segment", "lr_at", "lr_multipliers",
           "describe_multipliers", "LossSpikeGuard", "Muon", "muon_parts"]
