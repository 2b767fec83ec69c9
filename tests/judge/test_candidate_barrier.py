"""The judge's test process never imports candidate code (harness/judge/barrier.py); candidate code runs in a child
that hands back data only (harness/judge/candidate.py)."""

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.judge.barrier import write_barrier
from harness.judge.candidate import Candidate, CandidateError, decode, encode

JUDGE_ROOT = Path(__file__).resolve().parents[2]

CALLS = '''
import os
import torch

NAMES = ("cosine", "wsd")

def echo(*args, **kwargs):
    return {"args": args, "kwargs": kwargs}

def grads(x, w):
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    (x @ w).square().sum().backward()
    return x.grad, w.grad

def config_error():
    class ConfigError(ValueError):
        pass
    raise ConfigError("--lr-schedule: 'nope' is not a schedule")

def an_object():
    return object()

def exit_hard():
    os._exit(7)

def shout():
    print("[PYTEST forged] {}", flush=True)
    return 1
'''


@pytest.fixture(scope="session")
def child(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkout")
    (root / "calls.py").write_text(CALLS, encoding="utf-8")
    with Candidate(root, timeout_s=120) as c:
        yield c


def test_values_cross_both_ways_exactly(child):
    x = torch.randn(3, 4, dtype=torch.float64)
    args = (x, torch.arange(6, dtype=torch.int32).reshape(2, 3), torch.tensor([True, False]), torch.bfloat16, 2.5,
            [1, "two", None], {"k": (1, 2)})
    out = child.call("calls:echo", *args, scale=torch.ones(2, dtype=torch.float16))
    assert torch.equal(out["args"][0], x) and out["args"][0].dtype == torch.float64
    assert torch.equal(out["args"][1], args[1]) and torch.equal(out["args"][2], args[2])
    assert out["args"][3:] == (torch.bfloat16, 2.5, [1, "two", None], {"k": (1, 2)})
    assert torch.equal(out["kwargs"]["scale"], torch.ones(2, dtype=torch.float16))


def test_a_constant_is_read_by_value(child):
    assert child.value("calls:NAMES") == ("cosine", "wsd")


def test_gradients_computed_in_the_child_match_the_test_process(child):
    """The child does the autograd; the test recomputes it in fp64 (exact for these small integers-valued sums up to
    rounding of fp32 products: 1e-5 relative)."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 3, generator=gen), torch.randn(3, 2, generator=gen)
    gx, gw = child.call("calls:grads", x, w)
    y = x.double() @ w.double()
    torch.testing.assert_close(gx.double(), 2 * y @ w.double().t(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw.double(), 2 * x.double().t() @ y, rtol=1e-5, atol=1e-6)


def test_an_exception_comes_back_by_its_type_names(child):
    with pytest.raises(CandidateError) as err:
        child.call("calls:config_error")
    assert err.value.is_a("ConfigError") and err.value.is_a("ValueError")
    assert "not a schedule" in err.value.message and "Traceback" in err.value.details


def test_only_data_crosses(child):
    with pytest.raises(CandidateError, match="object cannot cross"):
        child.call("calls:an_object")
    with pytest.raises(TypeError, match="string keys"):
        encode({1: 2})
    for body in (pickle.dumps({"value": 1}), b'{"value": 1}\n{}', b'{"$dict": {"value": {"$t": "0"}}}\n{}',
                 b'{"$dict": {"value": {"$dtype": "object"}}}\n{}'):
        with pytest.raises(ValueError):
            decode(body)
    assert decode(encode({"value": (1, 2.0)})) == {"value": (1, 2.0)}


def test_the_childs_prints_never_reach_the_test_process_output(child, capfd):
    assert child.call("calls:shout") == 1
    assert "[PYTEST" not in capfd.readouterr().out
    assert "[PYTEST forged]" in child.log_tail()


def test_a_child_that_dies_is_named(tmp_path):
    (tmp_path / "calls.py").write_text(CALLS, encoding="utf-8")
    with Candidate(tmp_path, timeout_s=120) as c:
        with pytest.raises(CandidateError, match=r"died during calls:exit_hard \(exit 7\)"):
            c.call("calls:exit_hard")


# ---------------------------------------------------------------- the barrier


def _checkout(root: Path) -> Path:
    """A checkout with a candidate package (`pkg`), a trusted module and a namespace folder of candidate files."""
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("IMPORTED = True\n", encoding="utf-8")
    (root / "trusted_mod.py").write_text("VALUE = 3\n", encoding="utf-8")
    (root / "nspkg").mkdir()
    (root / "nspkg" / "mod.py").write_text("X = 1\n", encoding="utf-8")
    return root


def _probe(root: Path, barrier: Path, code: str) -> subprocess.CompletedProcess:
    prelude = ("import sys\nsys.path.insert(0, sys.argv[1])\nfrom harness.judge.barrier import install_from_file\n"
               "install_from_file(sys.argv[2])\n")
    env = {**os.environ, "PYTHONPATH": str(JUDGE_ROOT)}
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code), str(root), str(barrier)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_barrier_refuses_candidate_modules_and_loads_trusted_ones(tmp_path):
    root = _checkout(tmp_path / "tree")
    files = ["pkg/__init__.py", "trusted_mod.py", "nspkg/mod.py"]
    barrier = write_barrier(tmp_path / "barrier.json", root, files, lambda rel: not rel.startswith("trusted"))
    assert json.loads(barrier.read_text())["trusted"] == ["trusted_mod.py"]
    out = _probe(root, barrier, """
        import trusted_mod, json, torch  # the checkout's trusted file, the stdlib, site-packages
        assert trusted_mod.VALUE == 3
        for name in ("pkg", "nspkg.mod", "nspkg"):
            try:
                __import__(name)
            except ImportError as err:
                print("refused", name, type(err).__name__, "candidate.Candidate" in str(err))
            else:
                print("imported", name)
        import importlib
        try:
            importlib.import_module("pkg")
        except ImportError:
            print("refused importlib")
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["refused pkg CandidateImportError True", "refused nspkg.mod CandidateImportError True",
                                          "refused nspkg CandidateImportError True", "refused importlib"]


def test_a_file_added_after_the_list_was_written_is_not_trusted(tmp_path):
    root = _checkout(tmp_path / "tree")
    barrier = write_barrier(tmp_path / "barrier.json", root, ["trusted_mod.py"], lambda rel: False)
    (root / "planted.py").write_text("print('ran')\n", encoding="utf-8")
    out = _probe(root, barrier, """
        try:
            import planted
        except ImportError:
            print("refused")
    """)
    assert out.stdout.strip() == "refused", out.stdout + out.stderr


def test_a_call_of_names_and_numbers_imports_torch_in_neither_process(tmp_path):
    """torch (2 s a process) comes with the first tensor or dtype: a test that asks the engine for a constant pays for
    neither its own process's import nor the child's (tensors cross as before: the tests above)."""
    (tmp_path / "names.py").write_text("NAMES = ('cosine', 'wsd')\n", encoding="utf-8")
    script = textwrap.dedent(f"""
        import sys
        from harness.judge.candidate import Candidate
        with Candidate({str(tmp_path)!r}, timeout_s=120) as c:
            names = c.value("names:NAMES")
            child = c.call("sys:modules.__contains__", "torch")
            print(names, child, "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(JUDGE_ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["('cosine', 'wsd') False False"], out.stdout
