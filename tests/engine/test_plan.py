"""`python -m engine plan` (engine/plan.py) against what was measured, and its refusals.

The memory model is held against torch's peak allocated memory of every layout measured on 4 x H200
(bench/results/mfu_8b_4gpu_fsdp_h200x4.json: MiniCPM4-8B, mbs 2, seq 4096, global batch 16), and of the 80 GB pick at
global batch 32 (bench/results/mfu_8b_4gpu_production4_h200x4.json): within 10 % each (the issue's bound; observed
<= 6 %, the selective TP 2 rows highest). Its pick on that hardware must be the layout the
benchmark found fastest. A plan that cannot fit is one line, exit 2.
"""

import json

import pytest

from engine.cli import main
from engine.plan import plan
from tests.engine.helpers import REPO

RESULTS = REPO / "bench" / "results" / "mfu_8b_4gpu_fsdp_h200x4.json"
# production-4gpu's train job (milestones/production-4gpu.toml), 30 steps at global batch 32 on 4 x H200
PRODUCTION4 = REPO / "bench" / "results" / "mfu_8b_4gpu_production4_h200x4.json"


def _measured() -> list[dict]:
    return [r for r in json.loads(RESULTS.read_text())["results"] if "error" not in r]


def _layout_of(run: dict) -> tuple[int, str, str]:
    flags = run["cmd"]
    tp = int(flags[flags.index("--tp") + 1]) if "--tp" in flags else 1
    recompute = flags[flags.index("--activation-checkpointing") + 1] if "--activation-checkpointing" in flags else "none"
    return tp, "fsdp" if "--fsdp" in flags else "zero1", recompute


@pytest.fixture(scope="module")
def h200x4():
    return plan("minicpm4-8b", 4, 141.0, seq_length=4096, global_batch=16)


def test_predicted_peaks_are_within_ten_percent_of_the_measured_ones(h200x4):
    runs = _measured()
    assert len(runs) == 8
    for run in runs:
        tp, mode, recompute = _layout_of(run)
        (row,) = [x for x in h200x4 if (x.tp, x.mode, x.mbs, x.recompute) == (tp, mode, 2, recompute)]
        measured = run["peak_alloc_gib_rank0"]
        assert abs(row.peak_gib - measured) / measured < 0.10, (run["name"], row.peak_gib, measured)


def test_the_pick_is_what_the_benchmark_found_fastest(h200x4):
    fastest = max(_measured(), key=lambda r: r["mfu"])
    best = next(x for x in h200x4 if x.fits)
    tp, mode, recompute = _layout_of(fastest)
    assert (best.tp, best.mode, best.recompute, best.mbs) == (tp, mode, recompute, 2)


def test_the_80gb_pick_peaked_within_ten_percent_of_its_prediction_at_production_cadence():
    """The pick for an 80 GB card at global batch 32 (GAS 8): the model predicts the peak of batch 16 (activations
    are per micro-batch, the gradient buffer per step), and the 30-step run measured it within 10 %."""
    (run,) = json.loads(PRODUCTION4.read_text())["results"]
    best = next(x for x in plan("minicpm4-8b", 4, 80.0, seq_length=4096, global_batch=32) if x.fits)
    assert _layout_of(run) == (best.tp, best.mode, best.recompute) and best.mbs == 2 and best.gas == 8
    measured = run["peak_alloc_gib_rank0"]
    assert abs(best.peak_gib - measured) / measured < 0.10, (best.peak_gib, measured)


def test_every_fitting_layout_has_the_headroom_and_the_rest_do_not(h200x4):
    assert any(not x.fits for x in h200x4)
    for x in h200x4:
        assert x.fits == (x.peak_gib <= 0.95 * 141.0), x
        assert x.tp * x.dp == 4 and x.mbs * x.gas * x.dp == 16, x


def test_json_names_the_fastest(capsys):
    assert main(["plan", "--preset", "minicpm4-8b", "--gpus", "4", "--gpu-mem-gib", "80", "--seq-length", "4096",
                 "--global-batch", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fastest"]["fits"] and out["fastest"] == next(x for x in out["layouts"] if x["fits"])


def test_a_plan_that_cannot_fit_is_one_line_exit_2(capsys):
    assert main(["plan", "--preset", "minicpm4-8b", "--gpus", "1", "--gpu-mem-gib", "80", "--seq-length", "4096",
                 "--global-batch", "16"]) == 2
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if x.strip()]
    assert captured.out == "" and len(lines) == 1
    assert "--gpu-mem-gib=80.0 fits no layout of minicpm4-8b on 1 GPU(s)" in lines[0] and "use more GPUs" in lines[0]
