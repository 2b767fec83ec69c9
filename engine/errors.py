"""User-facing errors of the engine.

`ConfigError` is for bad input a user can fix: it names the field, the value and the fix, prints as
one line, and the CLI exits 2 before writing anything. Internal invariants use `assert` instead.
"""

__all__ = ["ConfigError", "KernelRegistryError", "KernelLoadError", "TrainingDiverged", "EXIT_USAGE", "EXIT_DIVERGED"]

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


class KernelRegistryError(ConfigError):
    """An `engine/ops/<op>/register.toml` is malformed. Names the file, the key and the fix.

    A ConfigError so the CLI treats it like any bad input: one line, exit 2, nothing written.
    """

    def __init__(self, path: str, key: str, problem: str, fix: str):
        self.path = path
        self.key = key
        self.problem = problem
        self.fix = fix
        self.field = f"{path}: {key}"
        self.value = None
        ValueError.__init__(self, f"{path}: [{key}] {problem}: {fix}")


class KernelLoadError(ConfigError):
    """A kernel version that was resolved for a run failed to import. Never answered by a fallback.

    Names the op, the version, its entry and the underlying error (also chained as __cause__).
    """

    def __init__(self, op: str, version: str, entry: str, cause: str, fix: str):
        self.op = op
        self.version = version
        self.entry = entry
        self.cause = cause
        self.fix = fix
        self.field = f"op {op}"
        self.value = version
        ValueError.__init__(self, f"op {op!r} version {version!r} ({entry}) failed to load: {cause}: {fix}")


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became NaN/Inf; the message carries the step and the worst layers."""
