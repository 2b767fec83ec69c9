"""Versions of the gemm_fc1 op; register.toml lists them and engine.ops.dispatch picks one."""

__all__: list[str] = []
