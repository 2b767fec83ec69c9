"""Versions of the fp8_wgrad op (--fp8 tensorwise only); register.toml lists them and engine.ops.dispatch picks one."""

__all__: list[str] = []
