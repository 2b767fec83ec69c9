"""`python -m tests.engine.fp8_recast ARGV`: `python -m engine ARGV` on the path where tensorwise FP8 casts every
backward operand again from the bf16 tensors (the engine before its linears kept the forward's FP8 copies,
docs/fp8.md): the reference the kept copies are held to, bit for bit.

How: `keeps_fp8` (engine/distributed/fp8.py) answers False in every module that asks it, so a tensorwise linear
saves x and W in bf16 and its backward casts dy, W^T, dy^T and x^T each, as rowwise does. `recasting()` does the
same inside a process (the TP workers, tests/parallel/workers.py)."""

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["recasting", "MODULES"]

MODULES = ("engine.distributed.fp8", "engine.distributed.wgrad", "engine.distributed.tp_linear")


def _never(recipe: str) -> bool:
    return False


@contextmanager
def recasting() -> Iterator[None]:
    modules = [importlib.import_module(name) for name in MODULES]
    kept = [m.keeps_fp8 for m in modules]
    for m in modules:
        m.keeps_fp8 = _never
    try:
        yield
    finally:
        for m, fn in zip(modules, kept):
            m.keeps_fp8 = fn


if __name__ == "__main__":
    from engine.cli import main

    with recasting():
        code = main(sys.argv[1:])
    sys.exit(code)
