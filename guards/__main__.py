"""`python -m guards check [PATH ...]`."""

import sys

from guards.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
