"""`python -m tests.engine.fp8_always_add ARGV`: `python -m engine ARGV` with every FP8 weight gradient added into the
fp32 gradient buffer, never written (the engine before a step's first micro-batch wrote its product into the zeroed
buffer, engine/distributed/wgrad.py MainGrad): the reference that write is held to, bit for bit.

How: a MainGrad never knows its buffer holds zeros (`zeroed` does nothing, and it starts not knowing)."""

import sys

from engine.distributed.wgrad import MainGrad

__all__ = ["always_add"]


def always_add() -> None:
    init = MainGrad.__init__

    def unknowing(self, grad):
        init(self, grad)
        self._zero = False

    MainGrad.__init__ = unknowing
    MainGrad.zeroed = lambda self: None


if __name__ == "__main__":
    from engine.cli import main

    always_add()
    sys.exit(main(sys.argv[1:]))
