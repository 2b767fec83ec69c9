"""dag: imports follow the declared layers, never form a cycle, and never cross a forbidden line.

* Layers (guards.toml `[dag.<package>] layers`, lowest first): a module may import its own layer or
  a lower one. A module of the package that no layer entry covers is a finding too, so new modules
  must be placed deliberately.
* Forbidden (guards.toml `[dag] forbidden = {engine = ["harness"]}`): a package never imports those
  module prefixes, at any depth.
* Cycles among all checked modules are reported once per strongly connected component, with one
  concrete cycle path, at the import that starts it. An import line marked
  `# guard: allow dag -- <why>` is left out of the graph, which is how an accepted edge is recorded.

Every import counts: module level, inside functions, under `if TYPE_CHECKING`, relative, and
`importlib.import_module("literal")` / `__import__("literal")` (see astutil.import_edges).
"""

from collections import deque
from collections.abc import Iterator

from guards.astutil import ImportEdge, import_edges
from guards.config import LayerMap
from guards.findings import Finding
from guards.project import Project
from guards.rules.base import Rule
from guards.source import SourceModule

__all__ = ["DagRule", "strongly_connected"]


def strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm without recursion (torch's import graph is deep). Every target must be a key."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(graph[root]))]
        while work:
            node, children = work[-1]
            descended = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                    descended = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def _shortest_cycle(start: str, graph: dict[str, list[str]], members: set[str]) -> list[str]:
    """start -> ... -> start through `members` only, by breadth-first search (shortest first)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for child in graph[node]:
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if child in members and child not in seen:
                seen.add(child)
                parent[child] = node
                queue.append(child)
    return [start, start]  # unreachable for a real component; keeps the type simple


class DagRule(Rule):
    id = "dag"
    summary = "imports respect guards.toml layers and forbidden pairs; no import cycles"

    def __init__(self, project: Project):
        super().__init__(project)
        self._edges: dict[str, list[ImportEdge]] = {}
        self._paths: dict[str, str] = {}

    def _layers_for(self, module: str) -> LayerMap | None:
        return next((m for m in self.config.layers.values() if m.covers(module)), None)

    def check(self, module: SourceModule) -> Iterator[Finding]:
        edges = import_edges(module, self.project.is_module)
        if module.name not in self._edges:
            self._edges[module.name] = edges
            self._paths[module.name] = module.display
        layers = self._layers_for(module.name)
        if layers is not None:
            yield from self._check_layers(module, edges, layers)
        for package, prefixes in self.config.forbidden.items():
            if module.name == package or module.name.startswith(package + "."):
                for edge in edges:
                    banned = next((p for p in prefixes if edge.target == p or edge.target.startswith(p + ".")), None)
                    if banned:
                        yield Finding(module.display, edge.line, edge.col, self.id,
                                      f"{module.name} imports {edge.target}, but {package} must never import {banned} "
                                      "(guards.toml [dag] forbidden); talk to it through files, logs or a subprocess")

    def _check_layers(self, module: SourceModule, edges: list[ImportEdge], layers: LayerMap) -> Iterator[Finding]:
        own = layers.layer_of(module.name)
        if own is None:
            yield module.finding(self.id, f"{module.name} is in no layer of guards.toml [dag.{layers.package}]; "
                                          "add it to a layer in guards.toml")
            return
        for edge in edges:
            if not layers.covers(edge.target):
                continue
            theirs = layers.layer_of(edge.target)
            if theirs is not None and theirs > own:
                yield Finding(module.display, edge.line, edge.col, self.id,
                              f"{module.name} (layer {own + 1}) imports {edge.target} (layer {theirs + 1}); a lower "
                              "layer must not import a higher one: move the shared code down or invert the "
                              f"dependency (layers in guards.toml [dag.{layers.package}])")

    def finish(self) -> Iterator[Finding]:
        graph: dict[str, list[str]] = {}
        for name in sorted(self._edges):
            path = self._paths[name]
            targets = []
            for edge in self._edges[name]:
                if edge.target != name and edge.target in self._edges and edge.target not in targets \
                        and not self.project.is_suppressed(path, edge.line, self.id):
                    targets.append(edge.target)
            graph[name] = targets
        for component in strongly_connected(graph):
            if len(component) < 2:
                continue
            start = min(component)
            cycle = _shortest_cycle(start, graph, set(component))
            first = min((e for e in self._edges[start] if e.target == cycle[1]
                         and not self.project.is_suppressed(self._paths[start], e.line, self.id)),
                        key=lambda e: (e.line, e.col))
            yield Finding(self._paths[start], first.line, first.col, self.id,
                          f"import cycle {' -> '.join(cycle)}; move what they share into a lower module, or keep one "
                          "import lazy and mark it `# guard: allow dag -- <why>`")
