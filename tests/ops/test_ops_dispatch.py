"""Kernel dispatcher: register validation, env > config > default, CPU rules, loud load failures.

Temporary op trees (tmp_path/<op>/register.toml plus real modules on sys.path) stand in for new
kernel versions: importing them is a real import, failing for real.
"""

import ast
import textwrap
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.errors import ConfigError, KernelLoadError, KernelRegistryError
from engine.ops import OP_NAMES, OpSet, load_op, load_register, register_path, resolve_ops, resolve_version
from engine.ops.attention.baseline import attention as baseline_attention
from engine.ops.gemm_fc1.baseline import gemm_fc1 as baseline_fc1
from engine.ops.gemm_output.baseline import gemm_output as baseline_output
from engine.ops.rmsnorm.baseline import rmsnorm as baseline_rmsnorm

GOOD = """
[op]
name = "attention"
description = "test attention"
env = "TEMPER_OP_ATTENTION"
default = "fast"

[versions.baseline]
entry = "engine.ops.attention.baseline:attention"
devices = ["cpu", "cuda"]
requires = []
description = "torch"

[versions.fast]
entry = "temper_test_fast_attn:attention"
devices = ["cuda"]
requires = []
description = "a cuda-only version"

[versions.portable]
entry = "temper_test_fast_attn:attention"
devices = ["cpu", "cuda"]
requires = []
description = "a version that also runs on cpu"

[versions.broken]
entry = "temper_test_broken_attn:attention"
devices = ["cpu", "cuda"]
requires = []
description = "its module fails to import"

[versions.needs-lib]
entry = "temper_test_fast_attn:attention"
devices = ["cpu", "cuda"]
requires = ["temper_test_missing_kernel_lib"]
description = "a required library is not installed"

[versions.no-func]
entry = "temper_test_fast_attn:not_there"
devices = ["cpu", "cuda"]
requires = []
description = "the module lacks the function"
"""


@pytest.fixture(autouse=True)
def _no_op_overrides(monkeypatch):
    for op in OP_NAMES:
        monkeypatch.delenv(f"TEMPER_OP_{op.upper()}", raising=False)


@pytest.fixture
def ops_root(tmp_path, monkeypatch):
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "register.toml").write_text(GOOD)
    for op in OP_NAMES[1:]:  # the other ops keep their real registers, so resolve_ops works here
        (tmp_path / op).mkdir()
        (tmp_path / op / "register.toml").write_bytes(register_path(op).read_bytes())
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "temper_test_fast_attn.py").write_text("def attention(q, k, v, *, softmax_scale):\n    return q\n")
    (mods / "temper_test_broken_attn.py").write_text("import temper_test_no_such_package  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(mods))
    return tmp_path


def write_register(root: Path, text: str, op: str = "attention") -> Path:
    (root / op).mkdir(exist_ok=True)
    path = root / op / "register.toml"
    path.write_text(textwrap.dedent(text))
    return path


# --- the real registers -------------------------------------------------------------------------

# The CUDA defaults: the fastest version bench/ops.py measured per op (docs/benchmarks.md).
CUDA_DEFAULTS = {"attention": "fa4-tuned", "rmsnorm": "cute", "gemm_fc1": "quack", "gemm_output": "quack", "rope": "quack"}


def test_real_registers_are_valid_and_default_to_the_measured_cutedsl_versions():
    for op in OP_NAMES:
        reg = load_register(op)
        assert reg.op == op and reg.env == f"TEMPER_OP_{op.upper()}"
        assert reg.default == CUDA_DEFAULTS[op] and "baseline" in reg.versions
        assert resolve_version(op, "", "cuda") == CUDA_DEFAULTS[op]
        assert resolve_version(op, "", "cpu") == "baseline"
        assert reg.versions["baseline"].devices == ("cpu", "cuda")
        for name, spec in reg.versions.items():  # CuTeDSL versions: CUDA only, their libraries required
            if name == "compiled":  # torch.compile of the baseline's math: CPU and CUDA, no library beyond torch
                assert spec.devices == ("cpu", "cuda") and not spec.requires, (op, name)
            elif name != "baseline":
                assert spec.devices == ("cuda",) and spec.requires, (op, name)


def test_a_fp8_run_on_cuda_that_names_no_gemm_fc1_gets_the_registers_fp8_default():
    """gemm_fc1's CUDA default (quack) runs --fp8 slower than cuBLAS's FP8 GEMM: `--fp8` alone resolves to its
    fp8_default (triton), a version that is named stays named (and check_fp8 refuses what it cannot run), CPU keeps
    baseline."""
    assert load_register("gemm_fc1").fp8_default == "triton"
    assert resolve_version("gemm_fc1", "", "cuda", fp8=True) == "triton"
    assert resolve_version("gemm_fc1", "", "cuda") == CUDA_DEFAULTS["gemm_fc1"]
    assert resolve_version("gemm_fc1", "quack", "cuda", fp8=True) == "quack"
    assert resolve_version("gemm_fc1", "", "cpu", fp8=True) == "baseline"
    assert resolve_version("rmsnorm", "", "cuda", fp8=True) == CUDA_DEFAULTS["rmsnorm"]  # no fp8_default: the default


def test_an_fp8_default_that_cannot_run_on_cuda_is_refused(tmp_path):
    root = tmp_path / "ops"
    (root / "attention").mkdir(parents=True)
    (root / "attention" / "register.toml").write_text(
        '[op]\nname = "attention"\ndescription = "d"\nenv = "TEMPER_OP_ATTENTION"\ndefault = "baseline"\n'
        'fp8_default = "cpuonly"\n[versions.baseline]\nentry = "m:f"\ndevices = ["cpu", "cuda"]\nrequires = []\n'
        'description = "d"\n[versions.cpuonly]\nentry = "m:g"\ndevices = ["cpu"]\nrequires = []\ndescription = "d"\n')
    with pytest.raises(KernelRegistryError, match="op.fp8_default.*'cpuonly'.*cuda"):
        load_register("attention", root)


def test_resolve_ops_on_cpu_gives_the_baselines():
    ops = resolve_ops(EngineConfig(), torch.device("cpu"))
    assert isinstance(ops, OpSet)
    assert ops.versions == {op: "baseline" for op in OP_NAMES}
    assert ops.attention is baseline_attention and ops.rmsnorm is baseline_rmsnorm
    assert ops.gemm_fc1 is baseline_fc1 and ops.gemm_output is baseline_output


def test_env_override_reaches_the_real_registers(monkeypatch):
    monkeypatch.setenv("TEMPER_OP_RMSNORM", "no-such-kernel")
    with pytest.raises(ConfigError, match=r"TEMPER_OP_RMSNORM='no-such-kernel' is not a version of op 'rmsnorm'.*baseline"):
        resolve_ops(EngineConfig(), "cpu")


# --- precedence and device rules ----------------------------------------------------------------

def test_default_is_used_on_cuda_when_nothing_is_requested(ops_root):
    assert resolve_version("attention", "", "cuda", ops_root=ops_root) == "fast"


def test_config_beats_default(ops_root):
    assert resolve_version("attention", "baseline", "cuda", ops_root=ops_root) == "baseline"
    assert resolve_version("attention", "portable", "cpu", ops_root=ops_root) == "portable"


def test_env_beats_config(ops_root, monkeypatch):
    monkeypatch.setenv("TEMPER_OP_ATTENTION", "fast")
    assert resolve_version("attention", "baseline", "cuda", ops_root=ops_root) == "fast"
    monkeypatch.setenv("TEMPER_OP_ATTENTION", "portable")
    assert resolve_version("attention", "fast", "cpu", ops_root=ops_root) == "portable"


def test_cpu_resolves_to_baseline_when_nothing_is_requested(ops_root):
    assert resolve_version("attention", "", "cpu", ops_root=ops_root) == "baseline"
    # Even when the default could run on cpu: the default is the CUDA choice.
    write_register(ops_root, GOOD.replace('default = "fast"', 'default = "portable"'))
    assert resolve_version("attention", "", "cpu", ops_root=ops_root) == "baseline"
    assert resolve_version("attention", "", "cuda", ops_root=ops_root) == "portable"


def test_forcing_a_cuda_only_version_on_cpu_raises(ops_root, monkeypatch):
    with pytest.raises(ConfigError) as err:
        resolve_version("attention", "fast", "cpu", ops_root=ops_root)
    msg = str(err.value)
    assert "--op-attention='fast'" in msg and "'attention'" in msg and "not on cpu" in msg
    assert "baseline" in msg and "portable" in msg  # the versions that would run here
    monkeypatch.setenv("TEMPER_OP_ATTENTION", "fast")
    with pytest.raises(ConfigError, match=r"unset TEMPER_OP_ATTENTION"):
        resolve_version("attention", "", "cpu", ops_root=ops_root)


def test_unknown_version_lists_the_known_ones(ops_root, monkeypatch):
    with pytest.raises(ConfigError) as err:
        resolve_version("attention", "fa9", "cuda", ops_root=ops_root)
    assert "'fa9'" in str(err.value)
    for name in ("baseline", "fast", "portable", "broken", "needs-lib", "no-func"):
        assert name in str(err.value)
    monkeypatch.setenv("TEMPER_OP_ATTENTION", "fa9")
    with pytest.raises(ConfigError, match="TEMPER_OP_ATTENTION='fa9'"):
        resolve_version("attention", "baseline", "cpu", ops_root=ops_root)


def test_unknown_device_and_op_raise(ops_root):
    with pytest.raises(ConfigError, match="device='mps'"):
        resolve_version("attention", "", "mps", ops_root=ops_root)
    with pytest.raises(ConfigError, match="op='softmax'"):
        resolve_version("softmax", "", "cpu", ops_root=ops_root)


# --- loading ------------------------------------------------------------------------------------

def test_load_op_imports_the_entry(ops_root, monkeypatch):
    fn = load_op("attention", "portable", ops_root=ops_root)
    assert fn.__module__ == "temper_test_fast_attn" and fn.__name__ == "attention"
    monkeypatch.setenv("TEMPER_OP_ATTENTION", "portable")
    ops = resolve_ops(EngineConfig(), "cpu", ops_root=ops_root)
    assert ops.attention is fn and ops.versions["attention"] == "portable" and ops.versions["rmsnorm"] == "baseline"


def test_document_mask_refuses_a_version_without_document_keywords(ops_root, tmp_path):
    """`portable` has the old contract (q, k, v, *, softmax_scale): with --document-mask it would attend across
    documents or fail mid-step, so the run stops at start; a catch-all **kwargs is refused too (it could
    swallow the boundaries); a version naming both keywords, and every real version, passes."""
    masked = EngineConfig(document_mask=True, op_attention="portable")
    with pytest.raises(ConfigError, match=r"--document-mask.*'portable' \(temper_test_fast_attn:attention\).*baseline"):
        resolve_ops(masked, "cpu", ops_root=ops_root)
    assert resolve_ops(EngineConfig(op_attention="portable"), "cpu", ops_root=ops_root).versions["attention"] == "portable"
    mods = tmp_path / "mods"
    (mods / "temper_test_kwargs_attn.py").write_text("def attention(q, k, v, *, softmax_scale, **kw):\n    return q\n")
    (mods / "temper_test_docs_attn.py").write_text(
        "def attention(q, k, v, *, softmax_scale, cu_seqlens=None, max_seqlen=None):\n    return q\n")
    for name, module in (("kwargs", "temper_test_kwargs_attn"), ("docs", "temper_test_docs_attn")):
        (ops_root / "attention" / "register.toml").write_text(GOOD + f"""
[versions.{name}]
entry = "{module}:attention"
devices = ["cpu"]
requires = []
description = "test"
""")
    with pytest.raises(ConfigError, match="'kwargs'"):
        resolve_ops(EngineConfig(document_mask=True, op_attention="kwargs"), "cpu", ops_root=ops_root)
    assert resolve_ops(EngineConfig(document_mask=True, op_attention="docs"), "cpu", ops_root=ops_root)
    assert resolve_ops(EngineConfig(document_mask=True), "cpu").versions["attention"] == "baseline"
    for version, spec in load_register("attention").versions.items():  # the real ones, parsed (no CUDA import)
        module, func = spec.entry.split(":")
        tree = ast.parse((Path(__file__).resolve().parents[2] / (module.replace(".", "/") + ".py")).read_text())
        (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func]
        assert {a.arg for a in fn.args.kwonlyargs} >= {"cu_seqlens", "max_seqlen"} and fn.args.kwarg is None, version


def test_failed_import_raises_kernel_load_error_not_baseline(ops_root, monkeypatch):
    with pytest.raises(KernelLoadError) as err:
        load_op("attention", "broken", ops_root=ops_root)
    msg = str(err.value)
    assert "'attention'" in msg and "'broken'" in msg and "temper_test_no_such_package" in msg
    assert isinstance(err.value.__cause__, ModuleNotFoundError)
    # Through the full path too: a requested version that cannot load stops the run.
    monkeypatch.setenv("TEMPER_OP_ATTENTION", "broken")
    with pytest.raises(KernelLoadError, match="'broken'"):
        resolve_ops(EngineConfig(), "cpu", ops_root=ops_root)


def test_missing_required_module_raises(ops_root):
    with pytest.raises(KernelLoadError, match="required module 'temper_test_missing_kernel_lib'"):
        load_op("attention", "needs-lib", ops_root=ops_root)


def test_missing_function_raises(ops_root):
    with pytest.raises(KernelLoadError, match="no callable 'not_there'"):
        load_op("attention", "no-func", ops_root=ops_root)


def test_kernel_load_error_is_a_config_error():
    # The CLI turns ConfigError into one line and exit 2; kernel problems should read the same way.
    assert issubclass(KernelLoadError, ConfigError) and issubclass(KernelRegistryError, ConfigError)


# --- malformed registers ------------------------------------------------------------------------

MALFORMED = {
    "bad_toml": ('[op\nname = "attention"', "file", "TOML"),
    "missing_default": (GOOD.replace('default = "fast"\n', ""), "op", "default"),
    "default_not_in_versions": (GOOD.replace('default = "fast"', 'default = "fa9"'), "op.default", "fa9"),
    "default_not_on_cuda": (GOOD.replace('[versions.fast]\nentry = "temper_test_fast_attn:attention"\ndevices = ["cuda"]',
                                         '[versions.fast]\nentry = "temper_test_fast_attn:attention"\ndevices = ["cpu"]'),
                            "op.default", "cuda"),
    "bad_device": (GOOD.replace('devices = ["cuda"]', 'devices = ["gpu"]'), "versions.fast.devices", "gpu"),
    "empty_devices": (GOOD.replace('devices = ["cuda"]', "devices = []"), "versions.fast.devices", "'cpu'"),
    "devices_not_a_list": (GOOD.replace('devices = ["cuda"]', 'devices = "cuda"'), "versions.fast.devices", "list"),
    "typo_key": (GOOD.replace('devices = ["cuda"]', 'device = ["cuda"]'), "versions.fast", "device"),
    "missing_entry": (GOOD.replace('entry = "temper_test_broken_attn:attention"\n', ""), "versions.broken", "entry"),
    "bad_entry": (GOOD.replace("temper_test_broken_attn:attention", "temper_test_broken_attn.attention"),
                  "versions.broken.entry", "module:function"),
    "missing_requires": (GOOD.replace('requires = ["temper_test_missing_kernel_lib"]\n', ""), "versions.needs-lib", "requires"),
    "no_baseline": (GOOD.replace("[versions.baseline]", "[versions.torch]"), "versions.baseline", "cpu"),
    "wrong_name": (GOOD.replace('name = "attention"', 'name = "rmsnorm"'), "op.name", "attention"),
    "wrong_env": (GOOD.replace('env = "TEMPER_OP_ATTENTION"', 'env = "TEMPER_ATTN"'), "op.env", "TEMPER_OP_ATTENTION"),
    "no_versions": (GOOD.split("[versions.baseline]")[0], "versions", "baseline"),
    "no_op_table": ("\n".join(GOOD.splitlines()[7:]), "op", "[op]"),
    "bad_version_name": (GOOD.replace("[versions.fast]", "[versions.Fast]").replace('default = "fast"', 'default = "Fast"'),
                         "versions.Fast", "lowercase"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_register_raises_naming_file_key_and_fix(case, ops_root):
    text, key, hint = MALFORMED[case]
    path = write_register(ops_root, text)
    with pytest.raises(KernelRegistryError) as err:
        load_register("attention", ops_root)
    msg = str(err.value)
    assert str(path) in msg, msg
    assert err.value.key == key, msg
    assert hint in msg, msg
    assert err.value.fix and err.value.fix in msg
    with pytest.raises(KernelRegistryError):  # resolution reads the register, so it fails the same way
        resolve_version("attention", "", "cuda", ops_root=ops_root)


def test_missing_register_file_raises(tmp_path):
    with pytest.raises(KernelRegistryError, match="does not exist"):
        load_register("gemm_fc1", tmp_path)


def test_a_versions_fp8_key_says_what_of_fp8_it_runs_and_the_rest_is_refused_at_start(tmp_path):
    """gemm_fc1 quack's register entry lists fp8 = ["tensorwise"]: --fp8 rowwise and --fp8-fast-accum with it are
    refused by check_fp8 (ConfigError naming the flag, its value and the fix), tensorwise passes; a version without
    the key runs every recipe; a key listing no recipe or an unknown word is refused when the register is read."""
    from engine.config import build_config, resolve
    from engine.errors import ConfigError
    from engine.ops.dispatch import check_fp8

    assert load_register("gemm_fc1").versions["quack"].fp8 == ("tensorwise",)
    assert load_register("gemm_fc1").versions["compiled"].fp8 is None

    def with_fp8(x, w, *, main_grad=None, fp8="off", amax=False):
        return x

    runs = load_register("gemm_fc1").versions["quack"].fp8
    check_fp8(resolve(build_config({"fp8": "tensorwise"})), "quack", with_fp8, runs)
    with pytest.raises(ConfigError, match="--fp8='rowwise'.*pass --fp8 tensorwise, or --op-gemm-fc1 compiled"):
        check_fp8(resolve(build_config({"fp8": "rowwise"})), "quack", with_fp8, runs)
    fast = resolve(build_config({"fp8": "tensorwise", "fp8_fast_accum": True}))
    with pytest.raises(ConfigError, match="--fp8-fast-accum=True.*cannot.*leave out --fp8-fast-accum"):
        check_fp8(fast, "quack", with_fp8, runs)
    check_fp8(fast, "compiled", with_fp8, None)
    root = tmp_path / "ops"
    (root / "gemm_fc1").mkdir(parents=True)
    for bad in ('["fast-accum"]', '["tensorwise", "blockwise"]', '[]'):
        (root / "gemm_fc1" / "register.toml").write_text(
            '[op]\nname = "gemm_fc1"\ndescription = "d"\nenv = "TEMPER_OP_GEMM_FC1"\ndefault = "baseline"\n'
            '[versions.baseline]\nentry = "m:f"\ndevices = ["cpu", "cuda"]\nrequires = []\ndescription = "d"\n'
            f'fp8 = {bad}\n')
        with pytest.raises(KernelRegistryError, match="versions.baseline.fp8.*list the recipes"):
            load_register("gemm_fc1", root)


def test_a_gemm_fc1_without_the_amax_keyword_is_refused_with_tensorwise_only():
    """The layer passes `amax` (FC2's input amax, register.toml) with --fp8 tensorwise only: there a version with an
    FP8 path but no keyword-only `amax` is refused at start (ConfigError naming the version and the fix), not a
    TypeError at the first step; rowwise runs it. Every registered FP8 version takes it."""
    from engine.config import build_config, resolve
    from engine.errors import ConfigError
    from engine.ops.dispatch import check_fp8

    def no_amax(x, w, *, main_grad=None, fp8="off"):
        return x

    def positional_amax(x, w, amax=False, *, main_grad=None, fp8="off"):
        return x

    tensorwise = resolve(build_config({"fp8": "tensorwise"}))
    for fn in (no_amax, positional_amax):
        with pytest.raises(ConfigError, match="--op-gemm-fc1='mine' takes no `amax` keyword.*--op-gemm-fc1 triton"):
            check_fp8(tensorwise, "mine", fn)
        check_fp8(resolve(build_config({"fp8": "rowwise"})), "mine", fn)
    for version in ("baseline", "compiled"):  # importable here; triton's and quack's entries read from the source
        check_fp8(tensorwise, version, load_op("gemm_fc1", version))
    for version in ("triton", "quack"):
        module, name = load_register("gemm_fc1").versions[version].entry.split(":")
        tree = ast.parse((Path(__file__).resolve().parents[2] / (module.replace(".", "/") + ".py")).read_text())
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
        assert {"fp8", "amax"} <= {a.arg for a in fn.args.kwonlyargs}, version
