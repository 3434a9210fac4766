"""Every figure of the README and docs is generated from its results file: `python3 -m bench.docs
--check` passes on the tree, and fails when a page or a results file is made false.

One idea: each way a page or a results file can be made false, planted in a copy of the tree,
against the one check that must name it."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import doc_blocks, docs, results_files
from extractive_qa.io.files import ROOT

EDITS = int(os.environ.get("DOCS_RANDOM_EDITS", "20"))  # per kind; each edit costs one check (~0.2 s)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the pages and results files that the check reads instead of the project's."""
    for part in ("README.md", "docs", "bench/results"):
        source, target = ROOT / part, tmp_path / part
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
    (tmp_path / "tests").symlink_to(ROOT / "tests")  # the tests the pages name, read only
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    monkeypatch.setattr(results_files, "ROOT", tmp_path)
    monkeypatch.setattr(results_files, "RESULTS", tmp_path / "bench" / "results")
    return tmp_path


def test_the_tree_passes_the_check() -> None:
    assert docs.main(["--check"]) == 0, "\n".join(docs.problems())


def test_a_figure_edited_in_a_block_is_named_with_its_page_and_line(tree: Path) -> None:
    readme = tree / "README.md"
    text = readme.read_text()
    block = next(m for m in docs.BLOCK.finditer(text) if m["spec"].startswith("first-command "))
    figure = re.search(r"F1 (\d+\.\d+)", block["body"])
    assert figure
    edited = text[: block.start()] + block.group().replace(figure[1], f"{float(figure[1]) + 1:.2f}", 1)
    readme.write_text(edited + text[block.end() :])
    line = text.count("\n", 0, block.start()) + 1
    assert [p for p in docs.problems() if p.startswith(f"README.md:{line}: block 'first-command ")]


def test_a_figure_in_prose_is_named_and_settings_are_not(tree: Path) -> None:
    page = tree / "docs" / "models.md"
    before = set(docs.problems())
    settings = "\nBatch 16, 3 epochs at 256 tokens, lr 2e-4, torch 2.13.0, Python 3.11, a 10 % warm-up.\n"
    page.write_text(page.read_text() + settings)
    assert set(docs.problems()) == before
    planted = "A step took 12.0 s, 3.1x faster, in 17 h over 1.5 GB/s; error 4.5e-4; F1 was 51.13."
    page.write_text(page.read_text() + planted + "\n")
    named = [p for p in set(docs.problems()) - before if p.startswith("docs/models.md:")]
    for figure in ("12.0 s", "3.1x", "17 h", "1.5 GB/s", "4.5e-4", "51.13"):
        assert any(f"'{figure}'" in p for p in named), (figure, named)


def test_a_results_file_without_its_machine_is_named(tree: Path) -> None:
    path = tree / "bench" / "results" / "cache-check-epyc-zen5.json"
    data = json.loads(path.read_text())
    data["machine"] = "x86_64, 2 cores"
    path.write_text(json.dumps(data))
    found = docs.problems()
    assert (
        "bench/results/cache-check-epyc-zen5.json: machine 'x86_64, 2 cores' names no CPU model or GPU"
        in found
    )
    assert any("block 'value cache-check-epyc-zen5.json" in p for p in found)


def test_a_page_naming_a_test_that_is_not_there_is_named(tree: Path) -> None:
    """A promise names the test that guards it; renaming or deleting that test fails the check."""
    page = tree / "docs" / "results.md"
    text = page.read_text()
    real = "`tests/test_docs.py::test_a_page_naming_a_test_that_is_not_there_is_named`"
    page.write_text(text + f"\nGuarded by {real}.\n")
    assert docs.problems() == []
    lines = text.count("\n") + 2
    for ref, why in (
        (
            "tests/test_docs.py::test_a_page_naming_a_guard",
            "tests/test_docs.py defines no test_a_page_naming_a_guard",
        ),
        ("tests/test_documents.py", "tests/test_documents.py does not exist"),
    ):
        page.write_text(text + f"\nGuarded by `{ref}`.\n")
        assert docs.problems() == [f"docs/results.md:{lines}: names a test that is not there: {why}"]


def test_a_report_kept_in_the_docs_is_its_json_table(tree: Path) -> None:
    report_md = tree / "docs" / "multi-machine" / "report.md"
    report_json = report_md.with_name("report.json")
    text, data = report_md.read_text(), json.loads(report_json.read_text())
    figure = re.search(r"\| (\d+\.\d\d) \|", text)
    assert figure and docs.problems() == []
    report_md.write_text(text.replace(figure.group(), f"| {float(figure[1]) * 1.07:.2f} |", 1))
    assert docs.problems() == ["docs/multi-machine/report.md: differs from the report.json beside it"]
    report_md.write_text(text)
    data["runs"][0]["samples_per_s"] *= 1.07
    report_json.write_text(json.dumps(data))
    assert "docs/multi-machine/report.md: differs from the report.json beside it" in docs.problems()
    del data["machine"]
    report_json.write_text(json.dumps(data))
    named = "docs/multi-machine/report.md: NoProvenance: no machine"
    assert any(p.startswith(named) for p in docs.problems())


def test_a_plot_that_no_longer_shows_its_results_file_is_named(tree: Path) -> None:
    """A plot names the file it was drawn from, with its SHA-256, in its PNG metadata."""
    report_json = tree / "docs" / "multi-machine" / "report.json"
    data = json.loads(report_json.read_text())
    data["runs"][-1]["efficiency"] *= 1.07
    report_json.write_text(json.dumps(data, indent=1))
    stale = "plot docs/multi-machine/report.png does not show report.json as it is now"
    assert any(p.startswith("docs/scaling.md:") and stale in p for p in docs.problems())
    png = tree / "docs" / "multi-machine" / "report.png"
    png.write_bytes(png.read_bytes().replace(b"sha256:", b"sha256:0", 1))  # a stamp of other bytes
    assert docs.png_text(png.read_bytes())["Source"].startswith("report.json sha256:0")


def test_a_yaml_table_follows_the_yamls(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolved learning rates and optimizer steps quoted for the shipped YAMLs are their dry
    run's: a YAML changed without its pages is named."""
    assert docs.problems() == []
    shutil.copy2(ROOT / "const.yaml", tree / "const.yaml")
    conf = tree / "const.yaml"
    conf.write_text(conf.read_text().replace("global_batch_size: 12", "global_batch_size: 16", 1))
    monkeypatch.setattr(doc_blocks, "ROOT", tree)
    doc_blocks.planned.cache_clear()
    try:
        named = docs.problems()
    finally:
        doc_blocks.planned.cache_clear()
    for block in ("dry-run const.yaml learning_rate", "dry-run const.yaml optimizer_steps"):
        assert any(p.startswith("README.md:") and f"block '{block}' differs" in p for p in named), block


def figures_in_blocks(root: Path) -> list[tuple[Path, int, str]]:
    """(page, offset, figure) for every decimal or signed number inside a generated block."""
    found = []
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = page.read_text()
        for block in docs.BLOCK.finditer(text):
            start = block.start("body")
            for m in re.finditer(r"(?<![\w.])[-+]?\d[\d,]*\.\d+(?!\w|\.\d)", block["body"]):
                found.append((page, start + m.start(), m.group()))
    return found


def moved(figure: str, rng: random.Random) -> str:
    """The figure 7 % larger or smaller, or with its sign flipped, printed as the page prints it."""
    value = float(figure.replace(",", ""))
    decimals = len(figure.split(".")[1])
    if figure[0] in "+-" and rng.random() < 0.5:
        return f"{-value:+.{decimals}f}"
    factor = rng.choice((0.93, 1.07))
    return f"{value * factor:{'+' if figure[0] in '+-' else ''},.{decimals}f}"


def test_random_figures_moved_on_a_page_fail_the_check(tree: Path) -> None:
    rng = random.Random(7)
    before = set(docs.problems())
    figures = figures_in_blocks(tree)
    chosen = rng.sample(figures, min(EDITS, len(figures)))
    missed = []
    for page, offset, figure in chosen:
        text = page.read_text()
        new = moved(figure, rng)
        if new == figure:
            continue
        page.write_text(text[:offset] + new + text[offset + len(figure) :])
        if not set(docs.problems()) - before:
            missed.append(f"{page.name}: {figure} -> {new}")
        page.write_text(text)
    assert not missed, missed


def numbers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], float]]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [(path, value)]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    return [leaf for key, item in items for leaf in numbers(item, (*path, key))]


def quoted(value: float, bodies: str) -> bool:
    """Whether a block shows this value as blocks print values (2-3 decimals, a count, percent)."""
    forms = {
        f"{value:.2f}",
        f"{value:.3f}",
        f"{value:,.0f}" if abs(value) >= 100 else "",
        f"{100 * value:.1f} %",
    }
    return any(form and re.search(rf"(?<![\d.]){re.escape(form)}(?![\d])", bodies) for form in forms)


class Tracked(dict):
    """A results file's JSON object that records the numbers a renderer reads from it."""

    def __init__(self, value: dict[str, Any], path: tuple[Any, ...], reads: set[tuple[Any, ...]]) -> None:
        super().__init__(value)
        self.path, self.reads = path, reads

    def __getitem__(self, key: Any) -> Any:
        return track(super().__getitem__(key), (*self.path, key), self.reads)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def items(self) -> Any:  # walking a file (its provenance, its keys) is not quoting its numbers
        return [(k, track(v, (*self.path, k), set())) for k, v in super().items()]

    def values(self) -> Any:
        return [v for _, v in self.items()]


class TrackedList(list):
    def __init__(self, value: list[Any], path: tuple[Any, ...], reads: set[tuple[Any, ...]]) -> None:
        super().__init__(value)
        self.path, self.reads = path, reads

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return track(super().__getitem__(index), (*self.path, index % len(self)), self.reads)

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))


def track(value: Any, path: tuple[Any, ...], reads: set[tuple[Any, ...]]) -> Any:
    if isinstance(value, dict):
        return Tracked(value, path, reads)
    if isinstance(value, list):
        return TrackedList(value, path, reads)
    if isinstance(value, int | float) and not isinstance(value, bool):
        reads.add(path)
    return value


def read_while_rendering(tree: Path, monkeypatch: pytest.MonkeyPatch) -> dict[tuple[Any, ...], str]:
    """(file, *path) of every number a block read -> the text of the blocks that read it."""
    reads: set[tuple[Any, ...]] = set()
    load = results_files.load
    monkeypatch.setattr(results_files, "load", lambda name: track(load(name), (Path(name).name,), reads))
    shown: dict[tuple[Any, ...], str] = {}
    for page in [tree / "README.md", *(tree / "docs").glob("*.md")]:
        for match in docs.BLOCK.finditer(page.read_text()):
            reads.clear()
            try:
                body = docs.render(match["spec"])
            except Exception:  # noqa: BLE001 -- a block that fails already is not this test's subject
                continue
            for path in reads:
                shown[path] = shown.get(path, "") + body
    monkeypatch.setattr(results_files, "load", load)
    return shown


def test_random_quoted_results_values_moved_fail_the_check(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(11)
    before = set(docs.problems())
    shown = read_while_rendering(tree, monkeypatch)
    leaves = []
    for path in sorted((tree / "bench" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        leaves += [
            (path, keys, v) for keys, v in numbers(data) if v and quoted(v, shown.get((path.name, *keys), ""))
        ]
    chosen = rng.sample(leaves, min(EDITS, len(leaves)))
    missed = []
    for path, keys, value in chosen:
        original = path.read_text()
        data = json.loads(original)
        holder = data
        for key in keys[:-1]:
            holder = holder[key]
        holder[keys[-1]] = value * rng.choice((0.93, 1.07))
        path.write_text(json.dumps(data))
        if not set(docs.problems()) - before:
            missed.append(f"{path.name} {keys}: {value}")
        path.write_text(original)
    # Quoted: a block read the value and shows it in a printed form. A value read and shown only
    # by coincidence (a per-seed F1 equal to another arm's mean) may not move its block.
    assert len(missed) <= 0.05 * len(chosen), missed


def plant(page: Path, old: str, new: str) -> None:
    text = page.read_text()
    assert old in text, old
    page.write_text(text.replace(old, new, 1))


def test_prose_beside_a_block_cannot_swap_its_machine_or_verdict(tree: Path) -> None:
    """The sentence around a block may not name the figure's machine or state its verdict on its
    own: a swapped machine, within<->outside, a flipped PASS and an unbacked comparison are named."""
    readme, results = tree / "README.md", tree / "docs" / "results.md"
    before = set(docs.problems())
    plant(readme, "on 2 cores it\nprinted", "on 2 cores of an Intel Xeon it\nprinted")
    plant(readme, "Over seeds 42-46,", "Within the ±1.5 rule over seeds 42-46,")
    plant(results, "What this says:", "Outside the rule, FAIL. What this says:")
    plant(tree / "docs" / "scaling.md", "## Where aggregation starts to cost F1",
          "Buckets run several times slower.\n\n## Where aggregation starts to cost F1")  # fmt: skip
    named = set(docs.problems()) - before
    for expected in (
        "'Xeon' names a figure's machine", "'Within the ±1.5 rule' is a verdict",
        "'Outside the rule' is a verdict", "'FAIL' is a verdict",
        "'several times' compares without a block", "'slower' compares without a block",
    ):  # fmt: skip
        assert any(expected in p for p in named), (expected, sorted(named))


def test_a_flipped_verdict_or_a_moved_derived_number_is_named(tree: Path) -> None:
    """A verdict edited inside its block, and a number the dry run derives typed outside a block
    or edited inside one, fail the check."""
    readme, cluster = tree / "README.md", tree / "docs" / "cluster.md"
    plant(readme, "no difference shown; passes the ±1.5 rule", "above zero; fails the ±1.5 rule")
    steps = doc_blocks.planned("multi_machine.yaml", ())["optimizer_steps"]
    spec = "dry-run multi_machine.yaml optimizer_steps"
    plant(cluster, f"<!-- generated: {spec} -->{steps:,}<!-- /generated --> or more",
          f"{steps:,} or more")  # fmt: skip
    plant(readme, f"<!-- generated: {spec} -->{steps:,}<!-- /generated -->",
          f"<!-- generated: {spec} -->{steps + 1:,}<!-- /generated -->")  # fmt: skip
    found = docs.problems()
    assert any("README.md" in p and "block 'paired cpu-precision-epyc-fast-masks.json" in p for p in found)
    derived = f"'{steps:,}' is derived by the dry run"
    assert any(p.startswith("docs/cluster.md") and derived in p for p in found)
    assert any("README.md" in p and f"block '{spec}' differs" in p for p in found)


def test_a_results_file_without_versions_or_its_hosts_cores_is_named(tree: Path) -> None:
    name = "first-command-fp32-epyc-zen5.json"
    path = tree / "bench" / "results" / name
    data = json.loads(path.read_text())
    row = data["rows"][0]
    del row["versions"]["determined"]
    row["machine"] = re.sub(r" of \d+ cores", "", row["machine"])
    path.write_text(json.dumps(data))
    named = [p for p in docs.problems() if p.startswith(f"bench/results/{name}")]
    assert any("versions without determined" in p for p in named), named
    assert any("does not name the threads used and the host's cores" in p for p in named), named


def test_two_cpus_never_share_a_label_and_a_cpu_without_its_family_is_refused(tree: Path) -> None:
    """A label carries the CPU's family and model: the two EPYC generations this project ran on
    are told apart, and a file whose CPU names no family (which would share a label) is refused."""
    zen4 = "AMD EPYC (cpu family 25 model 17), 2 threads of 2 cores, bf16 units: AVX512-BF16"
    zen5 = "AMD EPYC (cpu family 26 model 2), 2 threads of 2 cores, bf16 units: AVX512-BF16"
    assert results_files.machine_label(zen4) != results_files.machine_label(zen5)
    assert results_files.machine_label(zen5) == "AMD EPYC (family 26 model 2, AVX512-BF16)"
    path = tree / "bench" / "results" / "cache-check-epyc-zen5.json"
    data = json.loads(path.read_text())
    data["machine"] = "AMD EPYC, 2 threads of 2 cores, bf16 units: AVX512-BF16"
    path.write_text(json.dumps(data))
    assert any(
        p.startswith("bench/results/cache-check-epyc-zen5.json") and "does not name the CPU's family" in p
        for p in docs.problems()
    )


def test_a_backfilled_results_file_is_refused(tree: Path) -> None:
    """Provenance comes from the run that measured: a file whose fields were filled in later is
    refused, and so is every block that shows it."""
    path = tree / "bench" / "results" / "cache-check-epyc-zen5.json"
    data = json.loads(path.read_text())
    data["provenance_backfilled"] = ["machine: the host's cores from another file"]
    path.write_text(json.dumps(data))
    found = docs.problems()
    assert any(
        p.startswith("bench/results/cache-check-epyc-zen5.json: its provenance was filled in") for p in found
    )
    assert any("block 'value cache-check-epyc-zen5.json" in p for p in found)


def test_worded_figures_restated_verdicts_and_typed_settings_are_named(tree: Path) -> None:
    """Beside results, a quantity in words, a study's verdict restated, and a shipped YAML's rate
    typed by hand are figures: each must come from a block."""
    page = tree / "docs" / "results.md"
    before = set(docs.problems())
    page.write_text(page.read_text() + (
        "\nbf16 halved the matrix products, and the masks were the largest item of a step.\n\n"
        "The square root holds at 2x and is level with the linear rule: the best rule.\n\n"
        "local.yaml ships lr 2e-4 at 16 samples.\n"
    ))  # fmt: skip
    named = set(docs.problems()) - before
    for expected in (
        "'halved' is a measured quantity in words", "'the largest item' is a measured quantity",
        "'holds at' is a verdict", "'level with' is a verdict", "'the best rule' is a verdict",
        "'2e-4' is a setting of",
    ):  # fmt: skip
        assert any(expected in p for p in named), (expected, sorted(named))


def test_figures_of_two_machines_side_by_side_must_say_so(tree: Path) -> None:
    results = tree / "bench" / "results"
    other = json.loads((results / "first-command-epyc-zen5.json").read_text())
    for row in other["rows"]:
        row["machine"] = row["machine"].replace("cpu family 26 model 2", "cpu family 25 model 17")
    (results / "first-command-other-cpu.json").write_text(json.dumps(other))
    page = tree / "docs" / "results.md"
    text = page.read_text()
    block = "<!-- generated: first-command {} --><!-- /generated -->"
    one, two = block.format("first-command-epyc-zen5.json"), block.format("first-command-other-cpu.json")
    pair = f"\nbf16 printed {one} and {two}.\n"
    page.write_text(text + docs.rewritten(pair))
    assert any("sets figures of different machines side by side" in p for p in docs.problems())
    page.write_text(
        text + docs.rewritten(pair.replace("bf16 printed", "On different machines, bf16 printed"))
    )
    assert not any("side by side" in p for p in docs.problems())
