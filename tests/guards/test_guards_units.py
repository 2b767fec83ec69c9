"""Small pieces checked against independent references: cycle search, literal name prefixes, module names."""

import ast
import random

import pytest
from guards.astutil import literal_head
from guards.rules.dag import strongly_connected
from guards.source import ModuleNamer


def _reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        for child in graph[todo.pop()]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


@pytest.mark.parametrize("seed", range(20))
def test_strongly_connected_matches_mutual_reachability(seed):
    """Reference: two nodes share a component iff each reaches the other (quadratic, obviously right)."""
    rng = random.Random(seed)
    nodes = [f"m{i}" for i in range(rng.randint(1, 30))]
    graph = {n: sorted({rng.choice(nodes) for _ in range(rng.randint(0, 3))}) for n in nodes}
    reach = {n: _reachable(graph, n) for n in nodes}
    expected = {frozenset({m for m in nodes if m == n or (m in reach[n] and n in reach[m])}) for n in nodes}
    assert {frozenset(c) for c in strongly_connected(graph)} == expected


def test_strongly_connected_survives_a_deep_chain():
    graph = {f"m{i}": [f"m{i + 1}"] for i in range(20000)}
    graph["m20000"] = ["m0"]
    assert len(strongly_connected(graph)) == 1


@pytest.mark.parametrize("source,expected", [
    ('"RANK"', ("RANK", True)),
    ('f"TEMPER_OP_{op.upper()}"', ("TEMPER_OP_", False)),
    ('f"ALL_LITERAL"', ("ALL_LITERAL", True)),
    ('"A_" + "B_" + name', ("A_B_", False)),
    ('"A_" + "B"', ("A_B", True)),
    ('"X_%s" % name', ("X_", False)),
    ('"X_{}".format(name)', ("X_", False)),
    ("name", None),
    ("name + '_SUFFIX'", None),
    ("b'RANK'", None),
])
def test_literal_head(source, expected):
    assert literal_head(ast.parse(source, mode="eval").body) == expected


def test_module_names(tmp_path):
    root = tmp_path / "project"
    (root / "engine" / "model").mkdir(parents=True)
    outside = tmp_path / "site" / "lib" / "sub"
    outside.mkdir(parents=True)
    for folder in (tmp_path / "site" / "lib", outside):
        (folder / "__init__.py").write_text("")
    namer = ModuleNamer(root)
    assert namer.name(root / "engine" / "model" / "attn.py") == ("engine.model.attn", False)
    assert namer.name(root / "engine" / "__init__.py") == ("engine", True)
    assert namer.name(outside / "x.py") == ("lib.sub.x", False)  # site/ has no __init__.py
    assert namer.name(outside / "__init__.py") == ("lib.sub", True)
    assert namer.relpath(outside / "x.py") is None
