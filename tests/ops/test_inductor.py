"""engine/ops/inductor.py CompiledKernel: a graph compiled once per input layout (shape, strides, offset, dtype,
device, the deterministic flag), then inductor's code called directly, without dynamo (whose call cost ~100 us of
host time: docs/fp8.md, "Host time of a compiled call"; timings are the bench's, never a test's). The kernels'
numbers are tested where they live (tests/ops/test_fp8_cast.py, test_gemm_fc1_compiled.py)."""

import pytest
import torch
import torch._inductor

from engine.errors import KernelLoadError
from engine.ops.inductor import CompiledKernel, layout


def kernel(fn) -> CompiledKernel:
    return CompiledKernel(fn, "probe", "compiled", "tests.ops.test_inductor:kernel", "use the baseline")


@pytest.fixture
def compiles(monkeypatch):
    """How many graphs inductor compiled (torch._inductor.compile, counted)."""
    count = []
    real = torch._inductor.compile
    monkeypatch.setattr(torch._inductor, "compile", lambda *a, **k: count.append(1) or real(*a, **k))
    return count


def test_a_graph_per_layout_compiled_once_and_called_without_dynamo(compiles):
    k = kernel(lambda x: x * 3 + 1)
    a, b = torch.arange(4, dtype=torch.float32), torch.arange(5, dtype=torch.float32)
    wide = torch.arange(8, dtype=torch.float32)[::2]  # a's shape, another stride
    frames = torch._dynamo.utils.counters["stats"]["calls_captured"]
    for x in (a, b, wide, a.clone(), b + 1, a):
        assert torch.equal(k(x), x * 3 + 1)
    assert len(compiles) == 3 and len(k._compiled) == 3  # a, b, wide: each compiled once, met again after
    assert torch._dynamo.utils.counters["stats"]["calls_captured"] == frames  # dynamo never ran
    with torch.no_grad():  # grad mode is not part of a layout: the inputs are detached, the graph has no autograd
        assert torch.equal(k(a), a * 3 + 1)
    assert len(compiles) == 3
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not before)
    try:  # inductor reads the flag when it compiles: another layout
        assert torch.equal(k(a), a * 3 + 1) and len(compiles) == 4
    finally:
        torch.use_deterministic_algorithms(before)
    assert layout((a,)) != layout((wide,)) and layout((a,)) == layout((a.clone(),))


def test_outputs_keep_their_structure_and_inputs_their_gradients_out():
    k = kernel(lambda x, s: ((x * s).contiguous(), x.t().contiguous(), s * 2))
    x, s = torch.randn(3, 4, requires_grad=True), torch.tensor(2.0)
    out = k(x, s)
    assert isinstance(out, tuple) and len(out) == 3 and not any(o.requires_grad for o in out)
    assert torch.equal(out[0], x.detach() * 2) and out[1].is_contiguous() and out[1].shape == (4, 3)
    assert isinstance(kernel(lambda x: x + 1)(x), torch.Tensor)


def test_a_first_build_failure_names_the_version_and_a_later_one_is_the_calls_own():
    def bad(x):
        if x.shape[0] > 4:
            raise RuntimeError("no kernel for this shape")
        return x + 1
    k = kernel(bad)
    with pytest.raises(KernelLoadError, match="probe.*compiled.*no kernel for this shape.*use the baseline"):
        k(torch.ones(8))
    assert torch.equal(k(torch.ones(2)), torch.full((2,), 2.0))  # built on this device now
    with pytest.raises(RuntimeError, match="no kernel for this shape") as err:
        k(torch.ones(8))
    assert not isinstance(err.value, KernelLoadError)
