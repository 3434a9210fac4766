"""What a --checkpoint-dir holds, one line per checkpoint: which run wrote it (its name, model,
training file and SQuAD version), how far it trained, its latest EM/F1 and the file they were
scored on, and its size -- so that a
directory of look-alike UUIDs can be told apart, and the one to answer from, resume or delete
picked. Everything shown is read from the checkpoint's own records (metadata.json,
experiment.json); nothing in it is loaded or run."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

from extractive_qa.resume.identity import json_record, steps_completed

COLUMNS = ("written", "checkpoint", "run", "SQuAD", "model", "optimizer", "training file", "batches",
           "EM / F1", "validated on", "differs", "size")  # fmt: skip
# Recorded settings with a column of their own ("differs" lists the others a run changed).
SHOWN = {"name", "data.squad_version", "data.pretrained_model", "hyperparameters.optimizer",
         "data.train_file"}  # fmt: skip


def printable(value: Any, width: int = 60) -> str:
    """A recorded value as one short terminal-safe line (a record is data, not terminal commands)."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return text if len(text) <= width else text[: width - 3] + "..."


def size_on_disk(folder: Path) -> int:
    """Bytes of the regular files under `folder`; links are neither followed nor counted."""
    total = 0
    for top, _, files in os.walk(folder):  # os.walk does not descend into linked directories
        for name in files:
            try:
                info = os.lstat(os.path.join(top, name))
            except OSError:  # removed while listed (a retention sweep): not there any more
                continue
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


def checkpoint_row(folder: Path, shown: Path) -> dict[str, str]:
    """One checkpoint's line: what its records say, '?' for what they do not."""
    steps = steps_completed(folder)
    record = json_record(folder)
    identity = record.get("identity") if isinstance(record.get("identity"), dict) else {}
    length = record.get("train_length") if isinstance(record.get("train_length"), dict) else {}
    scores = record.get("validation") if isinstance(record.get("validation"), dict) else {}
    planned = length.get("batches")
    batches = "?" if steps is None else f"{steps}" + (f" of {planned}" if isinstance(planned, int) else "")
    em, f1 = scores.get("exact_match"), scores.get("f1")
    scored = f"{em:.2f} / {f1:.2f}" if isinstance(em, (int, float)) and isinstance(f1, (int, float)) else "-"
    settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
    validated = settings.get("data.validation_file", "?") if scored != "-" else "-"
    if settings.get("data.max_eval_examples"):
        validated = f"{validated} (first {settings['data.max_eval_examples']})"
    return {
        "written": time.strftime("%Y-%m-%d %H:%M", time.localtime(folder.stat().st_mtime)),
        "checkpoint": printable(shown, 200),
        "run": printable(identity.get("name", "?")),
        "SQuAD": printable(identity.get("data.squad_version", "?")),
        "model": printable(identity.get("data.pretrained_model", "?")),
        "optimizer": printable(identity.get("hyperparameters.optimizer", "?")),
        "training file": printable(identity.get("data.train_file", "?")),
        "batches": batches,
        "EM / F1": scored,
        "validated on": printable(validated),
        "size": f"{size_on_disk(folder) / 1e6:,.0f} MB",
    }


def identity_of(folder: Path) -> dict[str, Any]:
    identity = json_record(folder).get("identity")
    return identity if isinstance(identity, dict) else {}


def differences(identities: list[dict[str, Any]]) -> list[str]:
    """For each checkpoint, the recorded settings in which it differs from another checkpoint of a
    run of the same name (beyond the columns shown): `key=value`, '-' where none."""
    shown = []
    for identity in identities:
        same_name = [o for o in identities if o.get("name") == identity.get("name") and o is not identity]
        keys = sorted({k for o in same_name for k in {*o, *identity} if o.get(k) != identity.get(k)} - SHOWN)
        text = " ".join(f"{k.split('.')[-1]}={identity.get(k)}" for k in keys)
        shown.append(printable(text, 80) if text else "-")
    return shown


def checkpoint_table(checkpoint_dir: Path, start_dir: Path) -> list[str]:
    """The checkpoints in checkpoint_dir/determined, oldest first, as aligned lines (a header, then
    one per checkpoint); a single line saying so when there are none."""
    storage = checkpoint_dir / "determined"
    folders = [m.parent for m in storage.glob("*/metadata.json")] if storage.is_dir() else []
    folders = sorted((f for f in folders if not f.name.startswith(".")), key=lambda f: f.stat().st_mtime)
    if not folders:
        return [f"no checkpoints in {printable(storage, 200)} (a run writes them there; --checkpoint-dir "
                "names another directory)"]  # fmt: skip
    rows = []
    for folder in folders:
        shown = Path(os.path.relpath(folder, start_dir)) if folder.is_relative_to(start_dir) else folder
        rows.append(checkpoint_row(folder, shown))
    for row, differs in zip(rows, differences([identity_of(f) for f in folders]), strict=True):
        row["differs"] = differs
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS).rstrip()]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS).rstrip() for r in rows]
    return lines
