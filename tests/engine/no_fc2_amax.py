"""`python -m tests.engine.no_fc2_amax ARGV`: `python -m engine ARGV` with FC2's FP8 input cast reducing h itself, as
before gemm_fc1 handed out its output's amax (engine/model/layers.py MLP._fc1): the op is not asked for it, so its
kernel takes none. The GPU A/B's other arm (`bench/mfu.py --variant NAME@tests.engine.no_fc2_amax=FLAGS`; the same
bits as the engine's run: tests/engine/test_fp8_fc2_amax.py)."""

import sys

from engine.distributed.wgrad import main_grad_of
from engine.model.layers import MLP

__all__ = ["no_fc2_amax"]


def no_fc2_amax() -> None:
    def fc1(self, x):
        kw = {"fp8": self.tp.fp8} if self.tp.fp8 != "off" else {}
        return self.ops.gemm_fc1(x, self.fc1, main_grad=main_grad_of(self.fc1), **kw), None

    MLP._fc1 = fc1


if __name__ == "__main__":
    from engine.cli import main

    no_fc2_amax()
    sys.exit(main(sys.argv[1:]))
