"""A checkpoint to resume, before the Trainer runs: the one --resume means (this run's newest,
by the settings each checkpoint records), copied privately and checked whole (files, sizes, and
every pickle scanned against an allowlist of exact names) -- the copy is what Determined
restores -- and compared with the run's settings."""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import pickle
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from extractive_qa.config.run_plan import IDENTITY_RECORD, identity_changes
from extractive_qa.errors import ConfigError

logger = logging.getLogger("squad")

# --------------------------------------------------------------------------------------------
# A checkpoint to resume, and local checkpoint storage.
# --------------------------------------------------------------------------------------------


def check_checkpoint(checkpoint: Path, what: str, shown: Path | None = None) -> int:
    """A complete, undamaged Determined checkpoint, or a ConfigError naming the file (under
    `shown`, the user's directory, where `checkpoint` is a private copy of it); returns its
    steps_completed. Runs before any training, so a truncated copy never ends in torch's raw
    zip-reader traceback after the model and data are loaded."""
    try:
        return _check_checkpoint(checkpoint, what)
    except ConfigError as err:
        if shown is None:
            raise
        raise ConfigError(str(err).replace(str(checkpoint), str(shown))) from None


def _check_checkpoint(checkpoint: Path, what: str) -> int:
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
    with state.open("rb") as head:
        magic = head.read(4)
    if magic != ZIP_MAGIC:
        # torch.save writes a zip archive from byte 0; zipfile also accepts one after a prefix,
        # and torch.load would unpickle such a prefix unchecked.
        raise ConfigError(
            f"{what} {state}: not a torch.save archive from its first byte (starts {magic!r}); "
            "refusing it. Resume only checkpoints this project wrote."
        )
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


# What Determined's controller reads when it restores a checkpoint (pytorch/_pytorch_trial.py
# _load: state_dict.pth, trial_state.pkl or the older workload_sequencer.pkl), and the records
# beside them. hf/ and code/ are not read by a resume.
RESTORED_FILES = ("state_dict.pth", "trial_state.pkl", "workload_sequencer.pkl", "metadata.json",
                  "load_data.json", IDENTITY_RECORD)  # fmt: skip


def private_copy(checkpoint: Path, storage_root: Path, what: str = "--resume") -> Path:
    """The files a resume reads, copied into a new directory only this user can enter.

    The scan and Determined's unpickling then read the same bytes: checking the user's directory
    and letting Determined read it again seconds later leaves a window in which whoever can
    write there swaps a file. Symlinked files are refused rather than followed."""
    storage_root.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix=".resume-", dir=storage_root))  # mode 0700
    try:
        for name in RESTORED_FILES:
            try:
                source = os.open(checkpoint / name, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue
            except OSError as err:
                reason = f"cannot be read as a plain file ({err})"
                raise ConfigError(f"{what} {checkpoint / name}: {reason}.") from None
            with os.fdopen(source, "rb") as src, open(private / name, "xb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return private


def prepare_resume(checkpoint: Path, storage_root: Path, what: str = "--resume") -> tuple[Path, int]:
    """A private, checked copy of a checkpoint in Determined's storage: (its directory, steps).
    The caller removes the directory when the run ends."""
    private = private_copy(checkpoint, storage_root, what)
    try:
        steps = check_checkpoint(private, what, shown=checkpoint)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return private, steps


def verify_on_chief(distributed: Any, checkpoint: Path, what: str) -> str:
    """A cluster's checkpoint on shared_fs: the chief alone copies the files Determined restores
    into a private directory beside it (the storage every rank sees), checks the copy (bert-base:
    ~1.3 GB read once instead of once per rank) and names it; every rank then restores that copy,
    so the bytes unpickled are the bytes checked. A damaged checkpoint stops them all with the
    same message (exit 2). Returns the copy's storage id; the chief removes it after the run."""
    verdict: dict[str, Any] | None = None
    if distributed.rank == 0:
        logger.info("verifying %s %s for all %d ranks", what, checkpoint, distributed.size)
        try:
            private, steps = prepare_resume(checkpoint, checkpoint.parent, what)
            verdict = {"steps": steps, "private": private.name}
        except ConfigError as err:
            verdict = {"error": str(err)}
    verdict = distributed.broadcast(verdict)
    if "error" in verdict:
        raise ConfigError(verdict["error"])
    return str(verdict["private"])


def checkpoint_record(checkpoint: Path, key: str) -> dict[str, Any] | None:
    """What a checkpoint recorded of its run (experiment.json): its `identity`
    (run_plan.run_identity) or `train_length`; None without a record."""
    try:
        value = json.loads((checkpoint / IDENTITY_RECORD).read_text())[key]
    except (OSError, ValueError, KeyError, TypeError):
        return None
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


def check_same_run(checkpoint: Path, identity: dict[str, Any], allow_changed: bool, shown: Path) -> None:
    """--resume DIR: the checkpoint's recorded settings against this run's; a difference is an
    error naming each field (both values) unless --allow-changed says it is meant. `checkpoint`
    is the private copy the run restores; `shown` the directory the user gave."""
    saved = checkpoint_identity(checkpoint)
    if saved is None:
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


# --------------------------------------------------------------------------------------------
# Pickles scanned before Determined unpickles them: only allowlisted names, nothing runs.
# --------------------------------------------------------------------------------------------


# What torch.save writes for this trial's state (weights, optimizer and scheduler state, every
# rank's RNG states as NumPy arrays and tensors); trial_state.pkl holds plain values only.
_NUMPY_CORES = ("numpy.core.multiarray", "numpy._core.multiarray")
ALLOWED_IN_STATE_DICT = frozenset(
    {
        ("collections", "OrderedDict"),
        ("_codecs", "encode"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter"),
        ("torch", "Size"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        *((core, "_reconstruct") for core in _NUMPY_CORES),
        *((core, "scalar") for core in _NUMPY_CORES),
    }
)
_TORCH_STORAGES = frozenset(
    f"{kind}Storage"
    for kind in (
        "Byte", "Char", "Short", "Int", "Long", "Half", "Float", "Double", "BFloat16", "Bool", "Untyped"
    )  # fmt: skip
)
ZIP_MAGIC = b"PK\x03\x04"


@functools.lru_cache(maxsize=1)
def numpy_dtype_classes() -> frozenset[tuple[str, str]]:
    """numpy.dtypes' dtype classes by exact name (numpy 2 pickles dtypes by class, e.g.
    UInt32DType): only names that are dtype classes in the installed NumPy."""
    import numpy as np

    try:
        import numpy.dtypes as dtypes
    except ImportError:  # NumPy < 1.25 has no such module, and pickles no such names
        return frozenset()
    return frozenset(
        ("numpy.dtypes", name) for name in dir(dtypes)
        if isinstance(getattr(dtypes, name), type) and issubclass(getattr(dtypes, name), np.dtype)
    )  # fmt: skip


class _Inert:
    """What an allowed global becomes while scanning: accepts any call and state, does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _Scanner(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: frozenset[tuple[str, str]], where: str) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed, self.where = allowed, where

    def find_class(self, module: str, name: str) -> Any:
        # Exact (module, name) pairs only. A dotted name is refused whatever its module: pickle
        # resolves it attribute by attribute (numpy.dtypes + "__builtins__.get" reaches eval).
        allowed = (module, name) in self.allowed
        if self.allowed is ALLOWED_IN_STATE_DICT:
            allowed = allowed or (module == "torch" and name in _TORCH_STORAGES)
            allowed = allowed or (module, name) in numpy_dtype_classes()
        if allowed and "." not in name:
            return _Inert
        raise ConfigError(
            f"{self.where}: refers to {module}.{name}, which no checkpoint of this trial contains; "
            "refusing to load it (it could run code). Resume only checkpoints this project wrote."
        )

    def persistent_load(self, pid: Any) -> Any:  # torch's tensor storages live beside the pickle
        return None


def scan(data: bytes, allowed: frozenset[tuple[str, str]], where: str) -> None:
    """Walk one pickle with every global checked; ConfigError if it is refused or unreadable."""
    try:
        _Scanner(data, allowed, where).load()
    except ConfigError:
        raise
    except Exception as err:  # a damaged pickle: say so rather than let Determined trip on it
        reason = f"{type(err).__name__}: {str(err)[:200]}"
        raise ConfigError(f"{where}: not a readable pickle ({reason}).") from None


def check_checkpoint_pickles(checkpoint: Path) -> None:
    """trial_state.pkl (plain values only) and state_dict.pth (the allowlist above)."""
    for name in ("trial_state.pkl", "workload_sequencer.pkl"):
        path = checkpoint / name
        if path.is_file():
            scan(path.read_bytes(), frozenset(), str(path))
    state = checkpoint / "state_dict.pth"
    if not state.is_file():
        return
    # A zip from its first byte: _check_checkpoint refused anything else before calling this.
    with zipfile.ZipFile(state) as archive:  # torch.save's format: the pickle is data.pkl
        for member in archive.namelist():
            if member.endswith(".pkl"):
                scan(archive.read(member), ALLOWED_IN_STATE_DICT, f"{state} ({member})")
