"""Checking a checkpoint before any work (files, metadata, CRCs) and staging it for
Determined's local storage on resume.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extractive_qa.settings import ConfigError

if TYPE_CHECKING:
    pass





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

