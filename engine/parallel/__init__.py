"""Applying data parallelism around the optimizer: gradient reduction and parameter gathering."""

from engine.parallel.data_parallel import gather_params, reduce_grads

__all__ = ["reduce_grads", "gather_params"]
