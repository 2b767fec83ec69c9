"""Versions of the gemm_output op; register.toml lists them and engine.ops.dispatch picks one."""

__all__: list[str] = []
