"""User-facing errors of the engine.

`ConfigError` is for bad input a user can fix: it names the field, the value and the fix, prints as
one line, and the CLI exits 2 before writing anything. Internal invariants use `assert` instead.
"""

__all__ = ["ConfigError", "TrainingDiverged", "EXIT_USAGE", "EXIT_DIVERGED"]

EXIT_USAGE = 2  # bad flags, config, data, tokenizer or checkpoint
EXIT_DIVERGED = 3  # NaN/Inf loss or gradient norm


class ConfigError(ValueError):
    """Bad user input. Message: what is wrong with which field, and how to fix it."""

    def __init__(self, field: str, value: object, fix: str, problem: str = ""):
        self.field = field
        self.value = value
        self.fix = fix
        what = problem or "is invalid"
        super().__init__(f"{field}={value!r} {what}: {fix}")


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became NaN/Inf; the message carries the step and the worst layers."""
