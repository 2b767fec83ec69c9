"""bench/common.py's nvidia-smi poller: what it keeps from the CSV lines nvidia-smi prints; the energy per token
bench/mfu.py derives from its power samples; the other processes on a job's GPUs."""

import pytest

from bench.common import GpuPoller


def _fed(lines: list[str]) -> dict[str, list[float]]:
    poller = GpuPoller.__new__(GpuPoller)  # no nvidia-smi process: lines are fed by hand
    poller._samples, poller._proc = {}, None
    for line in lines:
        poller.add_line(line)
    return poller.stop()


def test_clock_and_power_are_medians_over_busy_samples_and_memory_the_peak():
    seen = _fed(["0, 30000, 1980, 120.5, 3",  # start-up: idle at boost clock, not counted for clock and power
                 "0, 36000, 1755, 690.0, 100", "0, 35000, 1740, 700.0, 99", "0, 35500, 1770, 680.0, 100",
                 "1, 2048, 1980, 90.0, 0"])  # a GPU never busy: its medians come from every sample
    assert seen["used_gib"] == [36000 / 1024, 2.0]
    assert seen["sm_mhz"] == [1755.0, 1980.0]
    assert seen["power_w"] == [690.0, 90.0]


def test_lines_that_are_not_numbers_are_skipped():
    seen = _fed(["index, memory.used [MiB], clocks.sm [MHz], power.draw [W], utilization.gpu [%]",
                 "0, [N/A], 1700, 500, 100", "0, 1024", "0, 1024, 1700, 500, 100"])
    assert seen == {"used_gib": [1.0], "sm_mhz": [1700.0], "power_w": [500.0]}
    assert _fed([]) == {"used_gib": [], "sm_mhz": [], "power_w": []}


def test_energy_per_token_sums_the_gpus_power_over_the_rows_tokens_per_second():
    from bench.mfu import energy_mj_per_token
    # the engine row of bench/results/mfu_8b4l_h200_clock.json: 691.695 W at 77,010 tokens/s
    assert energy_mj_per_token({"power_w": [691.695], "tokens_per_s": 77010.0}) == pytest.approx(8.982, abs=1e-3)
    assert energy_mj_per_token({"power_w": [600.0, 700.0], "tokens_per_s": 1e5}) == pytest.approx(13.0)
    assert energy_mj_per_token({"power_w": [], "tokens_per_s": 1e5}) is None  # no nvidia-smi: no number
    assert energy_mj_per_token({"power_w": [600.0]}) is None  # a failed row has no tokens/s


# nvidia-smi's CSV as it prints it, for the case of 2026-11-27 on a 4 x H200 host: two judgings held GPUs 1 and 2 and a
# peers4 row went void beside them (docs/benchmarks.md, "Peers at their best layouts"); bench/mfu.py now refuses to
# start beside such processes.
APPS = """GPU-7b0e5e9c-1111-2222-3333-444444444444, 52117, /opt/torch/.venv/bin/python3, 27502
GPU-9c1d2e3f-5555-6666-7777-888888888888, 52120, python3, 27502
"""
GPUS = """0, GPU-0a0a0a0a-0000-0000-0000-000000000000
1, GPU-7b0e5e9c-1111-2222-3333-444444444444
2, GPU-9c1d2e3f-5555-6666-7777-888888888888
3, GPU-3d3d3d3d-3333-3333-3333-333333333333
"""


def test_the_processes_on_this_jobs_gpus_are_named_by_gpu_index():
    from bench.common import parse_compute_apps

    both = ["GPU 1: pid 52117 python3, 27502 MiB", "GPU 2: pid 52120 python3, 27502 MiB"]
    assert parse_compute_apps(APPS, GPUS) == both
    assert parse_compute_apps(APPS, GPUS, visible="0,1") == both[:1]  # CUDA_VISIBLE_DEVICES by index
    assert parse_compute_apps(APPS, GPUS, visible="GPU-9c1d2e3f-5555-6666-7777-888888888888") == both[1:]  # or by UUID
    assert parse_compute_apps(APPS, GPUS, visible="3") == []
    assert parse_compute_apps("No running processes found\n", GPUS) == []
