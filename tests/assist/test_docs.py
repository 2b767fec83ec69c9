"""What the docs and skills tell people to run exists: every `temper ...`, `python -m engine ...`, `python -m harness
...`, `python -m guards ...`, `torchrun ... -m engine ...` and `sbatch scripts/slurm/... ARGS` command quoted in a
skill or a doc names a real subcommand, and each of its `--flags` appears in that subcommand's `--help` (asked of
the real entry points: harness.cli.main, engine.cli.main, guards.cli.main). Nothing is executed but `--help`.
And docs/configuration.md is exactly what `python -m engine config-reference` generates from EngineConfig."""

import contextlib
import io
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

__all__: list[str] = []

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted({*REPO.glob("plugins/*/skills/*/SKILL.md"), *REPO.glob("docs/*.md"), REPO / "README.md", REPO / "AGENTS.md",
               REPO / "CLAUDE.md", REPO / "milestones" / "README.md", REPO / "engine" / "ops" / "README.md"})
# A command starts a snippet (after VAR=value assignments) or follows a shell operator; what follows it up to the
# next operator or comment is its arguments. Quoted output ("temper gate: needs ...") names no subcommand.
_START = re.compile(r"(?:^\s*|(?:;|&&|\||\$\()\s*)(?:[A-Z_]+=\S*\s+)*"
                    r"(temper|python -m (?:engine|harness|guards)|torchrun|sbatch)(?=\s|$)")
_END = re.compile(r";|\s(?:\||&&|>|<|2>)|\s#")  # a list, a pipe, a redirect, a comment
_SUBCOMMAND = re.compile(r"[a-z][a-z-]*")


def snippets(text: str) -> list[str]:
    """Code a reader would copy: the lines of fenced blocks (backslash continuations joined) and inline code spans."""
    out, fence = [], None
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else line
            continue
        if fence is not None:
            out.append(line)
        else:
            out += re.findall(r"`([^`\n]+)`", line)
    return out


def commands(snippet: str) -> list[tuple[str, list[str]]]:
    """(tool, argv after the tool) for every command in a snippet; tool is temper | engine | guards."""
    found = []
    for m in _START.finditer(snippet):
        rest = snippet[m.end():]
        if end := _END.search(rest):
            rest = rest[:end.start()]
        try:
            words = shlex.split(rest)
        except ValueError:
            words = rest.split()
        head = m.group(1)
        if head in ("temper", "python -m harness"):
            found.append(("temper", words))
        elif head in ("python -m engine", "python -m guards"):
            found.append((head.split()[-1], words))
        elif head == "torchrun" and "-m" in words and words[words.index("-m") + 1:][:1] == ["engine"]:
            found.append(("engine", words[words.index("-m") + 2:]))
        elif head == "sbatch":
            script = next((i for i, w in enumerate(words) if w.startswith("scripts/slurm/")), None)
            if script is not None:  # every argument after the script is an engine pretrain flag
                assert (REPO / words[script]).is_file(), words[script]
                found.append(("engine", ["pretrain", *words[script + 1:]]))
    return found


@cache
def help_text(tool: str, sub: str) -> str | None:
    """`<tool> <sub> --help` from the real entry point; None when there is no such subcommand."""
    from engine.cli import main as engine_main
    from guards.cli import main as guards_main
    from harness.cli import main as temper_main

    main = {"temper": temper_main, "engine": engine_main, "guards": guards_main}[tool]
    argv = [sub, "--help"] if sub else ["--help"]
    if tool == "temper" and sub == "guards":
        argv = ["guards", "check", "--help"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as stop:  # engine.cli's argparse exits
            status = stop.code
    return out.getvalue() if status == 0 else None


def problems_in(text: str) -> list[str]:
    problems = []
    for snippet in snippets(text):
        for tool, words in commands(snippet):
            if not words or not _SUBCOMMAND.fullmatch(words[0]):
                continue  # the bare tool named in prose, its --help, or quoted output ("temper gate: needs ...")
            sub = words[0]
            helped = help_text(tool, sub)
            if helped is None:
                problems.append(f"`{snippet.strip()}`: {tool} has no subcommand {sub!r}")
                continue
            args = words[2:] if tool in ("temper", "guards") and sub == "guards" else words[1:]
            for word in args:
                flag = word.split("=", 1)[0]
                if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and not re.search(rf"{re.escape(flag)}\b(?!-)", helped):
                    problems.append(f"`{snippet.strip()}`: {tool} {sub} has no flag {flag}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_quoted_commands_exist_and_their_flags_parse(doc: Path) -> None:
    assert problems_in(doc.read_text(encoding="utf-8")) == []


def test_every_skill_and_new_doc_quotes_commands_that_are_checked() -> None:
    """The check above reads what a reader copies: each skill and each page a user starts from quotes commands."""
    for doc in [*REPO.glob("plugins/*/skills/*/SKILL.md"), *(REPO / "docs" / n for n in ("quickstart.md", "kernels.md"))]:
        assert any(commands(s) for s in snippets(doc.read_text(encoding="utf-8"))), doc


def test_the_check_finds_a_missing_subcommand_or_flag() -> None:
    text = ("Run `temper doctor --requires gpu` and `temper gate demo-tiny --patchh x.diff`.\n\n```bash\n"
            "python -m engine pretrain --preset tiny \\\n    --num-stepz 5   # comment --not-checked\n"
            "torchrun --nproc-per-node 2 -m engine pretrain --tp 2 --tpp 2\ntemper teleport\n"
            "sbatch scripts/slurm/pretrain.sbatch --preset tiny --bogus 1\n```\n")
    assert [p.split(": ", 1)[1] for p in problems_in(text)] == [
        "temper gate has no flag --patchh", "engine pretrain has no flag --num-stepz", "engine pretrain has no flag --tpp",
        "temper has no subcommand 'teleport'", "engine pretrain has no flag --bogus"]


def test_the_configuration_reference_is_generated_from_engine_config() -> None:
    """docs/configuration.md == `python -m engine config-reference`: a field added, renamed or given another default
    or help text without regenerating the page fails here. Independently of the generator, every field's flag and
    default must be on the page."""
    from dataclasses import MISSING, fields

    from engine.cli import config_reference
    from engine.config import EngineConfig, flag_name

    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == config_reference(), "regenerate: python -m engine config-reference > docs/configuration.md"
    for f in fields(EngineConfig):
        assert f.default is not MISSING
        row = next(line for line in page.splitlines() if line.startswith(f"| `{flag_name(f.name)}`"))
        default = str(f.default).lower() if isinstance(f.default, bool) else \
            f'"{f.default}"' if isinstance(f.default, str) else repr(f.default)
        assert f"| `{default}` |" in row, (f.name, row)


def test_the_install_docs_say_how_to_get_the_cpu_torch() -> None:
    """Plain PyPI resolves Linux torch to the CUDA build (GBs of NVIDIA wheels): a page that installs the pinned
    torch for CPU says to take torch alone from PyTorch's CPU index, and never calls the PyPI pin the CPU build."""
    for doc in (REPO / "README.md", REPO / "docs" / "quickstart.md"):
        text = doc.read_text(encoding="utf-8")
        assert "is the CPU build" not in text, doc
        cpu = [line for s in snippets(text) for line in s.splitlines() if "download.pytorch.org/whl/cpu" in line]
        assert cpu, f"{doc.name}: no `pip install torch==... --index-url https://download.pytorch.org/whl/cpu`"
        for line in cpu:  # torch alone from that index: the project's other dependencies come from the usual one
            words = line.split("#")[0].split()
            assert words[:2] == ["pip", "install"] and [w for w in words[2:] if not w.startswith("-") and "://" not in w] \
                == [next(w for w in words if w.startswith("torch=="))], line


def test_plain_torch_fallbacks_and_op_lists_name_every_op() -> None:
    """Where a page gives the plain-torch fallback (several `--op-<op> baseline` flags) it gives one for every
    registered op: a missed op keeps its compiled default (rope did). The add-op-version skill lists every op, and
    AGENTS.md says how Codex installs the skills' marketplace."""
    from engine.ops import OP_NAMES

    flags = {op: f"--op-{op.replace('_', '-')} baseline" for op in OP_NAMES}
    for doc in DOCS:
        text = " ".join(doc.read_text(encoding="utf-8").split())
        for run in re.findall(r"(?:--op-[a-z0-9-]+ baseline[` ]*){2,}", text):
            assert all(f in run for f in flags.values()), f"{doc.relative_to(REPO)}: {run.strip()} lacks " + \
                ", ".join(f for f in flags.values() if f not in run)
    skill = (REPO / "plugins/temper/skills/add-op-version/SKILL.md").read_text(encoding="utf-8")
    description = next(line for line in skill.splitlines() if line.startswith("description:"))
    assert all(op in description for op in OP_NAMES), description
    assert "codex plugin marketplace add ./" in (REPO / "AGENTS.md").read_text(encoding="utf-8")


def test_the_cpu_thread_setting_is_documented() -> None:
    """CPU runs on a small, shared machine are 2-3x faster with one intra-op thread: troubleshooting says when and
    how (a command the quoted-commands check parses), and the README's CPU command points at it."""
    trouble = (REPO / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    assert "`OMP_NUM_THREADS=1 python -m engine pretrain --preset tiny --device cpu`" in trouble
    assert "torch.get_num_threads()" in trouble and "torchrun already sets `OMP_NUM_THREADS=1`" in trouble
    assert "OMP_NUM_THREADS=1" in (REPO / "README.md").read_text(encoding="utf-8")
