"""`python -m tests.engine.always_add ARGV`: `python -m engine ARGV` as it ran before a step's first contribution to
each fused gradient wrote it (engine/distributed/wgrad.py MainGrad): FlatBuffers.zero_grads clears the whole fp32
gradient buffer every step and every contribution adds onto it. The reference that first write is held to (bit for
bit on CPU, where a GEMM writing its product and one adding it onto zeros round alike) and its A/B on the GPU.

How: the buffers clear themselves every step (lazy_zero off), and every MainGrad treats its view as already written to
this step (nothing is fresh), so every contribution adds."""

import sys

from engine.distributed.wgrad import MainGrad
from engine.optim.buffers import FlatBuffers

__all__ = ["always_add"]


def always_add() -> None:
    init, buffers_init = MainGrad.__init__, FlatBuffers.__init__

    def adding(self, grad):
        init(self, grad)
        self._fresh = False

    def reset(self, zeroed: bool) -> None:
        assert zeroed, "always_add: the buffer must have been cleared"
        self._fresh = self._stale = False

    def clearing(self, *args, **kwargs):
        buffers_init(self, *args, **{**kwargs, "lazy_zero": False})

    MainGrad.__init__, MainGrad.reset, FlatBuffers.__init__ = adding, reset, clearing


if __name__ == "__main__":
    from engine.cli import main

    always_add()
    sys.exit(main(sys.argv[1:]))
