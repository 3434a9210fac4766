"""The layout: Determined's surface at the root, the library in extractive_qa/ as its stages.

Python finds everything from the repository root (no sys.path edits); the package never imports
an entry script; a module imports only from its own stage or the stages before it, and inside a
stage only modules its folder's reading line lists before it; no import cycles between files or
between folders (imports inside functions count: they run too)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.project import ROOT

PACKAGE = ROOT / "extractive_qa"
ENTRY_SCRIPTS = {p.stem for p in ROOT.glob("*.py")}
# The stages in the order a run goes through them; the base serves them all: modules and folders
# (io/: files in and out; storage/: where a checkpoint lies), in the order they may import.
BASE = ("errors", "det_internals", "io", "cli", "storage", "compat")
BASE_FOLDERS = ("io", "storage")
STAGES = ("config", "data", "qa", "resume", "trial", "launch", "serve")
TOP = ("dry_run", "scaling_runs", "scaling_report")
# Past this, a module says in its docstring why it is still one idea ("One idea: ...").
REVIEW_LINES = 400
TEST_LINES = 60


def python_files() -> list[Path]:
    skip = {".venv", ".venv-compat", ".git"}
    return [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


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


def rank(module: str) -> tuple[int, int, int]:
    """(layer, position, position in its folder's reading line) of a package module."""
    parts = module.split(".")[1:]
    if parts[0] in BASE_FOLDERS:
        return 0, BASE.index(parts[0]), reading_line(parts[0]).index(parts[1])
    if parts[0] in BASE:
        return 0, BASE.index(parts[0]), 0
    if parts[0] in TOP:
        return len(STAGES) + 1, TOP.index(parts[0]), 0
    return STAGES.index(parts[0]) + 1, reading_line(parts[0]).index(parts[1]), 0


def reading_line(stage: str) -> list[str]:
    """The modules a stage's __init__ docstring names, in its order."""
    doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text())) or ""
    listed = doc.split(":", 1)[1] if ":" in doc else ""
    return re.findall(r"[a-z_]+", listed)


def package_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    return {m for m in imported(path) if m in modules}


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
    for path in PACKAGE.rglob("*.py"):
        top = {name.split(".")[0] for name in imported(path)}
        assert not top & ENTRY_SCRIPTS, f"{path.name} imports {sorted(top & ENTRY_SCRIPTS)}"


def test_no_entry_script_imports_another() -> None:
    """The root scripts are thin CLIs over the package, but for Determined's own convention (its
    examples' model_def.py imports data.py, and their train.py builds model_def's trial for the
    Trainer): the trial's data loading lives in data.py, and train.py builds model_def's trial."""
    allowed = {("model_def", "data"), ("train", "model_def")}
    found = {
        (path.stem, name.split(".")[0])
        for path in ROOT.glob("*.py")
        for name in imported(path)
        if name.split(".")[0] in ENTRY_SCRIPTS and name.split(".")[0] != path.stem
    }
    assert found <= allowed, sorted(found - allowed)


def test_the_trial_never_imports_serve() -> None:
    """What runs in a trial container (model_def.py, trial/, launch/) never needs the serving
    stage's optional dependencies."""
    trial_side = [ROOT / "model_def.py", ROOT / "train.py", *(PACKAGE / "trial").glob("*.py")]
    trial_side += [*(PACKAGE / "launch").glob("*.py")]
    offenders = [p.name for p in trial_side if any(n.startswith("extractive_qa.serve") for n in imported(p))]
    assert not offenders, offenders


def trial_offenders(paths: list[Path]) -> list[str]:
    """Files of what Determined's trial runs (model_def.py, trial/) that import the drivers around
    Trainer.fit (launch/: train.py's job) or the serving stage."""
    driven = ("extractive_qa.launch", "extractive_qa.serve")
    return [p.name for p in paths if any(n.startswith(driven) for n in imported(p))]


def test_the_trial_never_imports_the_drivers(tmp_path: Path) -> None:
    assert trial_offenders([ROOT / "model_def.py", *(PACKAGE / "trial").glob("*.py")]) == []
    planted = tmp_path / "model_def.py"  # the scan finds such an import
    planted.write_text("from extractive_qa.launch import local_run\n")
    assert trial_offenders([planted]) == ["model_def.py"]


def test_the_package_is_its_stages() -> None:
    """Every folder is a stage with a reading line naming exactly its modules; nothing else sits
    at the package's top."""
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert top == set(BASE) - set(BASE_FOLDERS) | set(TOP)
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(STAGES) | set(BASE_FOLDERS)
    for stage in (*BASE_FOLDERS, *STAGES):
        on_disk = {p.stem for p in (PACKAGE / stage).glob("*.py")} - {"__init__"}
        assert sorted(reading_line(stage)) == sorted(on_disk), f"{stage}/__init__.py reading line"
    overview = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())) or ""
    assert " -> ".join(STAGES) in overview


def package_lines() -> dict[str, int]:
    """Lines per folder of the package; the modules at its top (the base's and the top's) count
    as one folder each."""
    counts: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        folder = parts[0] if len(parts) > 1 else ("top" if path.stem in TOP else "base")
        counts[folder] = counts.get(folder, 0) + path.read_text().count("\n")
    return counts


def test_no_folder_holds_more_than_a_fifth_of_the_package() -> None:
    """The package's size is spread over its stages: no folder -- the base's modules together
    included -- passes 20 % of its lines, so no stage grows into a second library unseen."""
    counts = package_lines()
    total = sum(counts.values())
    heavy = {folder: f"{lines / total:.1%}" for folder, lines in counts.items() if lines > 0.20 * total}
    assert not heavy, heavy


def test_imports_go_down_the_stages_and_along_the_reading_lines() -> None:
    modules = package_modules()
    upward = [
        f"{name} imports {dep}"
        for name, path in modules.items()
        for dep in package_imports(path, modules)
        if rank(dep) >= rank(name)
    ]
    assert not upward, upward


def test_no_import_cycles_between_files_or_folders() -> None:
    modules = {module_name(p): p for p in [*ROOT.glob("*.py"), *package_modules().values()]}
    files = {name: package_imports(p, modules) - {name} for name, p in modules.items()}

    def folder(name: str) -> str:
        return ".".join(name.split(".")[:2]) if name.startswith("extractive_qa.") else name

    folders: dict[str, set[str]] = {}
    for name, deps in files.items():
        folders.setdefault(folder(name), set()).update(folder(d) for d in deps if folder(d) != folder(name))
    for graph in (files, folders):
        cycles = find_cycles(graph)
        assert not cycles, f"import cycles: {sorted({' -> '.join(c) for c in cycles})}"


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for dep in sorted(graph[module]):
            if dep in path:
                cycles.append(path[path.index(dep) :] + [dep])
            elif len(path) < len(graph):
                visit(dep, [*path, dep])

    for module in sorted(graph):
        visit(module, [module])
    return cycles


def test_modules_say_what_they_do_and_long_ones_why_they_are_one_idea() -> None:
    for path in [
        *ROOT.glob("*.py"),
        *PACKAGE.rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "bench").glob("*.py"),
    ]:
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc, f"{path.relative_to(ROOT)} has no docstring"
        lines = path.read_text().count("\n")
        assert lines <= REVIEW_LINES or "One idea:" in doc, (
            f"{path.relative_to(ROOT)}: {lines} lines; split it by job, or say in its docstring "
            "('One idea: ...') why it is one"
        )


def test_shipped_functions_fit_on_a_screen() -> None:
    """A function longer than 60 lines of the entry scripts or the package does several things."""
    long = [
        f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in [*ROOT.glob("*.py"), *PACKAGE.rglob("*.py")]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long, long


def test_test_functions_fit_on_a_screen() -> None:
    """A test longer than 60 lines tests several things: split it, or move its setup to a helper."""
    long = [
        f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in (ROOT / "tests").rglob("test_*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("test_")
        and node.end_lineno - node.lineno + 1 > TEST_LINES
    ]
    assert not long, long


def test_model_def_holds_the_trial_and_only_the_trial() -> None:
    tree = ast.parse((ROOT / "model_def.py").read_text())
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defined == ["SquadTrial"], defined


def test_the_upload_carries_the_package_and_the_entry_scripts() -> None:
    """Determined uploads the directory minus .detignore; the trial imports extractive_qa from it."""
    from tests.support import det_master

    files = {f.path for f in det_master.context_files(ROOT)}
    assert {"train.py", "model_def.py", "data.py", "startup-hook.sh", "extractive_qa/__init__.py"} <= files
    assert {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")} <= files
    assert not any(f.startswith(("tests/", "bench/")) for f in files)


# Who may ask transformers to open files itself: the hub-name paths (a name, not a directory:
# transformers fetches and caches it) and the tokenizer, whose files features.py lists. Every
# other model or config, in the package, the entry scripts and bench/, goes through the reader
# (model_files) and reaches transformers as objects.
OPENS_FILES = {
    "extractive_qa/trial/model_io.py",
    "extractive_qa/config/model_family.py",
    "extractive_qa/data/features.py",
}


def test_model_files_are_opened_only_through_the_reader() -> None:
    shipped = [p for p in python_files() if p.relative_to(ROOT).parts[0] != "tests"]
    callers = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in shipped
        if str(path.relative_to(ROOT)) not in OPENS_FILES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "from_pretrained"
    )
    assert not callers, f"read the model through model_io.load_qa_model or pretrained_config: {callers}"


def does_nothing(function: ast.FunctionDef) -> bool:
    """A body of a docstring, `pass`, `...` or `return None` / `return TrialExtras()` alone."""
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not body:
        return True
    if len(body) != 1:
        return False
    only = body[0]
    if isinstance(only, ast.Pass):
        return True
    return isinstance(only, ast.Return) and (
        only.value is None
        or (isinstance(only.value, ast.Constant) and only.value.value is None)
        or (isinstance(only.value, ast.Call) and not only.value.args and not only.value.keywords)
    )


def test_the_drivers_are_one_protocol_and_say_nothing_only_there(tmp_path: Path) -> None:
    """launch/trial_run.RunDriver is the interface train.py drives: one method, `run`, which both
    drivers write themselves (no step either inherits, so none is a no-op it has to carry);
    launch/driver.driver_for, beside neither driver, returns it; no driver method is a no-op of
    its own, and neither driver keeps state that a later step fills in (frozen dataclasses)."""
    import dataclasses

    from extractive_qa.launch import cluster_run, driver, local_run, trial_run

    protocol = next(
        c for c in ast.parse((PACKAGE / "launch" / "trial_run.py").read_text()).body
        if isinstance(c, ast.ClassDef) and c.name == "RunDriver"
    )  # fmt: skip
    assert [f.name for f in protocol.body if isinstance(f, ast.FunctionDef)] == ["run"]
    for run in (cluster_run.ClusterRun, local_run.LocalRun):
        assert trial_run.RunDriver in run.__mro__ and "run" in vars(run), run
        assert run.__dataclass_params__.frozen, run  # type: ignore[attr-defined]
        assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(run)), run
    assert driver.driver_for.__annotations__["return"] == "RunDriver"
    assert not hasattr(cluster_run, "driver_for") and not hasattr(local_run, "prepare")

    def no_ops(path: Path) -> list[str]:
        tree = ast.parse(path.read_text())
        drivers = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and "RunDriver" in ast.unparse(c)]
        return [f.name for c in drivers for f in c.body if isinstance(f, ast.FunctionDef) and does_nothing(f)]

    for name in ("cluster_run", "local_run"):
        assert no_ops(PACKAGE / "launch" / f"{name}.py") == [], name
    planted = tmp_path / "planted.py"  # the scan finds a no-op step
    planted.write_text("class X(RunDriver):\n    def report(self, slots):\n        '''Nothing.'''\n")
    assert no_ops(planted) == ["report"]


def test_the_trial_asks_nowhere_where_it_runs() -> None:
    """Everything that differs by where the trial runs comes from its driver (TrialExtras): the
    trial and its modules never ask Determined whether they are on a cluster, and never catch
    the error a local run's context raises for a cluster-only call."""
    asks = ("cluster_trial", "get_cluster_info", "InternalException", "get_trial_seed")
    offenders = [
        f"{path.relative_to(ROOT)}: {word}"
        for path in [ROOT / "model_def.py", *(PACKAGE / "trial").glob("*.py")]
        for word in asks
        if word in path.read_text()
    ]
    assert not offenders, offenders
    assert (ROOT / "model_def.py").read_text().count("\n") <= 220


def test_the_development_map_is_the_tree() -> None:
    """docs/development.md's table of the library's stages names every module of the package in
    its rows, each folder and base module once in the order they import each other, and nothing
    that is not there: moving or adding a module fails here until the map says so."""
    text = (ROOT / "docs" / "development.md").read_text()
    section = text.split("### The library's stages", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    firsts = [re.findall(r"`([a-z_]+)(?:\.py|/)`", row.split(" | ")[0]) for row in rows]
    listed = [name for names in firsts for name in names]
    assert listed == [*BASE, *STAGES, *TOP], listed
    named = set(re.findall(r"`([a-z_]+)`", section))
    missing = sorted(
        p.stem for p in PACKAGE.rglob("*.py") if p.stem != "__init__" and p.stem not in named | set(listed)
    )
    assert not missing, f"modules the map does not name: {missing}"
