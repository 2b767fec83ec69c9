"""--cuda-graphs: a step's first micro-batch and its later ones, each captured once as a CUDA graph and replayed.

Why and how: docs/engine/training.md, section `engine/cuda_graph.py`.
"""

import torch
from torch import nn

from engine.distributed.fp8 import kept_weight_copies
from engine.optim.buffers import FlatBuffers

__all__ = ["MicroBatchGraph"]


class MicroBatchGraph:
    """Two graphs: `first` is a step's first micro-batch (it writes the fused gradient views and casts the
    --fp8-weight-cache copies), `rest` each later one (it adds into the views and reads those copies). The first
    step runs eagerly; the second captures `first` at its first micro-batch and `rest` at its second."""

    def __init__(self, model: nn.Module, buffers: FlatBuffers | None):
        self.model, self.buffers = model, buffers
        self.stream: torch.cuda.Stream | None = None
        self.warm = False  # one whole step ran eagerly
        self.graphs: dict[bool, torch.cuda.CUDAGraph] = {}  # keyed by `first`
        self.losses: dict[bool, torch.Tensor] = {}
        self.written: list = []  # the MainGrads `first` writes (FlatBuffers.unwritten before it, not after)
        self.held: list = []  # what the graphs read that lives outside them (the weight copies `first` casts)

    def _forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        loss = self.model(inputs, labels)
        (loss / valid).backward()
        return loss.detach()

    def __call__(self, inputs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, first: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch (`first`: the step's first) into the fp32 gradient buffer;
        returns its summed loss."""
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=torch.cuda.current_stream().device)
        elif first:
            self.warm = True  # the second step begins
        if not self.warm:
            return self._eager(inputs, labels, valid)
        if first not in self.graphs:
            self._capture(inputs, labels, valid, first)
        if inputs.shape != self.tokens.shape:
            raise RuntimeError(f"--cuda-graphs replays the captured micro-batch of shape {tuple(self.tokens.shape)}, "
                               f"and this one is {tuple(inputs.shape)}: every micro-batch must have one shape")
        self.tokens.copy_(inputs)
        self.labels.copy_(labels)
        self.valid.copy_(valid)
        self.graphs[first].replay()
        if first:
            for main in self.written:  # what the Python side of the capture recorded, for FlatBuffers.settle
                main.mark_written()
        return self.losses[first].clone()

    def _eager(self, inputs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """torch's recipe: warm up on the capture stream, so lazy initialisation (kernel compilation, autotuning,
        cuBLAS's workspace) happens before and outside any capture."""
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            loss = self._forward_backward(inputs, labels, valid)
        main.wait_stream(self.stream)
        loss.record_stream(main)
        return loss

    def _capture(self, inputs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, first: bool) -> None:
        if not self.graphs:
            self.tokens, self.labels, self.valid = inputs.clone(), labels.clone(), valid.clone()
        unwritten = self.buffers.unwritten() if self.buffers is not None else []
        graph = torch.cuda.CUDAGraph()
        pool = next(iter(self.graphs.values())).pool() if self.graphs else None  # one pool: never replayed at once
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.graph(graph, pool=pool, stream=self.stream):
            self.losses[first] = self._forward_backward(self.tokens, self.labels, self.valid)
        main.wait_stream(self.stream)
        self.graphs[first] = graph
        written = [main for main in unwritten if main.written]  # the capture's Python side decided these writes
        if first:
            self.written, self.held = written, kept_weight_copies()
        elif written:
            raise RuntimeError(f"--cuda-graphs: {len(written)} fused gradient views got their step's first "
                               "contribution from a later micro-batch, whose graph would write them at every replay")
        torch.cuda.empty_cache()  # the eager micro-batches' cached blocks: the graphs' own pool serves from here on
