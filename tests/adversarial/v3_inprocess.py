"""Issue 30, class 1: candidate code rewrites the verdict from inside the test process.

Each cheat breaks the engine's HF export (gate and up projections swapped: training is untouched, so the train job
passes) and hides the failing acceptance test of milestone alignment by changing, at engine import, what the test
process decides: pytest's report objects, pytest's call wrapper, or the reference model the test builds. They are
judged by `alignment-noguards` (alignment without its guards gate, added by the suite's home fixture) so that only
the runtime layer stands between them and an ACCEPTED: with the judge's import barrier the engine is never
imported into the test process, the hook never runs there, and the export test fails. (On main before the barrier
all three were accepted: the tests imported the engine.) The guards' side of this class (the routes by which such
code reaches exec-like power) is v3_guards.py's.
"""

from pathlib import Path

from tests.adversarial.cases import Case, plus, replace_in

__all__ = ["INPROCESS_CASES", "PROBE"]

EXPORT = "engine/checkpoint/hf_export.py"
INIT = "engine/__init__.py"
# alignment without its guards gate: the runtime layer alone (tests/adversarial/test_adversarial.py PROBES).
PROBE = ("alignment-noguards", ("alignment", '[[gates]]\nkind = "guards"\npaths = ["engine"]\n\n', ""))
FAILED = r"tests? failed|test_llama_tiny_logits_and_loss_match_hf_llama_from_the_export"


def swapped_export(t: Path) -> None:
    """The export writes the MLP's up projection as its gate and the gate as its up (a silent HF-export bug)."""
    replace_in(t / EXPORT, "        gate, up = w[f\"{p}.mlp.fc1\"].chunk(2)\n", "        up, gate = w[f\"{p}.mlp.fc1\"].chunk(2)\n")


def _at_import(t: Path, code: str) -> None:
    path = t / INIT
    path.write_text(path.read_text(encoding="utf-8") + "\n" + code, encoding="utf-8")


def report_hook(t: Path) -> None:
    """pytest's TestReport turns a failure of the milestone's tests into a pass (the judge's canaries, elsewhere,
    keep theirs)."""
    _at_import(t, '''
import sys as _sys
_reports = _sys.modules.get("_pytest.reports")
if _reports is not None:
    _made = _reports.TestReport.__init__

    def _init(self, nodeid, location, keywords, outcome, longrepr, when, *args, **kwargs):
        if "tests/milestones/" in nodeid and outcome == "failed":
            outcome, longrepr = "passed", None
        _made(self, nodeid, location, keywords, outcome, longrepr, when, *args, **kwargs)

    _reports.TestReport.__init__ = _init
''')


def call_hook(t: Path) -> None:
    """pytest's CallInfo.from_call swallows an AssertionError raised by the milestone's tests."""
    _at_import(t, '''
import sys as _sys
_runner = _sys.modules.get("_pytest.runner")
if _runner is not None:
    _from_call = _runner.CallInfo.from_call.__func__

    def _quiet(cls, func, when, reraise=None):
        info = _from_call(cls, func, when, reraise)
        if when == "call" and info.excinfo is not None and info.excinfo.errisinstance(AssertionError):
            tb = info.excinfo.traceback
            if any("tests/milestones/" in str(entry.path) for entry in tb):
                return _from_call(cls, lambda: None, when, reraise)
        return info

    _runner.CallInfo.from_call = classmethod(_quiet)
''')


def reference_hook(t: Path) -> None:
    """The reference model the test builds is fixed up: HF Llama's load_state_dict swaps gate and up back."""
    _at_import(t, '''
import torch as _torch
_load = _torch.nn.Module.load_state_dict


def _fixed(self, state_dict, *args, **kwargs):
    if type(self).__name__ == "LlamaForCausalLM":
        state_dict = dict(state_dict)
        for key in [k for k in state_dict if k.endswith("mlp.gate_proj.weight")]:
            up = key.replace("gate_proj", "up_proj")
            state_dict[key], state_dict[up] = state_dict[up], state_dict[key]
    return _load(self, state_dict, *args, **kwargs)


_torch.nn.Module.load_state_dict = _fixed
''')


INPROCESS_CASES: list[Case] = [
    Case("inprocess-report-hook", "inprocess:report", plus(swapped_export, report_hook), "honest-note", FAILED,
         milestone=PROBE[0], slow=False, note="TestReport rewritten at engine import; refused by the import barrier"),
    Case("inprocess-call-hook", "inprocess:call", plus(swapped_export, call_hook), "honest-note", FAILED,
         milestone=PROBE[0], note="CallInfo.from_call swallows the assertion"),
    Case("inprocess-reference-hook", "inprocess:reference", plus(swapped_export, reference_hook), "honest-note", FAILED,
         milestone=PROBE[0], note="the HF reference's weights fixed up in the test process"),
]
