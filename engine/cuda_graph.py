"""--cuda-graphs: a micro-batch's forward and backward captured once as a CUDA graph and replayed.

Eager, a micro-batch is several hundred kernel launches from Python (engine/train.py `train_step`: the model's
forward, then backward of loss / valid into the fp32 gradient buffer). Here the same forward and backward are
captured once as one CUDA graph and every later micro-batch is one replay, so the GPU never waits on the host
between the micro-batch's kernels (the issue's lever for the glue between the ops; bench/train_mfu.py measures it on
and off, docs/benchmarks.md). Capture records what the Python side decided once (which hooks add what, the
fused-gradient flags of engine/distributed/wgrad.py), so a graph is right only while every micro-batch would
decide the same and touch the same memory:
- the tokens, labels and global token count are copied into static buffers before each replay and the loss is
  read from a static tensor; weights and gradient buffers keep their storage for the whole run (the optimizer,
  a resume and evaluation write them in place);
- one process (TP 1, DP 1): the TP collectives and the last micro-batch's DP bucket launches are Python-side
  decisions per micro-batch, and --document-mask changes its layout per batch; engine/config.py refuses those,
  and engine/train.py `resolve_device` a device other than CUDA.
The first micro-batch runs eagerly on the capture stream (torch's recipe: lazy initialisation such as kernel
compilation and cuBLAS's workspace happens outside the capture), the second is captured and then replayed like
every later one. A replay runs the captured kernels on the same data, so a run computes the same bits with and
without graphs (tests/engine/test_cuda_graphs.py).
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
