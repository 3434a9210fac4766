"""A checkpoint to resume, before the Trainer runs: the one --resume means (this run's newest,
by the settings each checkpoint records), rewritten into a private directory from its decoded
contents (checkpoint_rewrite) -- that copy is what Determined restores -- and compared with the
run's settings."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from extractive_qa.errors import ConfigError
from extractive_qa.launch.checkpoint_rewrite import REQUIRED, ExpectedState, rewrite
from extractive_qa.launch.identity import (
    checkpoint_identity,
    finished_result,
    identity_changes,
    steps_completed,
)

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


def restore_on_cluster(
    distributed: Any, checkpoint: Path, expected: Callable[[], ExpectedState], cleanup: contextlib.ExitStack
) -> str:
    """The storage id every rank of a cluster trial restores: the chief's rewritten copy of the
    master's latest checkpoint (verify_on_chief), which the chief removes after the run."""
    name, private = verify_on_chief(distributed, checkpoint, "DET_LATEST_CHECKPOINT", expected)
    if private is not None:
        cleanup.callback(private.remove)
    return name


def finished_resume(
    flag: str | Path, steps: int, total: int, shown: Path, copy: Path
) -> dict[str, Any] | None:
    """A resume of a checkpoint with `steps` batches trained, for a run of `total`: None when there
    is something left to train. --resume DIR is refused (a longer --batches continues it); `auto` /
    `latest` found this run already finished, which a restarted torchrun job or scheduler is told
    with the result its checkpoint recorded (`copy`: the rewritten copy of `shown`; exit 0)."""
    if steps < total:
        return None
    if flag not in ("auto", "latest"):
        raise ConfigError(
            f"--resume {shown}: the checkpoint has trained {steps} batches and this run's length is "
            f"{total}, so nothing is left to train. Give a longer --batches (or --epochs) to continue it."
        )
    logger.info("--resume %s: this run already finished (%d of %d batches) in %s; nothing left to train",
                flag, steps, total, shown)  # fmt: skip
    return finished_result(copy, shown, steps)


def latest_checkpoint(storage: Path, identity: dict[str, Any], flag: str) -> Path | None:
    """The complete checkpoint of this run (same identity) with the most steps in a local storage
    directory, or None (`--resume auto` then starts fresh; `--resume latest` refuses).

    Every rank of a torchrun job decides alone; they agree because they read the same directory
    (on several machines: shared storage, which resuming there needs anyway)."""
    found, others = [], 0
    for path in storage.glob("*/metadata.json") if storage.is_dir() else []:
        if path.parent.name.startswith("."):
            continue  # a running resume's private copy (private_copy), not a checkpoint
        steps = steps_completed(path.parent)
        if steps is None:
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
