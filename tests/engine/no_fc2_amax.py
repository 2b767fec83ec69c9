"""`python -m tests.engine.no_fc2_amax ARGV`: `python -m engine ARGV` with FC2's FP8 input cast reducing h itself, as
before gemm_fc1 handed out its output's amax (engine/model/layers.py MLP._fc1): the op is not asked for it, so its
kernel takes none. The reference tests/engine/test_fp8_fc2_amax.py holds the engine to (the same bits), and the GPU
A/B's other arm (`bench/mfu.py --variant NAME@tests.engine.no_fc2_amax=FLAGS`)."""

import sys

from engine.distributed.wgrad import main_grad_of
from engine.model.layers import MLP

__all__ = ["fc1_without_amax", "no_fc2_amax"]


def fc1_without_amax(self: MLP, x):
    """MLP._fc1 asking gemm_fc1 for no amax: (h, None)."""
    kw = {"fp8": self.tp.fp8} if self.tp.fp8 != "off" else {}
    return self.ops.gemm_fc1(x, self.fc1, main_grad=main_grad_of(self.fc1), **kw), None


def no_fc2_amax() -> None:
    MLP._fc1 = fc1_without_amax


if __name__ == "__main__":
    from engine.cli import main

    no_fc2_amax()
    sys.exit(main(sys.argv[1:]))
