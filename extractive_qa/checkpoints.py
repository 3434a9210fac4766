"""Checking a checkpoint before any work (files, metadata, CRCs) and staging it for
Determined's local storage on resume.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from extractive_qa.det_internals import uploaded
from extractive_qa.outputs import check_output_dir
from extractive_qa.pickle_scan import check_checkpoint_pickles
from extractive_qa.settings import ConfigError


def check_checkpoint(checkpoint: Path, what: str) -> int:
    """A complete, undamaged Determined checkpoint, or a ConfigError naming the file; returns its
    steps_completed. Runs before any training, so a truncated copy never ends in torch's raw
    zip-reader traceback after the model and data are loaded."""
    import zipfile

    state, meta = checkpoint / "state_dict.pth", checkpoint / "metadata.json"
    needed = (state, meta, checkpoint / "trial_state.pkl")
    if not any(path.is_file() for path in needed):
        raise ConfigError(
            f"{what} {checkpoint}: not a checkpoint written by train.py "
            "(needs state_dict.pth, metadata.json and trial_state.pkl)."
        )
    for path in needed:
        if not path.is_file():
            raise ConfigError(
                f"{what} {checkpoint}: incomplete checkpoint, {path.name} is missing "
                "(not written by train.py, or the copy was cut short)."
            )
    try:
        steps = int(json.loads(meta.read_text())["steps_completed"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{what} {meta}: damaged checkpoint metadata ({err}).") from None
    try:  # torch.save writes a zip archive; check every member against its CRC
        with zipfile.ZipFile(state) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise ConfigError(
            f"{what} {state}: damaged or truncated checkpoint ({err}); resume from an earlier "
            "checkpoint or copy this one again."
        ) from None
    if bad is not None:
        raise ConfigError(f"{what} {state}: damaged checkpoint (member {bad} fails its CRC).")
    # Determined unpickles both files; nothing in them may name code to run.
    check_checkpoint_pickles(checkpoint)
    return steps


def prepare_resume(checkpoint: Path, storage_root: Path) -> tuple[str, int]:
    """Make a checkpoint directory restorable by Determined's local storage; return (id, steps)."""
    steps = check_checkpoint(checkpoint, "--resume")
    storage_root.mkdir(parents=True, exist_ok=True)
    target = storage_root / checkpoint.name
    if not (target.exists() and target.resolve() == checkpoint.resolve()):
        target = storage_root / f"resume-{checkpoint.name}"
        # Every local rank gets here (torchrun): link under a private name, then rename over the
        # target -- atomic, so concurrent ranks cannot trip over each other's link.
        private = storage_root / f".{target.name}.{os.getpid()}"
        private.symlink_to(checkpoint.resolve(), target_is_directory=True)
        os.replace(private, target)
    return target.name, steps


def verify_on_chief(distributed: Any, checkpoint: Path, what: str) -> None:
    """The chief alone reads and CRC-checks the checkpoint (bert-base: ~1.3 GB from shared storage,
    once instead of once per rank); every rank gets its verdict and a damaged checkpoint stops
    them all with the same message (exit 2)."""
    verdict: dict[str, Any] | None = None
    if distributed.rank == 0:
        logging.getLogger("squad").info(
            "verifying %s %s for all %d ranks", what, checkpoint, distributed.size
        )
        try:
            verdict = {"steps": check_checkpoint(checkpoint, what)}
        except ConfigError as err:
            verdict = {"error": str(err)}
    verdict = distributed.broadcast(verdict)
    if "error" in verdict:
        raise ConfigError(verdict["error"])


def check_local_storage(checkpoint_dir: Path, root: Path) -> None:
    """Before a local run starts: its checkpoint directory can hold checkpoints without eating the
    run (not inside the upload) and can be written."""
    check_outside_upload(checkpoint_dir, root, "--checkpoint-dir")
    check_output_dir(checkpoint_dir, "--checkpoint-dir")


def prepare_local_storage(checkpoint_dir: Path) -> None:
    """Just before a local run trains: its storage is not world-writable, and partial checkpoints of
    an interrupted run are named."""
    base = checkpoint_dir / "determined"
    # Determined creates its storage root world-writable (common/storage/base.py, umask 0, mode
    # 0o777) so that containers of any user can write on shared storage. On one machine that lets
    # any local user plant a checkpoint; made here first, it is the user's alone.
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    mode = base.stat().st_mode
    if mode & 0o022:
        os.chmod(base, mode & ~0o022)
    partial = sorted(p.name for p in base.iterdir() if p.is_dir() and not (p / "metadata.json").is_file())
    if partial:
        logging.getLogger("squad").warning(
            "%s holds %d partial checkpoint(s) of an interrupted run (no metadata.json): %s; "
            "they cannot be resumed from and can be deleted.",
            base, len(partial), ", ".join(partial[:5]),
        )  # fmt: skip


def check_outside_upload(path: Path, root: Path, flag: str) -> None:
    """Determined copies the project directory (minus .detignore) into every checkpoint's code/;
    a directory of outputs inside it would be copied into itself, run after run."""
    if not path.resolve().is_relative_to(root.resolve()) or path.resolve() == root.resolve():
        if path.resolve() == root.resolve():
            raise ConfigError(f"{flag} {path}: is the project directory itself; use {root / 'checkpoints'}.")
        return
    if uploaded(root.resolve(), path.resolve()):
        raise ConfigError(
            f"{flag} {path}: inside the project directory, which Determined copies into every "
            "checkpoint (code/): the checkpoints would be copied into themselves. Use "
            f"{root / 'checkpoints'} or {root / 'runs'} (both in .detignore), or a directory "
            "outside the project."
        )


def latest_checkpoint(storage: Path) -> Path:
    """The complete checkpoint with the most steps in a local storage directory (`--resume latest`).

    Every rank of a torchrun job decides alone; they agree because they read the same directory
    (on several machines: shared storage, which resuming there needs anyway)."""
    found = []
    for path in storage.glob("*/metadata.json") if storage.is_dir() else []:
        try:
            steps = int(json.loads(path.read_text())["steps_completed"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # damaged or partial: never the one to resume from
        found.append((steps, path.stat().st_mtime, path.parent))
    if not found:
        raise ConfigError(
            f"--resume latest: no complete checkpoint in {storage}; start without --resume, or "
            "give the --checkpoint-dir the run wrote to."
        )
    return max(found)[2]
