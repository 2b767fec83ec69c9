"""Process placement and communication: the parallel state, the TP region operators, TP linears."""

from engine.distributed.comm import copy_to_tp, gather_from_sp, reduce_from_tp, reduce_scatter_to_sp
from engine.distributed.state import ParallelState, init_parallel, shutdown_parallel
from engine.distributed.tp_linear import (TPComm, column_input, column_parallel_linear, mlp_region, row_output,
                                          row_parallel_linear)
from engine.distributed.wgrad import MainGrad, attach_main_grad, fused_embedding, fused_linear, main_grad_of

__all__ = ["ParallelState", "init_parallel", "shutdown_parallel", "copy_to_tp", "reduce_from_tp", "gather_from_sp",
           "reduce_scatter_to_sp", "TPComm", "column_input", "row_output", "column_parallel_linear", "mlp_region",
           "row_parallel_linear", "MainGrad", "attach_main_grad", "main_grad_of", "fused_linear", "fused_embedding"]
