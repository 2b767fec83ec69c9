"""What judging one attempt produced: a result per gate, and the verdict over all of them.

The gate runner builds these; records store them as `attempts/<n>/verdict.json`; the gate-failure
prompt and the report read them. Plain frozen dataclasses so every layer can share them without
importing the runner.
"""

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["GateResult", "Verdict"]


@dataclass(frozen=True)
class GateResult:
    """The outcome of one gate.

    `violations` are the first problems found (changed protected files, guard findings, failed metric
    rules as 'mfu of train = 0.41, needs >= 0.55'); `failing_tests` are pytest node ids; `metrics` are
    the values the judge computed (e.g. {"train.mfu": 0.41}); `skipped` gates never ran because an
    earlier gate failed.
    """

    name: str
    kind: str
    passed: bool
    summary: str = ""
    violations: tuple[str, ...] = ()
    failing_tests: tuple[str, ...] = ()
    log_tail: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0
    skipped: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> "GateResult":
        return GateResult(
            name=data["name"],
            kind=data["kind"],
            passed=bool(data["passed"]),
            summary=data.get("summary", ""),
            violations=tuple(data.get("violations", ())),
            failing_tests=tuple(data.get("failing_tests", ())),
            log_tail=data.get("log_tail", ""),
            metrics=dict(data.get("metrics", {})),
            duration_s=float(data.get("duration_s", 0.0)),
            skipped=bool(data.get("skipped", False)),
        )


@dataclass(frozen=True)
class Verdict:
    """All gates of one attempt. Accepted only when every gate ran and passed.

    `flags` are implausibility warnings (MFU above the GEMM ceiling, a 10x speed-up) that a human
    should look at even when the attempt passed.
    """

    attempt: int
    accepted: bool
    gates: tuple[GateResult, ...]
    commit: str = ""
    reason: str = ""
    flags: tuple[str, ...] = ()
    seed: int = 0  # the judge's secret for this judging (TEMPER_JUDGE_SEED for tests; `temper gate --judge-seed`)
    draw: dict[str, Any] = field(default_factory=dict)  # what it drew from it (harness/judge/draws.py; `--draw`)

    @property
    def failed_gate(self) -> GateResult | None:
        return next((g for g in self.gates if not g.passed and not g.skipped), None)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        failed = self.failed_gate
        data["failed_gate"] = failed.name if failed else None
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> "Verdict":
        return Verdict(
            attempt=int(data["attempt"]),
            accepted=bool(data["accepted"]),
            gates=tuple(GateResult.from_json(g) for g in data.get("gates", ())),
            commit=data.get("commit", ""),
            reason=data.get("reason", ""),
            flags=tuple(data.get("flags", ())),
            seed=int(data.get("seed", 0)),
            draw=dict(data.get("draw", {})),
        )
