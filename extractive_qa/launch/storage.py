"""Where a local run's checkpoints go, checked before it trains: not inside the upload nor
reachable through a link in it, writable, with room for one more checkpoint, not writable by
other users; and a checkpoint write that fails named with what the run reached."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from extractive_qa.det_internals import uploaded
from extractive_qa.errors import ConfigError
from extractive_qa.io.files import check_output_dir


def check_local_storage(checkpoint_dir: Path, root: Path) -> None:
    """Before a local run starts: its checkpoint directory can hold checkpoints without eating the
    run (not inside the upload) and can be written."""
    check_outside_upload(checkpoint_dir, root, "--checkpoint-dir")
    check_upload_links(root, checkpoint_dir)
    check_output_dir(checkpoint_dir, "--checkpoint-dir")


MAX_UPLOAD_DIRS = 100_000  # directories walked through links before the walk gives up (and refuses)
MAX_UPLOAD_BYTES = 96_000_000  # Determined's limit on an experiment's context


def check_upload_links(root: Path, checkpoint_dir: Path) -> None:
    """No link in the upload leads, in any number of hops, into the checkpoints or back over the
    project.

    Determined copies the upload into every checkpoint's code/ following directory links
    (common/storage/shared.py `_copytree`: DirEntry.is_dir() follows them), so a link that reaches
    the checkpoint directory -- directly, or through a linked folder that holds another link --
    makes the copy recurse into the checkpoint it is writing, after training, losing the run's
    end. The walk here follows links as that copy does, each real directory once."""
    checkpoints, project = checkpoint_dir.resolve(), root.resolve()
    seen: set[Path] = set()
    uploaded_bytes = 0
    stack: list[tuple[Path, Path | None]] = [(root, None)]  # (path as the copy sees it, first link on it)
    while stack:
        folder, via = stack.pop()
        real = folder.resolve()
        if via is not None:
            loops = project.is_relative_to(real)
            if loops or real.is_relative_to(checkpoints) or checkpoints.is_relative_to(real):
                held = "the project itself" if loops else "the checkpoints"
                raise ConfigError(
                    f"{via}: a link that leads to {real} ({held}); Determined copies the project "
                    "(minus .detignore) into every checkpoint, following links, and would copy it "
                    "into itself. Remove the link or list it in .detignore."
                )
        if real in seen:
            continue
        seen.add(real)
        if len(seen) > MAX_UPLOAD_DIRS:
            raise ConfigError(
                f"{root}: more than {MAX_UPLOAD_DIRS} directories are uploaded (following links); "
                "list what the experiment does not need in .detignore."
            )
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            try:
                is_dir = entry.is_dir()  # follows a link, as the copy does
            except OSError:
                is_dir = False
            if not uploaded(root, path):
                continue
            if is_dir:
                stack.append((path, via or (path if entry.is_symlink() else None)))
            else:
                uploaded_bytes += copyable_size(path)
                if uploaded_bytes > MAX_UPLOAD_BYTES:
                    raise ConfigError(
                        f"{root}: more than {MAX_UPLOAD_BYTES // 1_000_000} MB would be uploaded and "
                        "copied into every checkpoint (Determined refuses larger contexts); list "
                        "what the experiment does not need (data, outputs) in .detignore."
                    )


def copyable_size(path: Path) -> int:
    """The bytes Determined's copy of `path` into a checkpoint's code/ reads; a dangling link, a
    pipe, socket or device, or a file this user cannot read is refused here, before training --
    at the first checkpoint the copy would fail with the trained state unsaved."""
    fix = "Remove it, or list it in .detignore."
    try:
        info = path.stat()  # follows a link, as the copy does
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: a link to {os.readlink(path)}, which does not exist; Determined copies the project "
            f"into every checkpoint and would fail at the first one. {fix}"
        ) from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror}); {fix}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(
            f"{path}: a pipe, socket or device in the project; Determined's copy into every checkpoint "
            f"would stop on it. {fix}"
        )
    if not os.access(path, os.R_OK):
        raise ConfigError(
            f"{path}: this user cannot read it; the copy into every checkpoint would fail. {fix}"
        )
    return info.st_size


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
    partial = sorted(
        p.name for p in base.iterdir()
        if p.is_dir() and not p.name.startswith(".") and not (p / "metadata.json").is_file()
    )  # fmt: skip
    if partial:
        logging.getLogger("squad").warning(
            "%s holds %d partial checkpoint(s) of an interrupted run (no metadata.json): %s; "
            "they cannot be resumed from and can be deleted.",
            base, len(partial), ", ".join(partial[:5]),
        )  # fmt: skip


# A checkpoint's bytes per model parameter: fp32 weights, the optimizer's two fp32 moments
# (AdamW, RAdam and LAMB alike) and the fp32 hf/ export; code/ and the records add little.
CHECKPOINT_BYTES_PER_PARAMETER = 4 * 4


def check_free_space(checkpoint_dir: Path, parameters: int) -> None:
    """Before training: room for one more checkpoint (the previous one is deleted only after the
    next is written), so a full disk is named now rather than as torch's bare write error at the
    end of the run."""
    needed = parameters * CHECKPOINT_BYTES_PER_PARAMETER
    free = shutil.disk_usage(checkpoint_dir if checkpoint_dir.exists() else checkpoint_dir.parent).free
    if free < needed:
        raise ConfigError(
            f"--checkpoint-dir {checkpoint_dir}: {free / 1e9:.2f} GB free, and one checkpoint of "
            f"this model ({parameters / 1e6:.1f} M parameters: weights, optimizer state, hf/) "
            f"takes about {needed / 1e9:.2f} GB. Free space there or give another --checkpoint-dir."
        )


# How a failed checkpoint write reaches us: an OSError from Python's own writes, or torch.save's
# zip writer as a RuntimeError ("PytorchStreamWriter failed writing file ...", or "unexpected
# pos" when the disk filled between its writes) that never says why.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)
TORCH_WRITE_FAILURES = ("PytorchStreamWriter failed", "unexpected pos", "file write failed")


def checkpoint_write_failed(err: BaseException) -> bool:
    if isinstance(err, OSError):
        return err.errno in WRITE_ERRNOS
    return isinstance(err, RuntimeError) and any(sign in str(err) for sign in TORCH_WRITE_FAILURES)


def write_failure_error(
    err: BaseException, checkpoint_dir: Path, before: set[str], trained: int, validation: dict[str, Any]
) -> ConfigError:
    """What a failed checkpoint write tells the user: where, the space left, the partial
    directories it left (named, not deleted: another run may be writing beside it), and what the
    run reached."""
    base = checkpoint_dir / "determined"
    partial = sorted(
        p for p in base.iterdir() if p.is_dir() and p.name not in before
        and not p.name.startswith(".") and not (p / "metadata.json").is_file()
    ) if base.is_dir() else []  # fmt: skip
    free = shutil.disk_usage(base if base.is_dir() else checkpoint_dir).free
    reason = getattr(err, "strerror", None) or str(err).strip().splitlines()[-1][:160]
    scores = ", ".join(f"{k} {float(v):.2f}" for k, v in validation.items() if k in ("exact_match", "f1"))
    reached = f" Its last validation: {scores}." if scores else ""
    left = f" Partial checkpoint(s) left, delete them: {', '.join(map(str, partial))}." if partial else ""
    return ConfigError(
        f"--checkpoint-dir {checkpoint_dir}: writing a checkpoint after {trained} batches failed "
        f"({reason}); {free / 1e9:.2f} GB free there.{reached}{left} Free space and continue "
        "from the last complete checkpoint with --resume auto."
    )


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
