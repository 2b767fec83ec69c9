"""The judge: parses what a job printed and recomputes what it claims (MFU). Lives outside every
path a milestone lets the agent edit, and never imports the engine (it reads logs and config.json)."""

__all__: list[str] = []
