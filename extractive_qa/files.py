"""Files the runs write: the repository root, atomic writes, per-file locks, modes, plain copies,
the source a plot names and a command's one line for a failed write. Where a command may write is
output_rules'."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from extractive_qa import reading
from extractive_qa.errors import DataError

ROOT = reading.ROOT  # the repository root: entry scripts and YAMLs (the reader names files by it)


def file_lock(path: Path) -> Any:
    # filelock comes with transformers (via huggingface_hub); one lock file per target, so the
    # ranks of a machine serialise on it and all but the first find the work already done.
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path) + ".lock")


def shared_mode(path: Path | str, directory: bool = False) -> None:
    """The mode a plain open()/mkdir() would have given: mkstemp and mkdtemp make owner-only
    files (0600 / 0700), which other users of a shared cache or export directory cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and rename: never a half-written file."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """write_text_atomic for bytes. What is already at `path` and is not a regular file is never
    replaced: a character device or a FIFO (/dev/null, a terminal, a named pipe a reader waits on)
    is written through as a stream -- renaming over it would put a regular file in its place, and
    as root replace /dev/null -- and anything else (a directory, a socket, a block device) is
    refused. A regular file it replaces keeps its mode."""
    try:
        existing = os.stat(path)
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        if not (stat.S_ISCHR(existing.st_mode) or stat.S_ISFIFO(existing.st_mode)):
            raise DataError(f"{path}: not a regular file, a device or a pipe; give a file path to write.")
        with open(path, "wb", buffering=0) as stream:  # O_WRONLY|O_TRUNC: a device or pipe is not created
            stream.write(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        if existing is not None:
            os.chmod(tmp, stat.S_IMODE(existing.st_mode))
        else:
            shared_mode(tmp)
        os.replace(tmp, path)
    except OSError as err:  # name the file meant, not the temporary one (a full disk has neither)
        raise OSError(err.errno, err.strerror, str(path)) from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def drawn_from(name: str, data: bytes) -> dict[str, str]:
    """A plot's PNG metadata: the results file it was drawn from (kept beside it) and that file's
    SHA-256, so a check can tell a plot that no longer shows its file (bench.docs)."""
    return {"Source": f"{name} sha256:{hashlib.sha256(data).hexdigest()}"}


def command_error(err: Exception, output: object) -> int:
    """A command's one line for a refused request (DataError) or a failed write (OSError, naming
    the file; `output` where the error names none); its exit code, 2."""
    if isinstance(err, OSError):
        print(f"error: cannot write {err.filename or output}: {err.strerror or err}.", file=sys.stderr)
    else:
        print(f"error: {err}", file=sys.stderr)
    return 2


def copy_plain_file(source: Path, target: Path) -> None:
    """Copy a file's bytes, never through a link (a link is refused, not followed), with the
    source's mode narrowed by the umask and never widened: a 0600 file stays 0600."""
    import shutil
    import stat

    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        reason = f"not a plain file ({err.strerror}); only plain files are copied"
        raise DataError(f"{source}: {reason}.") from None
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(src.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise DataError(f"{source}: not a regular file; copy only the files it holds.")
        with open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(target, stat.S_IMODE(info.st_mode) & 0o666 & ~umask)
