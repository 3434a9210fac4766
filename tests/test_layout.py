"""The project's modules form layers: no two import each other, directly or around a cycle
(imports inside functions count: they run too)."""

from __future__ import annotations

import ast

from conftest import ROOT


def imports_of(path) -> set[str]:
    modules = {p.stem for p in ROOT.glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return (found & modules) - {path.stem}


def test_no_import_cycles_between_the_projects_modules() -> None:
    graph = {p.stem: imports_of(p) for p in ROOT.glob("*.py")}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for dep in sorted(graph[module]):
            if dep in path:
                cycles.append(path[path.index(dep) :] + [dep])
            elif len(path) < len(graph):
                visit(dep, [*path, dep])

    for module in sorted(graph):
        visit(module, [module])
    assert not cycles, f"import cycles: {sorted({' -> '.join(c) for c in cycles})}"
