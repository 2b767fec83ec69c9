"""bench/step_gemms.py replays the 8B slice's GEMMs outside the step: its list must be the step's list."""

import json
from collections import Counter
from pathlib import Path

from bench.step_gemms import match_profile, problems, step_order

PROFILE = Path(__file__).resolve().parents[2] / "bench" / "results" / "profile_8b4l_h200.json"
GAS = 8  # the profiled run's --grad-accum-steps (its title)


def test_the_replayed_micro_batch_launches_what_the_profiled_step_launched():
    """Every GEMM row of a real profile (H200, 4-layer 8B slice) is one of the replayed GEMMs, with the shapes and
    the number of calls per micro-batch the replay uses: a change to the engine's GEMMs (a new split, a fused
    weight) shows here as a row the replay does not mirror."""
    profile = json.loads(PROFILE.read_text())
    assert f"--grad-accum-steps {GAS}" in profile["title"]
    counts = Counter(step_order())
    matched = match_profile(profile["gemms"])
    assert set(matched) == set(problems()) - {"fc1.fwd"}  # fc1.fwd is the gated quack GEMM: no aten shapes
    for name, row in matched.items():
        same_shape = [n for n, r in matched.items() if r is row]  # o.fwd and o.dx: one row, the same shapes
        assert row["calls"] == GAS * sum(counts[n] for n in same_shape), name
    unmatched = [r for r in profile["gemms"] if all(r is not m for m in matched.values())]
    assert [r["op"] for r in unmatched] == ["_GemmFc1"] and unmatched[0]["calls"] == GAS * counts["fc1.fwd"]

