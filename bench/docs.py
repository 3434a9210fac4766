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
- a results file does not name its command, commit, date and machine (bench.results_files).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from bench import doc_blocks, results_files
from extractive_qa import reading
from extractive_qa.files import ROOT

BLOCK = re.compile(r"<!-- generated: (?P<spec>[^>]*?) -->(?P<body>.*?)<!-- /generated -->", re.S)

UNIT = r"(?:s|min|ms|µs|us|h|hours?|minutes?|seconds?|x|%|MB|GB|KB|MiB|GiB|TB|seq/s|q/s|samples/s|questions/s|tokens/s|GFLOP/s|TFLOPS|GB/s|Gbit/s|Mbit/s)"
FIGURE = re.compile(
    rf"(?<![\w.\-/])[-+±]?\d[\d,]*(?:\.\d+)?\s?{UNIT}(?![\w/])"  # a number with a unit
    r"|(?<![\w.\-/])[-+±]?\d+\.\d+(?![\w.])"  # a decimal
)
# What looks like a figure and is not one: versions, dataset names, settings written in prose.
NOT_FIGURES = {
    r"\b(?:v|SQuAD |Python |PyTorch |torch |transformers |Determined |CUDA |numpy |NumPy |onnxruntime |ONNX Runtime |Apache License |CC BY-SA )\d+(?:\.\d+)*": "a version",
    r"\b\d+\.\d+\.\d+\b": "a version (x.y.z)",
    r"\bv?[12]\.[01]\b(?= (?:files?|questions?|training|validation|run|train|dev|data|style|script|text|model|metrics?|checkpoints?|recipe|evaluation)\b)": "SQuAD's version",
    r"\b(?:beta2|adam_beta2|dropout|p|warmup_ratio|lr|learning rate|weight_decay|label smoothing|threshold of|max_grad_norm)[ =:]+\d+(?:\.\d+)?": "a setting",
    r"\b\d+(?:\.\d+)? (?:x|×) \d+": "a product of settings (slots x batch)",
    r"\bsm_?\d+\b|\bcompute capability \d+\.\d+": "a GPU architecture",
    r"(?:about )?7 (?:h|hours)\b|30 (?:min|minutes) on 16 K80s|than 80 % per-GPU|> 80 %|efficiency 0\.83": "the write-up's figures (cited)",
    r"\b(?:1|2|4|8|16|32|64)x\b": "a scale: samples per optimizer step as a multiple of the reference",
    r"~?\d+ (?:Gbit/s|Mbit/s|GB/s)": "a link's rate (tc's setting, or an assumed link)",
    r"\b10 % (?:linear )?warm-up": "a setting (warmup_ratio)",
    r"\b(?:section|appendix|table|figure) \d+(?:\.\d+)*": "a citation's section",
    r"torchrun kills its workers 30 s": "torchrun's setting (its default)",
    r"\b\d+ s after\b|\bevery \d+ s\b|\bafter \d+ s\b|\bwithin \d+ s\b|\b\d+ s (?:timeout|limit|grace)": "a timeout setting",
    r"\b\d+(?:\.\d+)? ?(?:MB|GB|GiB|MiB)(?: of disk| limit| or more| per| each| at most| RAM)": "a size setting or requirement",
    r"\b\d+ (?:minutes|min) (?:a|per) (?:command|call)|\b20 minutes\b": "a limit set by the project",
    r"\b\d+(?:\.\d+)? ?M(?:-parameter| parameters)": "a model's parameter count (its config's)",
    r"\b\d+(?:\.\d+)? ?(?:GB|GiB|MB) by\s+default": "a default limit",
    r"\b95 % (?:interval|CI|t interval|confidence)|\[95 % CI\]": "the intervals' confidence level",
    r"(?:±|-|\+-)1\.5\b": "the rule's bound (bench.study.BOUND)",
}
EXEMPT = re.compile("|".join(f"(?:{p})" for p in NOT_FIGURES))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


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


def problems() -> list[str]:
    found = []
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        found += [f"bench/results/{path.name}: {p}" for p in results_files.file_problems(path)]
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
    return found


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
