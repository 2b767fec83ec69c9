"""`python -m tests.engine.no_read_ahead ARGV`: `python -m engine ARGV` as it ran before a step read the next step's
batches ahead (engine/train.py Trainer._read_ahead): each step reads its own at its start. The reference the read-ahead
is held to (the same batches, the same bits: tests/engine/test_read_ahead.py) and its A/B on the GPU
(`bench/mfu.py --variant NAME@tests.engine.no_read_ahead=FLAGS`)."""

import sys

from engine.train import Trainer

__all__ = ["no_read_ahead"]


def no_read_ahead() -> None:
    Trainer._read_ahead = lambda self: None


if __name__ == "__main__":
    from engine.cli import main

    no_read_ahead()
    sys.exit(main(sys.argv[1:]))
