"""Process checks for tests, read straight from /proc (independent of the harness's own process runner)."""

from pathlib import Path

__all__ = ["alive"]


def alive(pid: int) -> bool:
    """True when `pid` runs and is not a zombie (orphans here may never be reaped by pid 1)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"
