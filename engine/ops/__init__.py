"""Hot ops of the engine and the dispatcher that picks a version of each (see dispatch.py).

Op contracts and how to add a version: engine/ops/README.md.
"""

from engine.ops.dispatch import (
    DEVICES,
    FP8_OPS,
    OP_NAMES,
    OPS_ROOT,
    KernelVersion,
    OpSet,
    Register,
    load_op,
    load_register,
    register_path,
    resolve_ops,
    resolve_version,
)

__all__ = [
    "OP_NAMES",
    "FP8_OPS",
    "DEVICES",
    "OPS_ROOT",
    "KernelVersion",
    "Register",
    "OpSet",
    "register_path",
    "load_register",
    "resolve_version",
    "load_op",
    "resolve_ops",
]
