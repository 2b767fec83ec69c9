"""Versions of the fp8_cast op (--fp8 only); register.toml lists them and engine.ops.dispatch picks one."""

__all__: list[str] = []
