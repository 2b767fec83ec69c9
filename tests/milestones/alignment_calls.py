"""The engine's side of tests/milestones/test_alignment.py: runs in the candidate's process (harness.judge.candidate),
never in the test's. Each function builds the engine's model for a preset on CPU in fp32 and hands back data."""

import torch

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.checkpoint.hf_export import llama_config, to_llama_state_dict
from engine.model import build_model
from engine.ops import resolve_ops

__all__ = ["parameter_shapes", "forward"]

CPU = torch.device("cpu")


def _model(preset: str, seq: int):
    cfg = resolve(build_config({"preset": preset, "seq_length": seq, "device": "cpu", "compute_dtype": "fp32"}))
    return cfg, build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)


def parameter_shapes(preset: str, seq: int) -> dict:
    """{parameter name: shape} of the engine's model: the test draws the weights itself."""
    _, model = _model(preset, seq)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def forward(preset: str, seq: int, weights: dict, tokens: torch.Tensor, labels: torch.Tensor) -> dict:
    """The model with exactly `weights` (every parameter, by name): its logits and summed loss on the batch, and
    the engine's HF export of those weights (state dict and config)."""
    cfg, model = _model(preset, seq)
    params = dict(model.named_parameters())
    if set(params) != set(weights):
        raise KeyError(f"weights for {sorted(set(weights) ^ set(params))} do not match the model's parameters")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])
        model.eval()
        logits = model.logits(tokens)
        loss = model(tokens, labels)
    return {"logits": logits, "loss": float(loss.item()), "export": to_llama_state_dict(cfg, dict(weights)),
            "llama_config": llama_config(cfg, "float32")}
