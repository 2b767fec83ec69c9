"""bench/profile_step.py: kernel families, exposed communication, and a real CPU profile into a doc section."""

import json
import subprocess
import sys

import pytest
import torch

from bench.profile_step import (STEP_MARK, exposed_ms, family, gemm_flops, gemms_by_shape, idle_gaps, insert_section,
                                markdown, step_windows, summarize_kernels)
from tests.conftest import REPO


def test_families_of_real_kernel_names():
    assert family("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT") == "GEMM"
    assert family("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "GEMM"
    assert family("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90") == "attention"
    assert family("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "communication"
    assert family("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"
    assert family("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>") == "copies/casts"
    assert family("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>") == "elementwise"
    # the engine's own CuTeDSL kernels carry their op folder in their name: gemm_fc1's SwiGLU backward is no GEMM
    own = "kernel_cutlass_kernel_engineops{}_object_at__tensorptrbf16gmemalign16o16384i64div81_TiledCopy_TilerMN"
    assert family(own.format("gemm_fc1cute_dswigluDSwiGLUConcat")) == "elementwise"
    assert family(own.format("gemm_outputcute_scaleScaleInPlace")) == "elementwise"
    assert family(own.format("rmsnormcute_rmsnormRMSNormBwd")) == "elementwise"
    assert family("kernel_cutlass_kernel_quackepiloguefrontendGemmMod_linear_act_epi_0f9ef10968") == "GEMM"


def test_exposed_communication_is_comm_time_without_compute_beside_it():
    # comm 0-10 and 20-30; compute 5-12 (another stream) and 25-26: exposed 0-5, 20-25, 26-30 = 14
    assert exposed_ms([(0, 10), (20, 30)], [(5, 12), (25, 26)]) == 14
    assert exposed_ms([(0, 10)], [(0, 4), (2, 10)]) == 0
    summary = summarize_kernels([{"name": "ncclDevKernel_AllReduce", "ts": 0.0, "dur": 4000.0},
                                 {"name": "nvjet_gemm", "ts": 1000.0, "dur": 5000.0}], steps=2)
    assert summary["exposed_comm_ms"] == 0.5 and summary["families"]["GEMM"] == 2.5 and summary["total_ms"] == 4.5


def test_exposed_communication_is_attributed_to_its_collective_and_place():
    """Which collective is exposed, and where: a reduce-scatter after the backward's last GEMM, which the optimizer
    waits for, is all exposed; an all-gather under a GEMM is not; one half under a GEMM is half exposed."""
    kernels = [{"name": "nvjet_gemm", "ts": 0.0, "dur": 10000.0},
               {"name": "ncclDevKernel_AllGather_RING_LL", "ts": 2000.0, "dur": 3000.0},  # under the GEMM
               {"name": "ncclDevKernel_ReduceScatter_Sum_f32", "ts": 8000.0, "dur": 4000.0},  # 2 ms past it
               {"name": "ncclDevKernel_ReduceScatter_Sum_f32", "ts": 12000.0, "dur": 6000.0},  # all past it
               {"name": "multi_tensor_apply_kernel", "ts": 18000.0, "dur": 1000.0}]  # the optimizer, after them
    summary = summarize_kernels(kernels, steps=1)
    assert summary["exposed_comm_ms"] == 8.0 and summary["tail_comm_ms"] == 0.0
    assert summary["exposed_by_collective"] == {"ncclDevKernel_ReduceScatter_Sum_f32": 8.0}
    assert [(p["at_ms"], p["ms"]) for p in summary["exposed_largest"]] == [(12.0, 6.0), (8.0, 2.0)]
    text = markdown("t", summary, 18.0)
    assert "Largest exposed pieces" in text and "6.00 ms at 12.0 ms" in text


def test_communication_after_a_steps_last_compute_kernel_is_the_tail_not_exposed():
    """ZeRO-1's parameter all-gathers follow the optimizer: the profile's device-wide sync at the step's end waits for
    them, the engine's loop (a compute-stream sync) runs them beside the next forward. Per step window: step 1's
    gathers after its optimizer (half of one under it) are tail; step 2's reduce-scatter before its optimizer is
    exposed."""
    kernels = [{"name": "nvjet_gemm", "ts": 0.0, "dur": 10000.0},
               {"name": "multi_tensor_apply_kernel", "ts": 10000.0, "dur": 2000.0},
               {"name": "ncclDevKernel_AllGather_RING_LL", "ts": 11000.0, "dur": 2000.0},  # 1 ms under the optimizer
               {"name": "ncclDevKernel_AllGather_RING_LL", "ts": 13000.0, "dur": 3000.0},  # all after it
               {"name": "nvjet_gemm", "ts": 20000.0, "dur": 5000.0},  # step 2
               {"name": "ncclDevKernel_ReduceScatter_Sum_f32", "ts": 25000.0, "dur": 1000.0},
               {"name": "multi_tensor_apply_kernel", "ts": 26000.0, "dur": 1000.0}]
    summary = summarize_kernels(kernels, steps=2, windows=[(0.0, 20000.0), (20000.0, float("inf"))])
    assert summary["tail_comm_ms"] == (1.0 + 3.0) / 2 and summary["exposed_comm_ms"] == 1.0 / 2
    assert summary["exposed_by_collective"] == {"ncclDevKernel_ReduceScatter_Sum_f32": 0.5}
    events = [{"ph": "X", "cat": "user_annotation", "name": STEP_MARK, "ts": t, "dur": 100.0} for t in (20.0, 0.0)]
    assert step_windows(events) == [(0.0, 20.0), (20.0, float("inf"))]
    assert "beside the next forward" in markdown("t", summary, 27.0)


def test_gemm_kernels_are_grouped_by_their_launching_op_and_shapes():
    """A kernel is tied to the innermost op that launched it by "External id"; TFLOP/s = 2 m n k x calls / time. A
    GEMM kernel outside any recorded op (a library launching it itself) is grouped under its own name."""
    assert gemm_flops("aten::mm", [[8192, 4096], [4096, 73472]]) == 2.0 * 8192 * 4096 * 73472
    assert gemm_flops("aten::addmm", [[73472, 4096], [73472, 8192], [8192, 4096], [], []]) == 2.0 * 73472 * 4096 * 8192
    assert gemm_flops("aten::bmm", [[2, 8, 16], [2, 16, 4]]) == 2.0 * 2 * 8 * 4 * 16
    assert gemm_flops("aten::mm", [[8, 16]]) is None and gemm_flops("aten::silu", [[8, 16]]) is None
    # gemm_fc1's quack version: x [b, s, h] and the [gate; up] weight [2f, h]
    assert gemm_flops("_GemmFc1", [[2, 4096, 4096], [32768, 4096]]) == 2.0 * 8192 * 32768 * 4096
    assert gemm_flops("_GemmFc1", [[8, 16], [4, 32]]) is None  # k does not match: not a product
    m, k, n = 4096, 4096, 73472
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 10.0, "args": {"External id": 7,
                                                                                   "Input Dims": [[m, k], [k, n], []]}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::silu", "dur": 5.0, "args": {"External id": 8}}]
    for step in range(2):  # two steps: one mm kernel each at 4 ms, one library GEMM at 1 ms, one elementwise kernel
        events += [{"ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_256x128", "ts": 0.0, "dur": 4000.0,
                    "args": {"External id": 7}},
                   {"ph": "X", "cat": "kernel", "name": "kernel_cutlass_kernel_quackgemm_object_at_xyz", "ts": 0.0,
                    "dur": 1000.0, "args": {}},
                   {"ph": "X", "cat": "kernel", "name": "silu_kernel", "ts": 0.0, "dur": 500.0, "args": {"External id": 8}}]
    rows = gemms_by_shape(events, steps=2)
    assert [r["op"] for r in rows] == ["aten::mm", "kernel_cutlass_kernel_quackgemm"]
    mm = rows[0]
    assert mm["shapes"] == f"[{m},{k}] x [{k},{n}]" and mm["calls"] == 1 and mm["ms"] == 4.0
    assert abs(mm["tflops"] - 2.0 * m * k * n / 4e-3 / 1e12) < 1e-9
    assert rows[1]["tflops"] is None and rows[1]["ms"] == 1.0


def test_profile_on_cpu_replaces_its_doc_section_and_an_absent_one_is_appended(tmp_path):
    """One real CPU profile into a doc whose section holds an older table (the text around it kept); a doc without
    the section gets it appended (insert_section, what the CLI writes with: no second profile needed for that)."""
    doc = tmp_path / "bench.md"
    doc.write_text("# Benchmarks\n\nkept\n\n<!-- profile:tiny -->\nstale table\n<!-- /profile:tiny -->\n\nafter\n")
    cmd = [sys.executable, "bench/profile_step.py", "--steps", "1", "--warmup", "1", "--insert", str(doc), "--section",
           "tiny", "--trace-dir", str(tmp_path / "trace"), "--", "--preset", "tiny", "--seq-length", "32",
           "--micro-batch-size", "2", "--grad-accum-steps", "2", "--device", "cpu"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nkept\n\n<!-- profile:tiny -->\n")
    assert text.endswith("<!-- /profile:tiny -->\n\nafter\n")
    assert "stale table" not in text
    assert text.count("<!-- profile:tiny -->") == 1 and text.count("<!-- /profile:tiny -->") == 1
    assert "| GEMM |" in text and "`aten::mm`" in text
    assert "| GEMM launched by |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `aten::mm` | ["))
    assert float(row.split("|")[-2]) > 0  # the CPU's achieved TFLOP/s: a number
    assert (tmp_path / "trace" / "trace_rank0.json").exists()
    other = tmp_path / "other.md"
    other.write_text("# Other\n")
    insert_section(other, "tiny", "| table |\n")
    assert other.read_text() == "# Other\n\n<!-- profile:tiny -->\n| table |\n<!-- /profile:tiny -->\n"


def test_gpu_idle_inside_a_step_is_charged_to_what_the_host_was_doing():
    """Two steps of 100 us each. Step 1: the host prepares for 12 us (an H2D copy op) before the first kernel, the
    kernels cover 12-60 and 72-95 (overlapping streams count once), 60-72 the host waits in aten::item (inside it,
    the innermost event, cudaStreamSynchronize), 95-100 is a bubble between queued kernels. Step 2: kernels the
    whole span, which the profiler's device-side copy of the step mark (longer here) must not stretch."""
    ev = [{"ph": "X", "name": STEP_MARK, "cat": "user_annotation", "ts": 0, "dur": 100},
          {"ph": "X", "name": STEP_MARK, "cat": "user_annotation", "ts": 200, "dur": 100},
          {"ph": "X", "name": STEP_MARK, "cat": "gpu_user_annotation", "ts": 150, "dur": 200},
          {"ph": "X", "name": "aten::to", "cat": "cpu_op", "ts": 0, "dur": 12},
          {"ph": "X", "name": "aten::item", "cat": "cpu_op", "ts": 58, "dur": 15},
          {"ph": "X", "name": "cudaStreamSynchronize", "cat": "cuda_runtime", "ts": 59, "dur": 13},
          {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 12, "dur": 48},
          {"ph": "X", "name": "norm", "cat": "kernel", "ts": 72, "dur": 18},
          {"ph": "X", "name": "copy", "cat": "gpu_memcpy", "ts": 80, "dur": 15},
          {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 190, "dur": 120}]  # starts before the span: clipped
    idle = idle_gaps(ev, steps=2)
    assert idle["idle_ms"] == 29 / 1e3 / 2 and idle["step_ms"] == 100 / 1e3
    assert {r["host"]: r["ms"] * 2e3 for r in idle["by_host"]} == {
        "aten::to": 12, "cudaStreamSynchronize": 12, "between queued kernels (gaps < 10 us)": 5}
    text = markdown("t", {"total_ms": 1.0, "families": dict.fromkeys(
        ("GEMM", "attention", "communication", "optimizer", "copies/casts", "elementwise"), 0.0),
        "top": [], "timeline": False, "idle": idle}, 0.1)
    assert "GPU idle inside the step: 0.015 ms of 0.1 (14.5 %)" in text and "| `aten::to` | 0.5 | 0.006 |" in text
    assert [(g["ms"] * 1e3, g["at_ms"] * 1e3, g["host"]) for g in idle["largest"]] == [
        (12, 0, "aten::to"), (12, 60, "aten::item > cudaStreamSynchronize"), (5, 95, "between queued kernels (gaps < 10 us)")]
    assert "0.012 ms at 0.1 ms (aten::item > cudaStreamSynchronize)" in text
    assert idle_gaps([e for e in ev if e["name"] != STEP_MARK], steps=2) == {}  # no marked step: nothing to say


def test_a_peers_step_is_profiled_into_the_engines_summary(tmp_path):
    """bench/peers/run.py --profile-json: the peer's profiled step in profile_step's summary (one mechanism for both)."""
    from bench.peers.run import main as run_peer

    out, prof = tmp_path / "peer.json", tmp_path / "profile.json"
    code = run_peer(["--peer", "torch-compile", "--variant", "bf16", "--layout", "compile=off", "--device", "cpu", "--steps", "1",
                     "--warmup", "0", "--out", str(out), "--profile-json", str(prof), "--profile-steps", "2", "--",
                     "--preset", "tiny", "--seq-length", "32", "--micro-batch-size", "2", "--grad-accum-steps", "2",
                     "--device", "cpu"])
    assert code == 0, json.loads(out.read_text()).get("traceback")
    summary = json.loads(prof.read_text())
    assert summary["title"].startswith("cpu, torch-compile bf16") and len(summary["step_s"]) == 2
    assert summary["families"]["GEMM"] > 0 and summary["families"]["optimizer"] > 0
    assert sum(summary["families"].values()) == pytest.approx(summary["total_ms"])
    assert not any(k["name"] == "temper_profiled_step" for k in summary["top"])  # the step's own mark is no kernel


def test_the_summarised_rank_is_the_one_asked_for_and_a_rank_the_launch_lacks_is_refused(tmp_path):
    """--rank R: only rank R writes and summarises its trace (a rank waiting in its collectives waits for another, so
    the slow rank's own trace is the one to read); outside torchrun this process is rank 0, so asking for rank 1
    gets no summary and no trace, and the CLI refuses a rank the launch has not (exit 2, before any model is built)."""
    from bench.profile_step import profile_steps

    summary, times, trace = profile_steps(lambda: torch.ones(8) @ torch.ones(8), 1, torch.device("cpu"),
                                          str(tmp_path / "r1"), rank=1)
    assert (summary, trace) == ({}, None) and len(times) == 1 and not (tmp_path / "r1").exists()
    summary, _, trace = profile_steps(lambda: torch.ones(8) @ torch.ones(8), 1, torch.device("cpu"),
                                      str(tmp_path / "r0"), rank=0)
    assert trace == tmp_path / "r0" / "trace_rank0.json" and trace.exists() and summary["families"]
    proc = subprocess.run([sys.executable, "bench/profile_step.py", "--rank", "1", "--", "--preset", "tiny",
                           "--device", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--rank 1: this launch has ranks 0..0" in proc.stderr
