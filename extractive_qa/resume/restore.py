"""A checkpoint to resume, before the Trainer runs: the one --resume means (this run's newest,
by the settings each checkpoint records), rewritten into a private directory from its decoded
contents (checkpoint_rewrite) -- that copy is what Determined restores -- and compared with the
run's settings."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import secrets
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from extractive_qa import det_internals
from extractive_qa.errors import ConfigError, DataError
from extractive_qa.io import reading
from extractive_qa.resume.archive import not_owned
from extractive_qa.resume.identity import (
    checkpoint_identity,
    finished_result,
    identity_changes,
    steps_completed,
)
from extractive_qa.resume.rewrite import (
    RECORDS,
    REQUIRED,
    STATE,
    TRIAL_STATE,
    ExpectedState,
    rewrite,
    source_limits,
)
from extractive_qa.storage import buckets, private_copy, source, where
from extractive_qa.storage.private_copy import private_root
from extractive_qa.storage.source import CheckpointSource

logger = logging.getLogger("squad")
RESUME_FILES = (STATE, TRIAL_STATE, *RECORDS)  # every file a resume decodes

# --------------------------------------------------------------------------------------------
# A checkpoint to resume, rewritten into a private directory.
# --------------------------------------------------------------------------------------------

PRIVATE_PREFIX = "resume-"
OWNER = ".owner"  # "<uid> <token>", held (flock) by the process whose resume made the directory


class PrivateCopy:
    """A new directory in private_root() (mkdtemp: 0700) for a checkpoint's rewritten copy, with
    an owner record (this user and a random token) locked while the process that made it lives. A
    run killed before it removed its copy (kill -9, a lost machine) leaves the lock free, and the
    next resume on this machine removes the copy."""

    def __init__(self) -> None:
        root = private_root()
        self.path = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=root))
        self.token = secrets.token_hex(16)
        self.lock = os.open(self.path / OWNER, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        os.write(self.lock, f"{os.getuid()} {self.token}\n".encode())
        self.identity = self._identity()

    def _identity(self) -> tuple[int, int, int, int]:
        info = os.lstat(self.path)
        return info.st_dev, info.st_ino, info.st_uid, stat.S_IMODE(info.st_mode)

    def verify(self) -> None:
        """Just before Determined reads it: still the directory made here (same inode, this user's,
        0700), and its owner record still this process's token."""
        try:
            same = self._identity() == self.identity and stat.S_ISDIR(os.lstat(self.path).st_mode)
            with reading.open_regular(self.path / OWNER, reading.RECORD, follow_links=False) as file:
                words = owner_record(file)
        except (OSError, reading.UnreadableFile):
            same, words = False, []
        if not same or words != [str(os.getuid()), self.token]:
            raise ConfigError(
                f"{self.path}: the checked copy of the checkpoint was replaced after it was written; "
                "refusing to restore it. Resume again."
            )

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self.lock)


def owner_record(file: Any) -> list[str]:
    """An owner record's words ("<uid> <token>"); [] for anything else."""
    return file.read(128).decode("ascii", "replace").split()


def made_by_a_resume(path: Path) -> Any:
    """`path`'s owner record, open (its descriptor carries the lock), if `path` is a copy a resume
    of this user made: a directory of this user's holding a plain-file record (read through the
    one reader, never through a link) of this user and a 32-digit token; else None."""
    try:
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return None
        record = reading.open_regular(path / OWNER, reading.RECORD, follow_links=False)
    except (OSError, reading.UnreadableFile):
        return None
    words = owner_record(record)
    if len(words) != 2 or words[0] != str(os.getuid()) or len(words[1]) != 32:
        record.close()
        return None
    return record


def remove_stale_copies() -> None:
    """Copies in private_root() whose owner is gone: each named with its size, and removed. A live
    run's copy is locked and kept; a directory without a resume's owner record is never touched."""
    root = private_root()
    for path in sorted(root.glob(f"{PRIVATE_PREFIX}*")):
        lock = made_by_a_resume(path)
        if lock is None:
            continue
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while its owner lives
            size = sum(f.stat().st_size for f in path.iterdir() if f.is_file() and not f.is_symlink())
            shutil.rmtree(path, ignore_errors=True)
            logger.warning(
                "removed %s (%.0f MB): the private copy of a resume whose process was killed "
                "before it could remove it", path, size / 1e6,
            )  # fmt: skip
        except BlockingIOError:
            pass
        finally:
            lock.close()


@dataclasses.dataclass(frozen=True)
class Resumed:
    """A checkpoint to continue, rewritten: where it was named or found (`shown`), its private
    copy (what Determined restores), the batches it trained and its experiment.json as the
    rewrite parsed it -- the one read every later check of the resume takes."""

    shown: Path
    copy: PrivateCopy
    steps: int
    record: dict[str, Any]


def prepare_resume(
    checkpoint: Path,
    expected: ExpectedState,
    what: str = "--resume",
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> Resumed:
    """A private copy of `checkpoint` rewritten from its decoded contents (resume.rewrite).
    Determined restores it by its absolute path (det_internals.restore_id). `on_record` checks the
    checkpoint's experiment.json before its state is read. The caller removes the copy when the
    run ends; a SIGTERM while it is written removes it too."""
    remove_stale_copies()
    if not checkpoint.is_dir():
        raise ConfigError(f"{what} {checkpoint}: {reading.not_a_checkpoint(Path(checkpoint))}")
    present = [name for name in REQUIRED if (checkpoint / name).exists() or (checkpoint / name).is_symlink()]
    if not present:
        raise ConfigError(
            f"{what} {checkpoint}: not a checkpoint written by train.py "
            "(needs state_dict.pth, metadata.json and trial_state.pkl)."
        )
    private = PrivateCopy()
    try:
        with terminated_as_interrupt():
            done = rewrite(checkpoint, private.path, expected, checkpoint, on_record)
    except ConfigError as err:  # named as the user gave it: --resume, or a cluster's latest checkpoint
        private.remove()
        message = str(err)
        raise ConfigError(message if message.startswith(what) else f"{what} {message}") from None
    except BaseException:
        private.remove()
        raise
    return Resumed(checkpoint, private, done.steps, done.record)


class Terminated(KeyboardInterrupt):
    """A SIGTERM while a resume writes its copy: unwinds like Ctrl-C (the copy is removed) and
    ends the command as SIGTERM would (exit 143), with one line instead of a silent death."""


@contextlib.contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """While the checkpoint is decoded and rewritten (seconds to minutes), SIGTERM raises
    Terminated so that the half-written copy is removed, as Ctrl-C's KeyboardInterrupt does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def verify_per_machine(
    distributed: Any, checkpoint: CheckpointSource, what: str, expected: ExpectedState
) -> tuple[str, PrivateCopy | None]:
    """A cluster's checkpoint, in any storage: each machine's local chief rewrites it into a
    private directory on its own machine (private_root: no other user can reach it, which a
    directory in the shared storage could not promise), from its decoded contents -- once per
    machine, not once per rank -- and its local ranks restore that copy. From a bucket the local
    chief first fetches the files a resume reads, each within its limit by the listing, into a
    private directory of its own (removed once rewritten). A damaged, foreign or unreadable
    checkpoint stops every rank with the same message (exit 2). Returns the copy's storage id and,
    on a local chief, the copy (None elsewhere) to remove after the run."""
    verdict: dict[str, Any] | None = None
    private: PrivateCopy | None = None
    if distributed.local_rank == 0:
        logger.info("verifying %s %s for the %d local rank(s)", what, checkpoint.url, distributed.local_size)
        try:
            resumed = _rewrite_cluster_checkpoint(checkpoint, expected, what)
            private = resumed.copy
            verdict = {"steps": resumed.steps, "private": det_internals.restore_id(private.path)}
        except (ConfigError, DataError) as err:
            verdict = {"error": str(err)}
    errors = [v["error"] for v in distributed.allgather(verdict) if v is not None and "error" in v]
    if errors:
        if private is not None:
            private.remove()
        raise ConfigError(errors[0])
    restore = distributed.broadcast_local(verdict["private"] if verdict is not None else None)
    return str(restore), private


def _rewrite_cluster_checkpoint(checkpoint: CheckpointSource, expected: ExpectedState, what: str) -> Resumed:
    """The files a resume reads, where they lie or fetched privately, rewritten; a refusal names
    the checkpoint where it lies, not the download's directory."""
    limits = source_limits(expected)
    with private_copy.fetched(checkpoint, what, limits.__getitem__, limits.__contains__) as local:
        if checkpoint.in_place is None:
            files = sorted(p for p in local.iterdir() if p.is_file())
            names, size = ", ".join(p.name for p in files), sum(p.stat().st_size for p in files) / 1e6
            logger.info("%s %s: downloaded %s (%.1f MB)", what, checkpoint.url, names, size)
        try:
            return prepare_resume(local, expected, what)
        except ConfigError as err:
            raise ConfigError(str(err).replace(str(local), checkpoint.url)) from None


def restore_on_cluster(
    distributed: Any, checkpoint: CheckpointSource, expected: ExpectedState, cleanup: contextlib.ExitStack
) -> str:
    """The storage id every rank of a cluster trial restores: its machine's rewritten copy of the
    master's latest checkpoint (verify_per_machine), which the local chief removes after the run."""
    name, private = verify_per_machine(distributed, checkpoint, "DET_LATEST_CHECKPOINT", expected)
    if private is not None:
        cleanup.callback(private.remove)
    return name


def finished_resume(flag: str | Path, resumed: Resumed, total: int) -> dict[str, Any] | None:
    """A resume of a checkpoint for a run of `total` batches: None when there is something left to
    train. --resume DIR is refused (a longer --batches continues it); `auto` / `latest` found this
    run already finished, which a restarted torchrun job or scheduler is told with the result its
    checkpoint recorded (exit 0)."""
    steps, shown = resumed.steps, resumed.shown
    if steps < total:
        return None
    if flag not in ("auto", "latest"):
        raise ConfigError(
            f"--resume {shown}: the checkpoint has trained {steps} batches and this run's length is "
            f"{total}, so nothing is left to train. Give a longer --batches (or --epochs) to continue it."
        )
    logger.info("--resume %s: this run already finished (%d of %d batches) in %s; nothing left to train",
                flag, steps, total, shown)  # fmt: skip
    return finished_result(resumed.record, shown, steps)


def same_run_checkpoints(storage: Path, identity: dict[str, Any]) -> list[Path]:
    """The complete checkpoints of this run (same identity) in a local storage directory that
    this user owns, newest last (by steps, then time)."""
    return [path for _, _, path in sorted(_this_runs(storage, identity)[0])]


def _this_runs(
    storage: Path, identity: dict[str, Any]
) -> tuple[list[tuple[int, float, Path]], int, list[Path]]:
    """(this run's checkpoints as (steps, mtime, path), how many belong to other runs, the ones
    another user owns)."""
    found, others, foreign = [], 0, []
    for path in storage.glob("*/metadata.json") if storage.is_dir() else []:
        if path.parent.name.startswith("."):
            continue  # a running resume's private copy (private_copy), not a checkpoint
        if not owned_by_this_user(path.parent):
            foreign.append(path.parent)
            continue
        steps = steps_completed(path.parent)
        if steps is None:
            continue  # damaged or partial: never the one to resume from
        saved = checkpoint_identity(path.parent)
        if saved is None or identity_changes(saved, identity):
            others += 1  # another experiment's, or another config's: not this run to continue
            continue
        found.append((steps, path.stat().st_mtime, path.parent))
    return found, others, foreign


def latest_checkpoint(storage: Path, identity: dict[str, Any], flag: str) -> Path | None:
    """The complete checkpoint of this run (same identity) with the most steps in a local storage
    directory, or None (`--resume auto` then starts fresh; `--resume latest` refuses).

    Only checkpoints this user owns count: a storage root others can write (Determined makes
    shared_fs roots 0777) may hold another user's checkpoint of the same settings with more
    steps, or one with a file another user put there, which is listed and skipped, never trained
    on. Every rank of a torchrun job decides alone; they agree because they read the same
    directory (on several machines: shared storage, which resuming there needs anyway)."""
    found, others, foreign = _this_runs(storage, identity)
    if foreign:
        logger.warning(
            "--resume %s: skipped %d checkpoint(s) in %s that are not only yours (a file another user "
            "owns or can change: %s); only your own are continued",
            flag, len(foreign), storage, ", ".join(p.name for p in sorted(foreign)[:3]),
        )  # fmt: skip
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


def owned_by_this_user(checkpoint: Path) -> bool:
    """Whether the checkpoint directory is this user's, not a link, and every file a resume reads
    of it is this user's own (archive.not_owned: not a link, nobody else can change it)."""
    try:
        info = checkpoint.lstat()
    except OSError:
        return False
    if info.st_uid != os.getuid() or stat.S_ISLNK(info.st_mode):
        return False
    for name in RESUME_FILES:
        try:
            info = (checkpoint / name).lstat()
        except FileNotFoundError:
            continue  # a file it lacks: the identity check or the rewrite then decides
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode) or not_owned(info) is not None:
            return False
    return True


def resume_from(resume: str | Path, checkpoint_dir: Path, identity: dict[str, Any]) -> Path | None:
    """The checkpoint --resume names (None: `auto` found none of this run, start fresh); one in a
    bucket (s3://, gs://, azure://) is kept in this user's private cache and read there."""
    storage = checkpoint_dir / "determined"
    if buckets.is_url(resume):
        found: Path | None = private_copy.cached(
            where.source_for(str(resume), "--resume"), "--resume", source.checkpoint_limit
        )
    elif resume not in ("auto", "latest"):
        found = Path(resume)
    else:
        found = latest_checkpoint(storage, identity, str(resume))
    if found is None:
        logger.info("--resume auto: no checkpoint of this run in %s; starting from the beginning", storage)
    return found
