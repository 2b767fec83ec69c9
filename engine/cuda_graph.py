"""--cuda-graphs: a micro-batch's forward and backward captured once as a CUDA graph and replayed.

Why and how: docs/engine/training.md, section `engine/cuda_graph.py`.
"""

import torch
from torch import nn

__all__ = ["MicroBatchGraph"]


class MicroBatchGraph:
    def __init__(self, model: nn.Module):
        self.model = model
        self.graph: torch.cuda.CUDAGraph | None = None
        self.stream: torch.cuda.Stream | None = None

    def _forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        loss = self.model(inputs, labels)
        (loss / valid).backward()
        return loss.detach()

    def __call__(self, inputs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one micro-batch (gradients added into the fp32 buffer); returns its summed loss."""
        if self.stream is None:
            return self._warm_up(inputs, labels, valid)
        if self.graph is None:
            self._capture(inputs, labels, valid)
        if inputs.shape != self.tokens.shape:
            raise RuntimeError(f"--cuda-graphs replays the captured micro-batch of shape {tuple(self.tokens.shape)}, "
                               f"and this one is {tuple(inputs.shape)}: every micro-batch must have one shape")
        self.tokens.copy_(inputs)
        self.labels.copy_(labels)
        self.valid.copy_(valid)
        self.graph.replay()
        return self.loss.clone()

    def _warm_up(self, inputs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        main = torch.cuda.current_stream()
        self.stream = torch.cuda.Stream(device=main.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            loss = self._forward_backward(inputs, labels, valid)
        main.wait_stream(self.stream)
        loss.record_stream(main)
        return loss

    def _capture(self, inputs: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> None:
        self.tokens, self.labels, self.valid = inputs.clone(), labels.clone(), valid.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            self.loss = self._forward_backward(self.tokens, self.labels, self.valid)
        self.graph = graph
        torch.cuda.empty_cache()  # the eager micro-batch's cached blocks: the graph's own pool serves from here on
