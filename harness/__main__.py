"""`python -m harness ...` is the same as the `temper` console script."""

import sys

from harness.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
