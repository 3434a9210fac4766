"""Files the runs read and write: the repository root, atomic writes, per-file locks, and
outputs checked writable before any work."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from extractive_qa.errors import DataError

ROOT = Path(__file__).resolve().parents[1]  # the repository root: entry scripts and YAMLs


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
    """write_text_atomic for bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        shared_mode(tmp)
        os.replace(tmp, path)
    except OSError as err:  # name the file meant, not the temporary one (a full disk has neither)
        raise OSError(err.errno, err.strerror, str(path)) from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def command_error(err: Exception, output: object) -> int:
    """A command's one line for a refused request (DataError) or a failed write (OSError, naming
    the file; `output` where the error names none); its exit code, 2."""
    if isinstance(err, OSError):
        print(f"error: cannot write {err.filename or output}: {err.strerror or err}.", file=sys.stderr)
    else:
        print(f"error: {err}", file=sys.stderr)
    return 2


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


def check_not_an_input(outputs: dict[str, Path], inputs: dict[str, Path | None]) -> None:
    """Before any work: no output is one of the command's inputs (`--out` = `--squad` would
    replace the data set with its answers, `--metrics-out` = `--config` the config)."""
    for out_flag, output in outputs.items():
        for in_flag, given in inputs.items():
            if given is not None and Path(given).exists() and output.resolve() == Path(given).resolve():
                raise DataError(
                    f"{out_flag} {output}: is the input given as {in_flag}; writing there would "
                    "replace it. Choose another output name."
                )
