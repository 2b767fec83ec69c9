"""`python -m engine ...` (also what torchrun runs with `-m engine pretrain`)."""

import sys

from engine.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
