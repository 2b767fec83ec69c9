"""fp8_cast baseline: the plain-torch cast of one FP8 GEMM operand (defined beside its GEMMs in
engine/distributed/fp8.py, the reference every other version is held to)."""

from engine.distributed.fp8 import cast

__all__ = ["cast"]
