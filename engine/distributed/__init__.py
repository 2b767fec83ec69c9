"""Process placement and communication: the parallel state and the TP region operators."""

from engine.distributed.comm import copy_to_tp, reduce_from_tp
from engine.distributed.state import ParallelState, init_parallel, shutdown_parallel

__all__ = ["ParallelState", "init_parallel", "shutdown_parallel", "copy_to_tp", "reduce_from_tp"]
