"""Files the commands write: where a command may write, checked before any work for every writer
(train.py --metrics-out, predict.py, export.py, data.py --convert, scaling.py --out) -- a file
whose directory exists, a directory that is new or holds only the command's own files, and never
on an input, through a link, inside a checkpoint or export the command did not make, or into the
project upload -- and how: atomic writes, per-file locks, modes, plain copies, the source a plot
names and a command's one line for a failed write."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from extractive_qa.det_internals import uploaded
from extractive_qa.errors import DataError
from extractive_qa.io import reading

ROOT = reading.ROOT  # the repository root: entry scripts and YAMLs (the reader names files by it)


# --------------------------------------------------------------------------------------------
# Where a command may write.
# --------------------------------------------------------------------------------------------


def check_output_file(path: Path, flag: str) -> None:
    """Before any work: `path` can be written as a file (its directory exists, it is not one)."""
    if path.is_dir():
        raise DataError(f"{flag} {path}: is a directory; give a file name, e.g. {path / 'out.json'}.")
    if not path.parent.is_dir():
        raise DataError(f"{flag} {path}: directory {path.parent} does not exist; create it first.")
    if not os.access(path.parent, os.W_OK):
        raise DataError(f"{flag} {path}: directory {path.parent} is not writable.")


def check_output_dir(path: Path, flag: str) -> None:
    """Before any work: `path` is or can become a writable directory."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if path.exists() and not path.is_dir():
        raise DataError(f"{flag} {path}: is a file, not a directory.")
    if existing is None or not existing.is_dir():
        raise DataError(f"{flag} {path}: {existing} is not a directory.")
    if not os.access(existing, os.W_OK):
        raise DataError(f"{flag} {path}: {existing} is not writable.")


def check_outputs(
    outputs: dict[str, Path],
    inputs: dict[str, Path | None],
) -> None:
    """Before any work, for every writer (train.py --metrics-out, predict.py, export.py, data.py
    --convert): no output lands on an input. Paths are resolved to the end (every link followed),
    then an output is refused when it

    - is an input, or lies inside an input directory (a checkpoint being read: `--out
      CK/hf/model.safetensors` would replace the model the command is reading);
    - is a link (it would write through it), or lies inside a checkpoint or export directory
      (checkpoint_holding: another checkpoint's metadata.json or hf/qa_settings.json);
    - lies inside the project directory that `det experiment create` uploads and every local
      checkpoint copies into its code/ (outside .detignore): whatever its name, such a file would
      travel with every experiment or replace a project file. The directories .detignore leaves
      out take outputs (answers*/, exported*/, checkpoints/, squad_data/ for data).
    """
    project = Path(os.path.realpath(ROOT))
    for out_flag, output in outputs.items():
        if Path(output).is_symlink():
            raise DataError(
                f"{out_flag} {output}: is a symbolic link; writing there would write to whatever it "
                "points at. Give the output a plain name (remove the link)."
            )
        target = Path(os.path.realpath(output))
        for in_flag, given in inputs.items():
            if given is None or not (Path(given).exists() or Path(given).is_symlink()):
                continue
            source = Path(os.path.realpath(given))
            if target == source:
                raise DataError(
                    f"{out_flag} {output}: is the input given as {in_flag}; writing there would "
                    "replace it. Choose another output name."
                )
            if source.is_dir() and target.is_relative_to(source):
                raise DataError(
                    f"{out_flag} {output}: is inside {source}, which this command reads ({in_flag}); "
                    "writing there would change what it reads. Choose an output outside it."
                )
        holder = checkpoint_holding(target)
        if holder is not None:
            raise DataError(
                f"{out_flag} {output}: lies inside {holder}, a checkpoint or export this command did "
                "not make; writing there would change what it holds. Choose an output outside it."
            )
        if target == project or (target.is_relative_to(project) and uploaded(project, target)):
            raise DataError(
                f"{out_flag} {output}: is inside the project directory, which `det experiment create` "
                "uploads and every local checkpoint copies (code/); it could replace a project file "
                "and would travel with every experiment. Write it outside the project, or into a "
                "directory .detignore leaves out (answers/, exported/, checkpoints/; data into squad_data/)."
            )


# What makes a directory a checkpoint or an export this project wrote: files a command must never
# write into unless it is making that directory itself.
CHECKPOINT_MARKS = (("metadata.json", "state_dict.pth"), ("qa_settings.json",), ("export.json",))


def checkpoint_holding(target: Path) -> Path | None:
    """The checkpoint or export directory above `target` (a resolved path), if any."""
    for directory in target.parents:
        if any(all((directory / name).is_file() for name in marks) for marks in CHECKPOINT_MARKS):
            return directory
    return None


def check_new_directory(path: Path, flag: str, own_files: tuple[str, ...], *, marker: str) -> None:
    """Before any work: `path` is a directory to create, an empty one, or one an earlier run of
    the command filled, holding nothing but `own_files`. Every command that fills a directory
    writes its `marker` there first, and only a directory holding it is one the command filled:
    a file of one of its names that a user put anywhere else is never replaced."""
    check_output_dir(path, flag)
    if not path.is_dir():
        return
    own = {*own_files, marker} if (path / marker).is_file() else set()
    foreign = sorted(p.name for p in path.iterdir() if p.name not in own)
    if foreign:
        listed = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise DataError(
            f"{flag} {path}: already holds files this command did not write ({listed}); give a new "
            "directory (it is created) or an empty one."
        )


# --------------------------------------------------------------------------------------------
# Writing.
# --------------------------------------------------------------------------------------------


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
