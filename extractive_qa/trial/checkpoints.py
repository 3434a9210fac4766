"""A checkpoint to resume, before the Trainer runs: the one --resume means (this run's newest,
by the settings each checkpoint records), rewritten into a private directory from its decoded
contents (checkpoint_rewrite) -- that copy is what Determined restores -- and compared with the
run's settings."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from extractive_qa.config.run_plan import IDENTITY_RECORD, identity_changes
from extractive_qa.errors import ConfigError
from extractive_qa.trial.checkpoint_rewrite import REQUIRED, ExpectedState, rewrite

logger = logging.getLogger("squad")

# --------------------------------------------------------------------------------------------
# A checkpoint to resume, rewritten into a private directory.
# --------------------------------------------------------------------------------------------

PRIVATE_PREFIX = ".resume-"
OWNER_LOCK = ".owner"  # held (flock) by the process whose resume made the directory
UNLOCKED_GRACE_S = 60  # a directory made this recently may not have its lock yet


class PrivateCopy:
    """A new directory only this user can enter (mkdtemp: 0700) beside the checkpoints, locked
    while the process that made it lives. A run killed before it removed its copy (kill -9, a
    lost machine) leaves the lock free, and the next resume there removes the copy."""

    def __init__(self, storage_root: Path) -> None:
        storage_root.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=storage_root))
        self.lock = os.open(self.path / OWNER_LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        fcntl.flock(self.lock, fcntl.LOCK_EX)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self.lock)


def remove_stale_copies(storage_root: Path) -> None:
    """Private copies in `storage_root` whose owner is gone: each named with its size, and removed
    (another live run's copy is locked and kept; another user's is not ours to touch)."""
    if not storage_root.is_dir():
        return
    for path in sorted(storage_root.glob(f"{PRIVATE_PREFIX}*")):
        try:
            info = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        try:
            lock = os.open(path / OWNER_LOCK, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if time.time() - info.st_mtime < UNLOCKED_GRACE_S:
                continue  # being made right now
            lock = None
        except OSError:
            continue
        try:
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while its owner lives
            size = sum(f.stat().st_size for f in path.iterdir() if f.is_file() and not f.is_symlink())
            shutil.rmtree(path, ignore_errors=True)
            logger.warning(
                "removed %s (%.0f MB): the private copy of a resume whose process was killed "
                "before it could remove it", path, size / 1e6,
            )  # fmt: skip
        except BlockingIOError:
            pass
        finally:
            if lock is not None:
                os.close(lock)


def prepare_resume(
    checkpoint: Path,
    storage_root: Path,
    expected: ExpectedState,
    what: str = "--resume",
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[PrivateCopy, int]:
    """A private copy of `checkpoint` rewritten from its decoded contents (checkpoint_rewrite) in
    Determined's storage: (the copy, its steps). `on_record` checks the checkpoint's experiment.json
    before its state is read. The caller removes the copy when the run ends."""
    remove_stale_copies(storage_root)
    if not checkpoint.is_dir():
        raise ConfigError(f"{what} {checkpoint}: not a directory.")
    present = [name for name in REQUIRED if (checkpoint / name).exists() or (checkpoint / name).is_symlink()]
    if not present:
        raise ConfigError(
            f"{what} {checkpoint}: not a checkpoint written by train.py "
            "(needs state_dict.pth, metadata.json and trial_state.pkl)."
        )
    private = PrivateCopy(storage_root)
    try:
        steps = rewrite(checkpoint, private.path, expected, checkpoint, on_record).steps
    except ConfigError as err:  # named as the user gave it: --resume, or a cluster's latest checkpoint
        private.remove()
        message = str(err)
        raise ConfigError(message if message.startswith(what) else f"{what} {message}") from None
    except BaseException:
        private.remove()
        raise
    return private, steps


def verify_on_chief(
    distributed: Any, checkpoint: Path, what: str, expected: Callable[[], ExpectedState]
) -> tuple[str, PrivateCopy | None]:
    """A cluster's checkpoint on shared_fs: the chief alone rewrites it into a private directory
    beside it (the storage every rank sees), from its decoded contents (bert-base: ~1.3 GB read
    once instead of once per rank), and names it; every rank then restores that copy. A damaged
    or foreign checkpoint stops them all with the same message (exit 2). Returns the copy's
    storage id and, on the chief, the copy (None elsewhere) to remove after the run."""
    verdict: dict[str, Any] | None = None
    private: PrivateCopy | None = None
    if distributed.rank == 0:
        logger.info("verifying %s %s for all %d ranks", what, checkpoint, distributed.size)
        try:
            private, steps = prepare_resume(checkpoint, checkpoint.parent, expected(), what)
            verdict = {"steps": steps, "private": private.path.name}
        except ConfigError as err:
            verdict = {"error": str(err)}
    verdict = distributed.broadcast(verdict)
    if "error" in verdict:
        raise ConfigError(verdict["error"])
    return str(verdict["private"]), private


def finished_resume(flag: str | Path, source: Any, total: int) -> dict[str, Any] | None:
    """A resume with nothing left to train (the checkpoint's steps reach the run's `total`
    batches): --resume DIR is refused (a longer --batches continues it); `auto` / `latest` found
    this run already finished, which a restarted torchrun job or scheduler is told with the result
    its checkpoint recorded (exit 0). None: train on."""
    steps = source.steps_completed
    if steps < total:
        return None
    if flag not in ("auto", "latest"):
        raise ConfigError(
            f"--resume {source.resumed}: the checkpoint has trained {steps} batches and this run's "
            f"length is {total}, so nothing is left to train. Give a longer --batches (or --epochs) "
            "to continue it."
        )
    logger.info("--resume %s: this run already finished (%d of %d batches) in %s; nothing left to train",
                flag, steps, total, source.resumed)  # fmt: skip
    return finished_result(source.resumed_copy, source.resumed, steps)


def checkpoint_record(checkpoint: Path, key: str) -> dict[str, Any] | None:
    """What a checkpoint recorded of its run (experiment.json): its `identity`
    (run_plan.run_identity) or `train_length`; None without a record."""
    value = json_record(checkpoint).get(key)
    return value if isinstance(value, dict) else None


def checkpoint_identity(checkpoint: Path) -> dict[str, Any] | None:
    return checkpoint_record(checkpoint, "identity")


def note_length_change(checkpoint: Path, length: dict[str, int]) -> None:
    """A resume with another total length than the checkpoint's run was planned for: say what
    happens to the schedule (it is planned again for the new total)."""
    planned = checkpoint_record(checkpoint, "train_length")
    if planned is not None and planned != length:
        was, now = (" ".join(f"{v} {k}" for k, v in d.items()) for d in (planned, length))
        logger.warning(
            "--resume: the checkpoint's run was planned for %s, this one for %s; the warm-up/decay "
            "schedule is planned again for %s and the learning rate follows it from the "
            "checkpoint's step on", was, now, now,
        )  # fmt: skip


def latest_checkpoint(storage: Path, identity: dict[str, Any], flag: str) -> Path | None:
    """The complete checkpoint of this run (same identity) with the most steps in a local storage
    directory, or None (`--resume auto` then starts fresh; `--resume latest` refuses).

    Every rank of a torchrun job decides alone; they agree because they read the same directory
    (on several machines: shared storage, which resuming there needs anyway)."""
    found, others = [], 0
    for path in storage.glob("*/metadata.json") if storage.is_dir() else []:
        if path.parent.name.startswith("."):
            continue  # a running resume's private copy (private_copy), not a checkpoint
        try:
            steps = int(json.loads(path.read_text())["steps_completed"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # damaged or partial: never the one to resume from
        saved = checkpoint_identity(path.parent)
        if saved is None or identity_changes(saved, identity):
            others += 1  # another experiment's, or another config's: not this run to continue
            continue
        found.append((steps, path.stat().st_mtime, path.parent))
    if found:
        return max(found)[2]
    if flag == "auto":
        return None
    elsewhere = f" ({others} checkpoint(s) there belong to other runs or configs)" if others else ""
    raise ConfigError(
        f"--resume latest: no complete checkpoint of this run in {storage}{elsewhere}. Use "
        "--resume auto to start fresh when there is none, --resume DIR for a particular "
        "checkpoint, or give the --checkpoint-dir the run wrote to."
    )


def resume_from(resume: str | Path, checkpoint_dir: Path, identity: dict[str, Any]) -> Path | None:
    """The checkpoint --resume names (None: `auto` found none of this run, start fresh)."""
    storage = checkpoint_dir / "determined"
    if resume not in ("auto", "latest"):
        return Path(resume)
    found = latest_checkpoint(storage, identity, str(resume))
    if found is None:
        logger.info("--resume auto: no checkpoint of this run in %s; starting from the beginning", storage)
    else:
        logger.info("--resume %s: continuing from %s", resume, found)
    return found


def check_same_data(checkpoint: Path, train_sha256: str, allow_changed: bool, shown: Path) -> None:
    """The training questions this run read against those the checkpoint's run read (their SHA-256,
    subsets included): another file at the same path is another run, refused as changed settings
    are (--allow-changed continues anyway). Checkpoints from before the digest was recorded pass."""
    saved = json_record(checkpoint).get("train_sha256")
    if saved is None or saved == train_sha256:
        return
    change = f"the training data differ (SHA-256 {str(saved)[:12]}... -> {train_sha256[:12]}...)"
    if allow_changed:
        logger.warning("--resume %s with changed data (--allow-changed): %s", shown, change)
        return
    raise ConfigError(
        f"--resume {shown}: {change}: the file at data.train_file (or the subset data.max_train_examples "
        "takes) is not what the checkpoint was trained on. Restore that data, or pass --allow-changed to "
        "continue its state on this data."
    )


def finished_result(checkpoint: Path, shown: Path, steps: int) -> dict[str, Any]:
    """What a finished run's checkpoint records of it: its latest validation, steps, where it is."""
    record = json_record(checkpoint)
    validation = record.get("validation") if isinstance(record.get("validation"), dict) else {}
    scores = {k: v for k, v in validation.items() if isinstance(v, float)}
    return {**scores, "checkpoint": str(shown), "steps_completed": steps, "already_finished": True}


def json_record(checkpoint: Path) -> dict[str, Any]:
    """experiment.json of a checkpoint (the rewritten copy: already parsed once), or {}."""
    try:
        value = json.loads((checkpoint / IDENTITY_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def check_same_run(
    record: dict[str, Any], identity: dict[str, Any], allow_changed: bool, shown: Path
) -> None:
    """--resume DIR: the checkpoint's recorded settings (its experiment.json) against this run's; a
    difference is an error naming each field (both values) unless --allow-changed says it is
    meant. `shown` is the directory the user gave."""
    saved = record.get("identity")
    if not isinstance(saved, dict):
        logger.warning("--resume %s: the checkpoint records no experiment settings (%s); "
                       "they cannot be compared with this run's", shown, IDENTITY_RECORD)  # fmt: skip
        return
    changes = identity_changes(saved, identity)
    if not changes:
        return
    listed = "; ".join(changes)
    if allow_changed:
        logger.warning("--resume %s with changed settings (--allow-changed): %s", shown, listed)
        return
    raise ConfigError(
        f"--resume {shown}: this run's settings differ from the checkpoint's ({listed}). "
        "Resume with the config it was written with, or pass --allow-changed to continue its "
        "state under the new settings."
    )
