"""The results files in bench/results/ as the docs read them: values with their provenance.

Every JSON file there names the command that wrote it, the commit it ran at, the date, the
machine -- a CPU's model with the threads used and the host's cores, or a GPU's name with its
host's cores -- and the software versions (Python, torch, transformers, NumPy, Determined; CUDA
and the driver on a GPU), either at its top level or on each of its rows (a file that gathers
runs of several machines). `Results` hands out a file's values together with
the short machine label and date that a rendered row carries, so a row is always labelled with
the machine of the file its figures came from. A file whose machine names no CPU model or GPU is
refused as a whole: a figure without its machine cannot be compared with anything.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractive_qa.io import reading
from extractive_qa.io.files import ROOT

RESULTS = ROOT / "bench" / "results"
PROVENANCE = ("command", "commit", "date", "machine")
VERSIONS = ("python", "torch", "transformers", "numpy", "determined")  # bench.common.software_versions
GPU_VERSIONS = ("cuda", "driver")
# A machine is named by its maker and model: a CPU's model name or a GPU's.
MAKERS = re.compile(r"\b(AMD|Intel|NVIDIA|Apple|Ampere|AWS Graviton|Arm)\b")


class NoProvenance(ValueError):
    pass


@dataclass(frozen=True)
class Provenance:
    command: str
    commit: str
    date: str
    machine: str

    @property
    def label(self) -> str:
        """The machine in a few words, as a table row names it."""
        return machine_label(self.machine)


FAMILY = re.compile(r"cpu family (\d+) model (\d+)")


def machine_label(machine: str) -> str:
    """A GPU's name, or a CPU's maker and model name with its family and model numbers and the
    bf16 units it has -- two CPUs that differ in any of them never share a label; a study whose
    rows ran on several machines names each ("A; B")."""
    if "; " in machine:
        return "; ".join(dict.fromkeys(machine_label(part) for part in machine.split("; ")))
    if "NVIDIA" in machine:
        return re.sub(r"\s*\(.*", "", machine)
    name = re.sub(r"\((?:R|TM)\)|\bProcessor\b|\bCPU\b", "", re.split(r" \(|,", machine)[0])
    units = "AMX" if "AMX tiles" in machine else "AVX512-BF16" if "AVX512-BF16" in machine else ""
    units = units or ("no bf16 units" if "bf16 units: none" in machine else "")
    family = FAMILY.search(machine)
    inside = [f"family {family[1]} model {family[2]}"] if family else []
    inside += [units] if units else []
    return " ".join(name.split()) + (f" ({', '.join(inside)})" if inside else "")


def provenance_problems(record: dict[str, Any]) -> list[str]:
    """What a provenance record lacks; empty when it names all four, a machine's model, the
    threads used and the host's cores, and the versions (bench.common.software_versions)."""
    missing = [k for k in PROVENANCE if not str(record.get(k) or "").strip()]
    problems = [f"no {k}" for k in missing]
    machine = str(record.get("machine") or "")
    if machine and not MAKERS.search(machine):
        problems.append(f"machine {machine!r} names no CPU model or GPU")
    return problems + machine_problems(record, machine) + version_problems(record, machine)


def machine_problems(record: dict[str, Any], machine: str) -> list[str]:
    """A machine is true when it says how much of the host the figure used: a GPU's host cores,
    or a CPU's threads and the host's cores (a 2-thread figure on a 16-core host is not a 2-core
    machine's)."""
    problems = []
    for part in machine.split("; "):
        if "NVIDIA" in part:
            if not re.search(r"\(\d+ CPU cores\)", part):
                problems.append(f"machine {part!r} does not name its host's CPU cores")
        elif part and not re.search(r"\d+ threads of \d+ cores", part):
            problems.append(f"machine {part!r} does not name the threads used and the host's cores")
        elif part and not FAMILY.search(part):
            problems.append(f"machine {part!r} does not name the CPU's family and model")
    return problems


def version_problems(record: dict[str, Any], machine: str) -> list[str]:
    versions = record.get("versions")
    if not isinstance(versions, dict):
        return ["no versions"]
    needed = VERSIONS + (GPU_VERSIONS if "NVIDIA" in machine else ())
    missing = [k for k in needed if not str(versions.get(k) or "").strip()]
    return [f"versions without {', '.join(missing)}"] if missing else []


def ci_seconds_per_file(text: str) -> list[dict[str, float]]:
    """Each suite's seconds per test file in a `bench.ci_fresh_clone` results file (the lines
    `tests/conftest.py` prints after a run), the main suite's first."""
    suites = []
    for part in text.partition("\n\n")[2].split("\n== "):
        files = {m[2]: float(m[1]) for m in re.finditer(r"^\s*([\d.]+)\s+(tests/\S+\.py)$", part, re.M)}
        if files:
            suites.append(files)
    return suites


def path_of(name: str) -> Path:
    """A file of bench/results by its name, or another of the project's results by its path
    (docs/multi-machine/report.json, which a study writes beside its plot)."""
    return ROOT / name if "/" in name else RESULTS / name


def load(name: str) -> Any:
    return reading.read_json(path_of(name), reading.RECORD)


def file_problems(path: Path) -> list[str]:
    """Why a results file's provenance is incomplete (its top level, or each of its rows)."""
    return data_problems(reading.read_json(path, reading.RECORD))


BACKFILLED = "provenance_backfilled"  # a record's fields filled in after its run, not by it


def data_problems(data: Any) -> list[str]:
    if not isinstance(data, dict):
        return ["not a JSON object"]
    filled = [data, *(r for r in data.get("rows") or [] if isinstance(r, dict))]
    if any(BACKFILLED in record for record in filled):
        return [
            "its provenance was filled in after the run (provenance_backfilled); a results file's "
            "provenance is the run's own: measure it again with its benchmark"
        ]
    if all(k in data for k in PROVENANCE):
        return provenance_problems(data)
    rows = data.get("rows")
    if isinstance(rows, list) and rows and all(isinstance(r, dict) and "command" in r for r in rows):
        return [f"row {i}: {p}" for i, r in enumerate(rows) for p in provenance_problems(r)]
    return provenance_problems(data)


class Results:
    """One results file: its values, and the provenance every figure drawn from it carries."""

    def __init__(self, name: str) -> None:
        self.name = name
        data = load(name)
        if problems := data_problems(data):  # the bytes read once: the ones checked are the ones used
            raise NoProvenance(f"{path_of(name).relative_to(ROOT)}: {'; '.join(problems)}")
        self.data: dict[str, Any] = data

    def provenance(self, row: dict[str, Any] | None = None) -> Provenance:
        source = row if row is not None and "machine" in row else self.data
        return Provenance(*(str(source[k]) for k in PROVENANCE))

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


def num(value: float, decimals: int = 2, sign: bool = False) -> str:
    """A figure as the docs print it: fixed decimals, but never fewer than 3 significant digits
    (so that a value moved by a few per cent shows), thousands separated."""
    if not math.isfinite(value):
        return str(value)
    magnitude = math.floor(math.log10(abs(value))) if value else 0
    decimals = max(decimals, 2 - magnitude) if value else decimals
    text = f"{value:{'+' if sign else ''},.{decimals}f}"
    return text


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def measured_on(results: Results, row: dict[str, Any] | None = None) -> str:
    """`machine, date` for a row or a caption."""
    prov = results.provenance(row)
    return f"{prov.label}, {prov.date}"
