"""Write, or check, every measured figure in README.md and docs/*.md from bench/results/.

    python3 -m bench.docs --write    # rewrite every generated block from the results files
    python3 -m bench.docs --check    # exit 1, naming page, line and block, where anything drifted

A figure lives in a generated block, `<!-- generated: NAME ARGS -->` ... `<!-- /generated -->`,
whose text `bench.doc_blocks` renders from the results files -- a table, or one value inside a
sentence. `--check` fails when:
- a block's text is not what its files give now (an edited figure, or a re-measured file whose
  page was not rewritten), or a block's name is unknown;
- a measured-looking number stands outside every block (a decimal, or a number with a unit of
  time, size, speed or ratio); what is not a measurement is in NOT_FIGURES, each with its reason;
- a results file does not name its command, commit, date, true machine (a CPU with its family
  and model) and versions, or its provenance was filled in after its run (bench.results_files);
- prose outside every block states a verdict (or restates a study's: "holds at", "level with"),
  gives a measured quantity in words ("halved", "thousands of"), names a machine a results file
  names, compares speeds in a paragraph that neither holds nor follows a block, or types a number
  the dry run derives from a shipped YAML or a rate a shipped YAML sets (VERDICT, WORDED,
  machine_words, COMPARISON, derived_numbers, shipped_rates);
- a study's report kept in the docs (docs/*/report.md) is not the table of the report.json beside
  it, or that JSON does not name its provenance;
- a plot a page shows does not name, in its PNG metadata, the results file beside it that it was
  drawn from with that file's SHA-256 as it is now (`--write` draws it again);
- a test a page names as the guard of a promise (`tests/test_x.py`, `tests/test_x.py::test_y`)
  is not there: a renamed or deleted test takes its pages' promises with it;
- a paragraph sets figures of different machines side by side without saying so.

One idea: the one check that a page's figures, words and promises are its results files' and
tests', each way a page can drift named with its page and line.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import shlex
import sys
from pathlib import Path

from bench import doc_blocks, results_files
from extractive_qa import cli, scaling_report
from extractive_qa.io import reading
from extractive_qa.io.files import ROOT, drawn_from

IMAGE = re.compile(r"!\[[^\]]*\]\((?P<target>(?![a-z]+://)[^)\s]+\.png)\)")  # the project's own plots
TEST_REF = re.compile(r"\btests/[\w/]+\.py(?:::\w+)*")
BLOCK = re.compile(r"<!-- generated: (?P<spec>[^>]*?) -->(?P<body>.*?)<!-- /generated -->", re.S)

UNIT = (
    r"(?:s|min|ms|µs|us|h|hours?|minutes?|seconds?|x|%|KB|MB|GB|TB|MiB|GiB|seq/s|q/s|samples/s"
    r"|questions/s|tokens/s|GFLOP/s|TFLOPS|GB/s|Gbit/s|Mbit/s)"
)
FIGURE = re.compile(
    rf"(?<![\w.\-/])[-+±]?\d[\d,]*(?:\.\d+)?\s?{UNIT}(?![\w/])"  # a number with a unit
    r"|(?<![\w.\-/])[-+±]?\d+\.\d+(?:e[-+]?\d+)?(?!\w|\.\d)"  # a decimal, 2.5 or 1.73e-4 (not 2.13.0)
)
# What looks like a figure and is not a measurement, each with its reason.
NOT_FIGURES = (
    (
        "a version",
        r"\b(?:v|SQuAD |Python |PyTorch |torch |transformers |Determined |CUDA |NumPy |onnxruntime "
        r"|Apache License |CC BY-SA |Ubuntu |NCCL |NGC PyTorch |tokenizers |compute capability "
        r"|>= ?)+\d+(?:\.\d+)*|\b\d\d\.\d\d release",
    ),
    ("a setting", r"\b(?:adam_beta2|beta2|warmup_ratio|lr) \d+\.\d+|\b10 % (?:linear )?warm-up"),
    ("slots x batch, a product of settings", r"\b\d+ x \d+"),
    ("a scale: samples per step as a multiple of the reference", r"(?:1|2|4|8|16|32|64)x\b"),
    ("a link's rate: tc's setting, or an assumed link", r"~?\d+ (?:Gbit/s|Mbit/s|GB/s)"),
    ("a timeout: torchrun's", r"\b30 s after (?:it forwards|forwarding)"),
    ("a requirement or a default limit", r"\b\d+ ?(?:GB|GiB) (?:of disk|by\s+default)"),
    ("a model's parameter count, from its config", r"\b\d+\.\d+ M(?:-parameter|\s+parameters)"),
    ("the intervals' confidence level", r"\b95 % (?:interval|CI|t interval)"),
    ("the rule's bound, bench.study.BOUND", r"(?:±|-)1\.5\b"),
    ("a citation's section", r"\bsection \d+\.\d+"),
    (
        "the write-up's figures, cited",
        r"(?:about )?7 (?:h|hours)\b|30 (?:min|minutes) on 16 K80s|than 80 % per-GPU|> 80 %|efficiency 0\.83",
    ),
)
# Each must start a number of its own: "3.1x" is not the scale "1x", "17 h" not the write-up's "7 h".
EXEMPT = re.compile("|".join(rf"(?<![\d.,])(?:{pattern})" for _, pattern in NOT_FIGURES))

# Words a block renders from its numbers and prose may not state on its own: a verdict on a
# measurement (doc_blocks.verdict's words, a study's PASS/FAIL) and a comparison of speeds. A
# comparison may stand in a paragraph that holds the block it reads from.
VERDICT = re.compile(
    r"(?i:no difference shown)|\b(?:PASS|FAIL)\b|\b(?i:above|below) zero\b"
    r"|\b(?i:passes|fails|within|outside) (?:the )?(?:±[\d.]+ )?(?:rule|bound)\b"
    # a study restated in other words: what it found holds, matches, is level or best
    r"|\b(?i:holds at|within noise|level with|the best (?:rule|setting|recipe|choice|of them))\b"
)
# Measured quantities written as words: beside results they are figures, so a block gives them.
WORDED = re.compile(
    r"\b(?i:halved|doubled|tripled|twice as (?:fast|slow|long)|(?:about |roughly )?a minute of|an hour of"
    r"|thousands of|hundreds of|the largest item|the largest share|most of (?:its|the step's) time)\b"
)
COMPARISON = re.compile(r"\b(?:faster|slower|several times|(?:an )?orders? of magnitude)\b")
# Named beside a figure and not a measurement's machine, each with its reason.
NOT_MACHINES = (
    ("a card's specification: its dense bf16 peak", r"H100 SXM"),
    ("the cards CUDA 12 supports", r"T4, V100, A10, A100, L4, H100"),
)
EXEMPT_MACHINES = re.compile("|".join(pattern for _, pattern in NOT_MACHINES))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def reports() -> list[Path]:
    """The studies' own reports kept in the docs, each written from the report.json beside it."""
    return sorted((ROOT / "docs").glob("*/report.md"))


def report_text(report_md: Path) -> str:
    data = results_files.load(str(report_md.with_name("report.json").relative_to(ROOT)))
    if problems := results_files.data_problems(data):
        raise results_files.NoProvenance("; ".join(problems))
    return scaling_report.markdown(data)


def png_text(data: bytes) -> dict[str, str]:
    """A PNG's tEXt entries (where matplotlib writes `savefig(metadata=...)`)."""
    entries: dict[str, str] = {}
    at = 8 if data.startswith(b"\x89PNG\r\n\x1a\n") else len(data)
    while at + 8 <= len(data):
        length, kind = int.from_bytes(data[at : at + 4], "big"), data[at + 4 : at + 8]
        body = data[at + 8 : at + 8 + length]
        if kind == b"tEXt" and b"\0" in body:
            key, value = body.split(b"\0", 1)
            entries[key.decode("latin-1")] = value.decode("latin-1")
        if kind == b"IEND":
            break
        at += 12 + length
    return entries


def plot_problem(png: Path) -> str | None:
    """Why a plot may not show the results file of its name beside it (X.png: X.json) as that file
    is now; None when it does."""
    data_file = png.with_suffix(".json")
    if not png.is_file() or not data_file.is_file():
        return f"or the {data_file.name} it is drawn from is missing"
    data = reading.read_bytes(data_file, reading.RECORD)
    source = png_text(reading.read_bytes(png, reading.MODEL_FILE)).get("Source")
    if source != drawn_from(data_file.name, data)["Source"]:
        return f"does not show {data_file.name} as it is now: run `python3 -m bench.docs --write`"
    if problems := results_files.data_problems(reading.parse_json(data, data_file)):
        return f"shows {data_file.name}, which has {'; '.join(problems)}"
    return None


def images(page: Path, text: str) -> list[tuple[int, Path]]:
    """(line, file) of every PNG the page shows."""
    return [
        (text.count("\n", 0, m.start()) + 1, (page.parent / m["target"]).resolve())
        for m in IMAGE.finditer(text)
    ]


def test_ref_problem(ref: str) -> str | None:
    """Why `tests/FILE.py::NAME::...` names nothing in this tree, or None."""
    file, *names = ref.split("::")
    path = ROOT / file
    if not path.is_file():
        return f"{file} does not exist"
    scope: list[ast.stmt] = _parsed(reading.read_text(path, reading.MODEL_FILE))
    for name in names:
        found = [n for n in scope if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name]
        if not found:
            return f"{file} defines no {name}"
        scope = found[0].body
    return None


@functools.lru_cache(maxsize=64)
def _parsed(source: str) -> list[ast.stmt]:
    """A test file's statements, parsed once per content (a check names each file many times)."""
    return ast.parse(source).body


def render(spec: str) -> str:
    name, *args = shlex.split(spec)
    if name not in doc_blocks.BLOCKS:
        raise KeyError(f"unknown block {name!r}; known: {', '.join(sorted(doc_blocks.BLOCKS))}")
    return doc_blocks.BLOCKS[name](*args).strip("\n")


def rewritten(text: str) -> str:
    """The page with every block's text rendered anew: a block that starts on a line of its own
    keeps its text on lines of their own; one inside a sentence stays inline."""

    def one(match: re.Match[str]) -> str:
        try:
            body = render(match["spec"])
        except Exception:  # noqa: BLE001 -- left as it is; problems() names the block and why
            return match.group()
        if match["body"].startswith("\n"):
            body = f"\n{body}\n"
        return f"<!-- generated: {match['spec']} -->{body}<!-- /generated -->"

    return BLOCK.sub(one, text)


def prose(text: str) -> str:
    """The page's words outside blocks, code and link targets, line numbers kept."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group())

    for pattern in (
        r"```.*?```",
        BLOCK.pattern,
        r"`[^`\n]*`",
        r"\]\([^)\s]*\)",
        r"<!--.*?-->",
        r"https?://\S+",
    ):
        text = re.sub(pattern, blank, text, flags=re.S)
    return text


def free_figures(text: str) -> list[tuple[int, str]]:
    """Measured-looking numbers outside blocks; a sentence may wrap, so lines are matched as one."""
    words = prose(text)
    flat = EXEMPT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), words.replace("\n", " "))
    return [(words.count("\n", 0, m.start()) + 1, m.group().strip()) for m in FIGURE.finditer(flat)]


def machine_words() -> set[str]:
    """The model word of every machine a results file names (EPYC, Xeon, H100, ...), the kept
    files of unrecorded provenance included (a machine that measured here once is one a page could
    name): a page names the machine of a figure only inside the figure's block."""
    words = set()
    for path in sorted((ROOT / "bench" / "results").rglob("*.json")):
        for machine in re.findall(r'"machine": "([^"]+)"', reading.read_text(path, reading.RECORD)):
            for part in machine.split("; "):
                label = results_files.machine_label(part)
                model = re.sub(r"^(?:AMD|Intel|NVIDIA)\s+", "", label).split(" ")[0]
                if model:
                    words.add(model)
    return words


def derived_numbers() -> dict[str, str]:
    """What the dry run derives from each shipped YAML and a page may give only from a dry-run
    block: resolved learning rates, optimizer steps, warm-up steps and samples per step."""
    numbers = {}
    for config in sorted(p.name for p in doc_blocks.ROOT.glob("*.yaml")):  # the YAMLs planned() reads
        plan = doc_blocks.planned(config, ())
        for field in ("optimizer_steps", "warmup_steps", "samples_per_optimizer_step"):
            value = plan.get(field)
            if isinstance(value, int) and value >= 100:
                # samples per step only as such: 384 samples, not 384 tokens
                after = r"(?= samples)" if field == "samples_per_optimizer_step" else ""
                numbers[rf"(?:{value:,}|{value}){after}"] = f"{config} {field}"
        if isinstance(plan.get("learning_rate"), float) and plan["learning_rate"] != plan.get(
            "reference_learning_rate"
        ):
            numbers[re.escape(doc_blocks.exponent_text(plan["learning_rate"]))] = f"{config} learning_rate"
    return numbers


def shipped_rates() -> dict[str, str]:
    """The learning rate each shipped YAML states (at its reference batch), as a page would type
    it (2e-4, 2.0e-4): beside results it is a setting the dry-run block gives."""
    rates = {}
    for config in sorted(p.name for p in doc_blocks.ROOT.glob("*.yaml")):
        rate = doc_blocks.planned(config, ()).get("reference_learning_rate")
        if isinstance(rate, float):
            text = doc_blocks.exponent_text(rate)
            mantissa, _, exponent = text.partition("e")
            forms = {text, f"{float(mantissa):.1f}e{exponent}"} if exponent else {text}
            rates["|".join(map(re.escape, sorted(forms)))] = f"{config} learning_rate"
    return rates


def free_claims(text: str, machines: set[str], derived: dict[str, str]) -> list[tuple[int, str]]:
    """Verdicts, machine names, unbacked comparisons and derived numbers outside blocks."""
    words = prose(text)
    verdict = "is a verdict outside a generated block"
    found = [(m.start(), f"{m.group()!r} {verdict}") for m in VERDICT.finditer(words)]
    worded = "is a measured quantity in words outside a generated block: give the figure's block"
    found += [(m.start(), f"{m.group()!r} {worded}") for m in WORDED.finditer(words)]
    flat = EXEMPT_MACHINES.sub(lambda m: " " * len(m.group()), words)
    if machines:
        pattern = rf"\b(?:{'|'.join(map(re.escape, sorted(machines)))})\b"
        found += [
            (m.start(), f"{m.group()!r} names a figure's machine outside its block")
            for m in re.finditer(pattern, flat)
        ]
    # A paragraph that holds a block, or follows one, reads from it.
    spans = [(m.start(), m.end(), "generated" in m.group()) for m in re.finditer(r"(?:.+\n?)+", text)]
    backed = [(a, b) for i, (a, b, has) in enumerate(spans) if has or (i and spans[i - 1][2])]
    for m in COMPARISON.finditer(words):
        if not any(a <= m.start() < b for a, b in backed):
            found.append((m.start(), f"{m.group()!r} compares without a block in its paragraph"))
    for pattern, source in derived.items():
        for m in re.finditer(rf"(?<![\w.,/-])(?:{pattern})(?![\w/]|[.,]\d)", words):
            what = f"is derived by the dry run ({source}): use a dry-run block"
            found.append((m.start(), f"{m.group()!r} {what}"))
    # A shipped YAML's rate typed on a line that speaks of the YAMLs (as text or as code); the same
    # figure in a citation of a paper's or another project's recipe is theirs, not a setting here.
    spans = prose_with_code(text)
    # Anchored at the line's start: unanchored, each position of a line began a scan to its end.
    lines = list(re.finditer(r"^[^\n]*?(?:\.yaml\b|\bYAMLs?\b|\bshipped\b)[^\n]*", spans, re.M))
    for pattern, source in shipped_rates().items():
        for line in lines:
            for m in re.finditer(rf"(?<![\w.,/-])(?:{pattern})(?![\w/]|[.,]\d)", line.group()):
                what = f"is a setting of {source}: give it from the dry run's block"
                found.append((line.start() + m.start(), f"{m.group()!r} {what}"))
    return sorted((words.count("\n", 0, at) + 1, what) for at, what in found)


def prose_with_code(text: str) -> str:
    """The page's words outside blocks and fenced code, inline code kept."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group())

    for pattern in (r"```.*?```", BLOCK.pattern, r"\]\([^)\s]*\)", r"<!--.*?-->", r"https?://\S+"):
        text = re.sub(pattern, blank, text, flags=re.S)
    return text


SAYS_MACHINES_DIFFER = re.compile(r"(?i)\b(?:different|other|another) (?:machines?|CPUs?|GPUs?)\b")


def mixed_machines(text: str, labels: set[str]) -> list[tuple[int, str]]:
    """Paragraphs whose inline blocks give figures of different machines side by side without a
    word saying so (a table names each row's machine; a sentence must say it)."""
    found = []
    for paragraph in re.finditer(r"(?:.+\n?)+", text):
        inline = [m for m in BLOCK.finditer(paragraph.group()) if "|---" not in m["body"]]
        named = {label for m in inline for label in labels if label in m["body"]}
        named = {n for n in named if not any(n != o and n in o for o in named)}  # the longest label
        if len(named) > 1 and not SAYS_MACHINES_DIFFER.search(prose(paragraph.group())):
            line = text.count("\n", 0, paragraph.start()) + 1
            which = "; ".join(sorted(named))
            what = f"sets figures of different machines side by side ({which}) without saying so"
            found.append((line, what))
    return found


def machine_labels() -> set[str]:
    labels = set()
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        for machine in re.findall(r'"machine": "([^"]+)"', reading.read_text(path, reading.RECORD)):
            labels |= {results_files.machine_label(part) for part in machine.split("; ")}
    return labels


def problems() -> list[str]:
    found = []
    machines, derived, labels = machine_words(), derived_numbers(), machine_labels()
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        found += [f"bench/results/{path.name}: {p}" for p in results_files.file_problems(path)]
    for page in [*pages(), *reports()]:
        text = reading.read_text(page, reading.MODEL_FILE)
        for line, png in images(page, text):
            if problem := plot_problem(png):
                found.append(f"{page.relative_to(ROOT)}:{line}: plot {png.relative_to(ROOT)} {problem}")
        for match in TEST_REF.finditer(text):
            if problem := test_ref_problem(match[0]):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{page.relative_to(ROOT)}:{line}: names a test that is not there: {problem}")
    for report in reports():
        shown = report.relative_to(ROOT)
        try:
            if reading.read_text(report, reading.MODEL_FILE) != report_text(report):
                found.append(f"{shown}: differs from the report.json beside it")
        except Exception as err:  # noqa: BLE001 -- a missing or incomplete report.json, named
            found.append(f"{shown}: {type(err).__name__}: {err}")
    for page in pages():
        shown = page.relative_to(ROOT)
        text = reading.read_text(page, reading.MODEL_FILE)
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            try:
                expected = render(match["spec"])
            except Exception as err:  # noqa: BLE001 -- a missing file or field, named with its block
                found.append(f"{shown}:{line}: block {match['spec']!r}: {type(err).__name__}: {err}")
                continue
            if match["body"].strip("\n") != expected:
                found.append(f"{shown}:{line}: block {match['spec']!r} differs from its results files")
        found += [
            f"{shown}:{line}: {figure!r} is a figure outside a generated block"
            for line, figure in free_figures(text)
        ]
        found += [f"{shown}:{line}: {what}" for line, what in free_claims(text, machines, derived)]
        found += [f"{shown}:{line}: {what}" for line, what in mixed_machines(text, labels)]
    return found


@cli.boundary
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite every generated block")
    mode.add_argument("--check", action="store_true", help="exit 1 where a page or a results file drifted")
    args = parser.parse_args(argv)
    if args.write:
        for page in pages():
            text = reading.read_text(page, reading.MODEL_FILE)
            if (new := rewritten(text)) != text:
                page.write_text(new)
                print(f"rewrote {page.relative_to(ROOT)}")
        for report in reports():
            text = reading.read_text(report, reading.MODEL_FILE)
            if (new := report_text(report)) != text:
                report.write_text(new)
                print(f"rewrote {report.relative_to(ROOT)}")
        for page in [*pages(), *reports()]:
            for _, png in images(page, reading.read_text(page, reading.MODEL_FILE)):
                draw = next((d for pattern, d in doc_blocks.PLOTS if re.search(pattern, png.name)), None)
                if draw and png.with_suffix(".json").is_file() and plot_problem(png):
                    draw(png.with_suffix(".json"), png)
                    print(f"drew {png.relative_to(ROOT)}")
    if found := problems():
        print("\n".join(found), file=sys.stderr)
        print(
            f"{len(found)} problem(s): run `python3 -m bench.docs --write`, or mend the results file",
            file=sys.stderr,
        )
        return 1
    print("every generated block matches its results files; no figure outside them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
