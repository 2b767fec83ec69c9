"""The engine's side of the op tests (tests/ops/test_ops_<op>.py): runs in the candidate's process
(harness.judge.candidate), never in the test's. It calls an engine function on the tensors the test sent, runs the
backward with the upstream gradients the test drew, and hands back outputs and gradients; the test computes its
reference and asserts."""

import importlib
from typing import Any

import torch

__all__ = ["value", "call", "calls", "saved_numels"]


def _resolve(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def value(target: str) -> Any:
    """`module:name`: a constant of the engine's (the test asserts what it depends on)."""
    return _resolve(target)


def _outputs(result: Any) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def call(target: str, args: list, kwargs: dict | None = None, *, requires_grad: tuple = (),
         grad: list | None = None) -> dict:
    """`target(*args, **kwargs)`. The tensors named in `requires_grad` (a position "0", "1", ... or a keyword) are
    leaves that require grad. With `grad` (one upstream gradient per output, None for an output left unused), the
    backward runs. Returns {"out": [outputs], "grad": {name: the leaf's gradient or None}}."""
    args, kwargs = list(args), dict(kwargs or {})
    leaves = {}
    for name in requires_grad:
        holder, key = (args, int(name)) if name.isdigit() else (kwargs, name)
        holder[key] = leaves[name] = holder[key].detach().clone().requires_grad_()
    outs = _outputs(_resolve(target)(*args, **kwargs))
    if grad is not None:
        used = [(o, g) for o, g in zip(outs, grad, strict=True) if g is not None]
        torch.autograd.backward([o for o, _ in used], [g for _, g in used])
    return {"out": [o.detach() for o in outs], "grad": {name: leaf.grad for name, leaf in leaves.items()}}


def calls(target: str, arg_sets: list, kwargs: dict | None = None) -> list:
    """`target(*args, **kwargs)` under torch.no_grad for each `args` of `arg_sets`: the outputs of each (a test's
    finite differences)."""
    with torch.no_grad():
        return [_outputs(_resolve(target)(*args, **(kwargs or {}))) for args in arg_sets]


def saved_numels(target: str, args: list, kwargs: dict, requires_grad: tuple) -> list:
    """The number of elements of every tensor autograd saves for the backward of `target(*args, **kwargs)` (summed
    output, then backward run)."""
    args = list(args)
    for name in requires_grad:
        args[int(name)] = args[int(name)].detach().clone().requires_grad_()
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = _resolve(target)(*args, **kwargs)
    out.backward()
    return saved
