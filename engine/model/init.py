"""Deterministic, layout-independent initialisation.

Why and how: docs/engine/model.md, section `engine/model/init.py`.
"""

import hashlib
import math

import torch

from engine.config import EngineConfig

__all__ = ["Initializer", "name_seed"]


def name_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class Initializer:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.seed = cfg.seed
        self.device = device
        self.embedding_std = cfg.init_std
        width_mult = cfg.hidden_size / cfg.dim_model_base
        self.matrix_std = cfg.init_std / math.sqrt(width_mult) if cfg.mup else cfg.init_std
        self.residual_std = self.matrix_std if cfg.mup else self.matrix_std / math.sqrt(2 * cfg.num_layers)

    def normal(self, name: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(name_seed(self.seed, name))
        return torch.empty(shape, device=self.device, dtype=torch.float32).normal_(0.0, std, generator=gen)

    def embedding(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return self.normal(name, shape, self.embedding_std)

    def matrix(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return self.normal(name, shape, self.matrix_std)

    def residual_out(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return self.normal(name, shape, self.residual_std)
