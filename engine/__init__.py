"""Temper's pretraining engine for MiniCPM4-style decoders.

Importing the package touches nothing but the standard library: submodules import torch, and
kernel libraries, datasets and tokenizers load lazily where they are used.
"""

__all__: list[str] = []
