"""engine/ops/inductor.py CompiledKernel: dynamo's settings (a recompile limit of 64, no duck shaping) are patched
around a call only when dynamo may compile in it, i.e. the first call with inputs of that shape, stride, dtype and
device in that global state; a call like one before runs without the patch, which alone cost ~70 us of host time
a call (docs/fp8.md, "Host time of a compiled call"; timings are the bench's, never a test's). The kernels'
numbers are tested where they live (tests/ops/test_fp8_cast.py, test_gemm_fc1_compiled.py)."""

import torch
import torch._dynamo.config
from torch._dynamo.utils import counters

from engine.ops.inductor import CompiledKernel


def kernel(scale: float) -> CompiledKernel:
    return CompiledKernel(lambda x: x * scale + 1, "probe", "compiled", "tests.ops.test_inductor:kernel",
                          "use the baseline", dynamic=False)


def test_new_inputs_compile_under_the_raised_limit_and_inputs_met_before_reuse_their_graph_unpatched():
    k = kernel(3.0)
    a, b, c = (torch.arange(n, dtype=torch.float32) for n in (4, 5, 6))
    graphs = counters["stats"]["unique_graphs"]
    # dynamo's own limit at 1: the kernel's patch (64) is what lets the second and third shapes compile
    with torch._dynamo.config.patch(recompile_limit=1):
        for x in (a, b, c, a, b, c.clone(), a):
            assert torch.equal(k(x), x * 3 + 1)
    assert counters["stats"]["unique_graphs"] == graphs + 3  # a graph per shape, each built once
    # each input met once in this global state: the later calls took the unpatched path (no second record)
    assert sorted(len(states) for states in k._met.values()) == [1, 1, 1]
    with torch.no_grad():  # another global state: dynamo's guards may fail, so the patched path, recorded
        assert torch.equal(k(a), a * 3 + 1) and torch.equal(k(a), a * 3 + 1)
    assert sorted(len(states) for states in k._met.values()) == [1, 1, 2]
    assert torch.equal(k(a), a * 3 + 1) and sorted(len(states) for states in k._met.values()) == [1, 1, 2]
