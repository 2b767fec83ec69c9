"""The rules, by stable id. Each module holds one rule; `RULES` is the only registry."""

from guards.rules.base import Rule
from guards.rules.dag import DagRule
from guards.rules.exec_routes import ExecRouteRule
from guards.rules.fail_fast import FailFastRule
from guards.rules.isolation import IsolationRule
from guards.rules.public_surface import PublicSurfaceRule
from guards.rules.recognition import RecognitionRule
from guards.rules.ssot import SsotRule

__all__ = ["RULES", "Rule"]

RULES: dict[str, type[Rule]] = {rule.id: rule for rule in (SsotRule, DagRule, PublicSurfaceRule, FailFastRule,
                                                               IsolationRule, ExecRouteRule, RecognitionRule)}
