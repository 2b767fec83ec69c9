"""Versions of the rope op; register.toml lists them and engine.ops.dispatch picks one."""

__all__: list[str] = []
