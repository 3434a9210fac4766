"""The layout: Determined's surface at the root, the library in extractive_qa/, one job per
module. Python finds everything from the repository root (no sys.path edits); the package
never imports an entry script; no import cycles (imports inside functions count: they run too)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "extractive_qa"
ENTRY_SCRIPTS = {p.stem for p in ROOT.glob("*.py")}
MAX_LINES = 400


def python_files() -> list[Path]:
    skip = {".venv", ".venv-compat", ".git"}
    return [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]


def imported(path: Path) -> set[str]:
    """Dotted names this file imports (`from extractive_qa import x` gives extractive_qa.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_no_sys_path_edits_and_no_import_order_suppressions() -> None:
    signs = ("sys.path." + "insert", "sys.path." + "append", "noqa: " + "E402")  # not found in this file
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in python_files()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if any(sign in line for sign in signs)
    ]
    assert not offenders, offenders


def test_the_package_never_imports_an_entry_script() -> None:
    for path in PACKAGE.glob("*.py"):
        top = {name.split(".")[0] for name in imported(path)}
        assert not top & ENTRY_SCRIPTS, f"{path.name} imports {sorted(top & ENTRY_SCRIPTS)}"


def test_no_import_cycles() -> None:
    modules = {module_name(p): p for p in [*ROOT.glob("*.py"), *PACKAGE.glob("*.py")]}
    graph = {name: {m for m in imported(p) if m in modules and m != name} for name, p in modules.items()}
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


def test_modules_are_small_and_say_what_they_do() -> None:
    for path in [*ROOT.glob("*.py"), *PACKAGE.glob("*.py")]:
        lines = path.read_text().count("\n")
        assert lines <= MAX_LINES, f"{path.name}: {lines} lines (split it by job)"
        assert ast.get_docstring(ast.parse(path.read_text())), f"{path.name} has no docstring"


def test_model_def_holds_the_trial_and_only_the_trial() -> None:
    tree = ast.parse((ROOT / "model_def.py").read_text())
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defined == ["SquadTrial"], defined


def test_the_upload_carries_the_package_and_the_entry_scripts() -> None:
    """Determined uploads the directory minus .detignore; the trial imports extractive_qa from it."""
    from tests.support import det_master

    files = {f.path for f in det_master.context_files(ROOT)}
    assert {"train.py", "model_def.py", "data.py", "startup-hook.sh", "extractive_qa/__init__.py"} <= files
    assert {f"extractive_qa/{p.name}" for p in PACKAGE.glob("*.py")} <= files
    assert not any(f.startswith(("tests/", "bench/")) for f in files)
