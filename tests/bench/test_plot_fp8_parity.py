"""bench/plot_fp8_parity.py: the packed runs keep every step and evaluation, and the relative val losses are taken
against the first run at the steps both evaluated (the numbers docs/fp8.md's parity table is read from)."""

import json

import pytest

from bench.plot_fp8_parity import main, pack, relative_val


def _metrics(path, losses, evals):
    lines = [{"kind": "loss", "step": s, "global_loss": x, "time_s": 0.1 + s / 1000} for s, x in enumerate(losses, 1)]
    lines += [{"kind": "eval", "step": s, "val_loss": v, "val_bpb": v / 3} for s, v in evals]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return path


def test_pack_and_relative_val_against_the_first_run(tmp_path):
    ref = _metrics(tmp_path / "a.jsonl", [5.0] * 30, [(0, 11.0), (10, 4.0), (20, 5.0)])
    fp8 = _metrics(tmp_path / "b.jsonl", [5.1] * 25, [(0, 11.0), (10, 4.04), (20, 4.9)])  # stopped before 30
    runs = pack([f"bf16={ref}", f"fp8={fp8}"])
    assert list(runs) == ["bf16", "fp8"] and len(runs["fp8"]["loss"]) == 25
    assert runs["bf16"]["eval"][1] == [10, 4.0, 4.0 / 3]
    # median of time_s over steps 11.. (warm-up left out): steps 11..30 -> 0.1 + 20.5 / 1000
    assert runs["bf16"]["median_step_s"] == pytest.approx(0.1205)
    rel = relative_val(runs)
    assert list(rel) == ["fp8"]  # step 0 (the untrained model) is left out
    assert rel["fp8"] == [(10, pytest.approx(0.01)), (20, pytest.approx(-0.02))]


def test_runs_and_from_json_are_exclusive_and_a_bare_path_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="either"):
        main(["--png", str(tmp_path / "x.png")])
    with pytest.raises(SystemExit, match="NAME=path"):
        pack([str(tmp_path / "a.jsonl")])
