"""fp8_wgrad baseline: the plain-torch FP8 weight-gradient GEMM and add (defined beside its GEMMs in
engine/distributed/fp8.py, the reference every other version is held to)."""

from engine.distributed.fp8 import scaled_wgrad_add as wgrad_add

__all__ = ["wgrad_add"]
