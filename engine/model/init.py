"""Deterministic, layout-independent initialisation.

Each logical weight (e.g. `layers.3.attn.wq`) is drawn in full from its own generator, seeded by a
hash of (seed, name), and each rank copies out its shard. The numbers therefore depend on the seed
and the name only: not on TP size, rank, parameter order or how many weights came before.
Draws happen on the target device (CPU and CUDA generators give different streams; a run is
reproducible on the same device type).

Standard deviations (MiniCPM / muP when cfg.mup, GPT-2 / Megatron otherwise):
- embeddings: init_std
- matrices: init_std / sqrt(hidden / dim_model_base) with muP (width-scaled), init_std without
- residual outputs (O, FC2): as matrices, and additionally / sqrt(2 * num_layers) without muP
  (with muP the forward pass already scales residual branches by scale_depth / sqrt(num_layers))
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
