"""The one reader every file of the project goes through: configs, data, predictions, feature
caches, checkpoints and their records, model directories and hf/ exports (model_files).

A path is resolved through its links once, then opened without following a link and without
waiting (a FIFO's open would block until a writer comes), and refused unless it is a regular file
no larger than its kind's limit -- read from the file's metadata before a byte is read, so a
/dev/zero link or an 8 GiB sparse file costs nothing. JSON is parsed strictly: unique keys, finite
numbers (no NaN, Infinity or 1e999), nesting within the parser's depth. Every refusal is an
UnreadableFile naming the file, the limit and what to do; it is both a ConfigError and a
DataError, so each command's existing one-line error handling catches it.

tests/test_reading.py lists the project's reads and fails if one bypasses this module.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from extractive_qa.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[2]  # the repository root: entry scripts and YAMLs

MIB = 1 << 20


class UnreadableFile(ConfigError, DataError):
    """A file that is not a regular file of its kind's size, or not what its kind must hold."""


class MissingFile(UnreadableFile):
    """The file is not there (callers that treat absence as "none yet" catch this one)."""


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a file is for, the most bytes such a file may hold, and the environment variable (in
    MiB) that raises the limit where a user's own file may legitimately be larger."""

    name: str
    limit: int
    override: str | None = None

    @property
    def bytes(self) -> int:
        if self.override and os.environ.get(self.override, "").strip():
            try:
                mib = int(os.environ[self.override])
            except ValueError:
                raise ConfigError(
                    f"{self.override}={os.environ[self.override]!r}: not a number of MiB."
                ) from None
            if mib <= 0:
                raise ConfigError(f"{self.override}={mib}: give a positive number of MiB.")
            return mib * MIB
        return self.limit


# Limits by kind. SQuAD v2.0's training file is 42 MB; a record or a config is kilobytes.
RECORD = Kind("record", 16 * MIB)  # a checkpoint's JSON records, qa_settings.json, a cache's meta.json
CONFIG = Kind("experiment config", 4 * MIB)
MODEL_FILE = Kind("model file", 256 * MIB)  # config.json, tokenizer files, a model card
DATA = Kind("data file", 2048 * MIB, "EXTRACTIVE_QA_MAX_INPUT_MB")  # SQuAD JSON/JSON Lines, predictions
WEIGHTS = Kind("model weights file", 8192 * MIB)  # an ONNX model (BERT-large: 1.3 GB)
SYSTEM = Kind("system file", 4 * MIB)  # /proc/cpuinfo


def _limit_text(kind: Kind, limit: int) -> str:
    text = f"more than a {kind.name} holds ({limit / MIB:,.0f} MiB at most)"
    return text + (
        f"; raise the limit with {kind.override}=MiB if the file is meant" if kind.override else ""
    )


def too_large(shown: Path | str, size: int, kind: Kind, limit: int) -> UnreadableFile:
    """The refusal of a file of `size` bytes over `limit`, the most a file of `kind` may hold here."""
    return UnreadableFile(f"{shown}: is {size / MIB:,.1f} MiB; {_limit_text(kind, limit)}.")


def open_regular(
    path: Path | str,
    kind: Kind,
    *,
    follow_links: bool = True,
    limit: int | None = None,
    shown: Path | str | None = None,
) -> BinaryIO:
    """`path` open for reading if it is a regular file of at most the kind's bytes (or `limit`).
    With `follow_links` the path is resolved once and its target opened; without, a link is
    refused (a checkpoint's own files are never links). Errors name `shown` (default: `path`)."""
    target = os.path.realpath(path) if follow_links else os.fspath(path)
    path = Path(path)
    shown = path if shown is None else Path(shown)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except FileNotFoundError:
        if path.is_symlink():
            raise MissingFile(f"{shown}: no such file (a link to a path that does not exist).") from None
        raise MissingFile(not_a_file(path, shown=shown)) from None
    except OSError as err:
        if not follow_links and path.is_symlink():
            raise UnreadableFile(
                f"{shown}: is a symbolic link and cannot be opened as a plain file; only a plain file "
                "is read here."
            ) from None
        raise UnreadableFile(f"{shown}: cannot be read ({err.strerror}).") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UnreadableFile(not_a_file(path, shown=shown))
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"{shown}: is a pipe, socket or device, not a regular file; give a file.")
        cap = kind.bytes if limit is None else limit
        if info.st_size > cap:
            raise too_large(shown, info.st_size, kind, cap)
        # Left non-blocking: a regular file on disk never waits, and one that would (/proc/kmsg is
        # "regular" with size 0) must answer EAGAIN rather than hang the command.
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def not_a_file(path: Path | str, base: Path | None = None, shown: Path | str | None = None) -> str:
    """Why `path` (relative ones taken from `base`, default the current directory) is no file to
    read, and what to give instead: a directory's files; where a relative path was looked for;
    the nearest name beside it; the project's own file of that relative name. Every "no such
    file" and "is a directory" of the reader, the data paths and the dry run says it this way."""
    given = Path(path)
    shown = given if shown is None else Path(shown)
    start = Path.cwd() if base is None else base
    full = given if given.is_absolute() else start / given
    try:
        mode = full.stat().st_mode
    except OSError:
        mode = 0
    for test, kind in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):  # fmt: skip
        if test(mode):
            return f"{shown}: is {kind}, not a regular file; give a file."
    if full.is_dir():
        inside = sorted(p.name for p in full.iterdir() if p.is_file() and not p.name.startswith("."))
        listed = f" (it holds {', '.join(inside[:4])}{', ...' if len(inside) > 4 else ''})" if inside else ""
        return f"{shown}: is a directory, not a regular file{listed}."
    told = "the current directory" if base is None else "where the config's relative paths start"
    where = "" if given.is_absolute() else f" in {start} ({told})"
    nearest = []
    if full.parent.is_dir():
        names = [p.name for p in full.parent.iterdir()]
        nearest = difflib.get_close_matches(full.name, names, n=1, cutoff=0.8)
    if nearest:
        return f"{shown}: no such file{where}; did you mean {given.parent / nearest[0]}?"
    if not given.is_absolute() and start != ROOT and (ROOT / given).exists():
        return f"{shown}: no such file{where}; the project has {ROOT / given} -- give that path."
    return f"{shown}: no such file{where}."


LIST_CHECKPOINTS = (
    "`python3 train.py --checkpoints` lists the checkpoints a run wrote, with the path to paste"
)


def not_a_checkpoint(path: Path) -> str:
    """Why `path` names no checkpoint directory, with where it was looked for and the next command:
    the one wording of train.py --resume, predict.py and export.py. A documentation placeholder
    pasted as it is (UUID) is said to be one."""
    where = Path.cwd() / path if not path.is_absolute() else path
    if path.name in ("UUID", "CHECKPOINT", "DIR"):
        return (
            f"{path.name} stands for a checkpoint's directory name, the one a run printed "
            f'("checkpoint": ...). {LIST_CHECKPOINTS}; none yet: train one first with `python3 train.py`.'
        )
    if path.exists():
        return f"{where} is a file, not a checkpoint directory. {LIST_CHECKPOINTS}."
    return (
        f"no such directory ({where}), and not a Determined checkpoint UUID or an s3://, gs:// or "
        f"azure:// URL. {LIST_CHECKPOINTS}; none yet: train one first with `python3 train.py`."
    )


def read_bytes(
    path: Path | str,
    kind: Kind,
    *,
    follow_links: bool = True,
    limit: int | None = None,
    shown: Path | str | None = None,
) -> bytes:
    """The whole file, bounded: a file that holds more than the limit by the time it is read (it
    grew, or its size is not known beforehand, as /proc's files) is refused too.

    The first read asks for the size the metadata gives and one byte more, not for the limit: a
    buffer is allocated for what a read asks, and the limit (2 GiB for data) is no size to ask
    for a kilobyte's file. Bytes past that size come in bounded pieces up to the limit."""
    cap = kind.bytes if limit is None else limit
    with open_regular(path, kind, follow_links=follow_links, limit=cap, shown=shown) as file:
        try:
            size = os.fstat(file.fileno()).st_size
            data = _read_now(file, size + 1)
            if len(data) > size:
                pieces = [data]
                total = len(data)
                while total <= cap and (piece := _read_now(file, min(MIB, cap + 1 - total))):
                    pieces.append(piece)
                    total += len(piece)
                data = b"".join(pieces)
        except BlockingIOError:
            raise UnreadableFile(
                f"{shown or path}: has no data without waiting for some (a device's file, as /proc/kmsg); "
                "give a regular file."
            ) from None
        except OSError as err:  # a read that fails (EIO): named by the file, as the reader's refusals are
            raise OSError(err.errno, err.strerror, str(shown or path)) from err
    if len(data) > cap:
        raise UnreadableFile(
            f"{shown or path}: grew past {cap / MIB:,.0f} MiB while it was read; {_limit_text(kind, cap)}."
        )
    return data


def read_present(directory: Path, names: Iterable[str], kind: Kind) -> dict[str, bytes]:
    """Each of `names` that `directory` holds, read once through read_bytes (name -> bytes); a
    link is read as read_bytes reads one, never skipped as absent."""
    present = {}
    for name in names:
        path = directory / name
        if path.exists() or path.is_symlink():
            present[name] = read_bytes(path, kind)
    return present


def _read_now(file: BinaryIO, size: int) -> bytes:
    """Up to `size` bytes; a file that has none without waiting raises BlockingIOError (a buffered
    read of a non-blocking file answers None for it)."""
    data = file.read(size)
    if data is None:
        raise BlockingIOError
    return data


def read_text(path: Path | str, kind: Kind, *, follow_links: bool = True) -> str:
    """The file as UTF-8 text (a byte-order mark is dropped)."""
    data = read_bytes(path, kind, follow_links=follow_links)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UnreadableFile(f"{path}: is not UTF-8 text (byte {err.start}); save it as UTF-8.") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise ValueError(f"key {key[:80]!r} is given twice")
        value[key] = item
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond the range of a number")
    return value


# Parsing builds objects far larger than their text: an object costs about 200 bytes however short
# `{}` is, a list about 60, every item a pointer and often an object of its own. A document is
# refused, before it is parsed, when these counts from its text alone exceed JSON_MEMORY_MULTIPLE
# times its length: `{},{},...` counts 81, SQuAD files 3 to 5, a tokenizer's vocabulary about 10.
JSON_MEMORY_MULTIPLE = 24
JSON_COSTS = {"{": 200, "[": 60, ",": 40}
# A \u escape of a UTF-16 surrogate: the only way a decoded document can hold a lone surrogate.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json(data: bytes | str, shown: Path | str, what: str = "JSON") -> Any:
    """JSON with unique keys, finite numbers and text UTF-8 can hold, within JSON_MEMORY_MULTIPLE;
    nesting deeper than the parser's stack, text that is not UTF-8, a lone surrogate escape or an
    integer of thousands of digits is an UnreadableFile naming `shown`."""
    try:
        text = data.decode("utf-8-sig") if isinstance(data, bytes) else data
    except UnicodeDecodeError as err:
        raise UnreadableFile(f"{shown}: is not readable {what} ({str(err)[:200]}).") from None
    cost = len(text) + sum(weight * text.count(mark) for mark, weight in JSON_COSTS.items())
    if cost > JSON_MEMORY_MULTIPLE * max(len(text), 64):
        raise UnreadableFile(
            f"{shown}: is {what} of {len(text):,} characters whose objects, lists and items would take "
            f"about {cost / max(len(text), 1):.0f} times that in memory (more than {JSON_MEMORY_MULTIPLE}); "
            "real data is mostly text."
        )
    try:
        value = json.loads(text, object_pairs_hook=_unique, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise UnreadableFile(f"{shown}: is not readable {what} (nested too deeply).") from None
    except ValueError as err:
        raise UnreadableFile(
            f"{shown}: is not readable {what} ({str(err)[:200]}; invalid or truncated JSON)."
        ) from None
    if SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(value, shown, what)
    return value


def _refuse_lone_surrogates(value: Any, shown: Path | str, what: str) -> None:
    """A string (key or value) of the parsed document holding a lone surrogate -- from an escape
    such as \\ud800, not text, which no tokenizer or output file takes -- named by its place."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, place = stack.pop()
        if isinstance(item, dict):
            stack += [(k, f"{place} key") for k in item] + [
                (v, f"{place}.{k}"[:120]) for k, v in item.items()
            ]
        elif isinstance(item, list):
            stack += [(v, f"{place}[{i}]") for i, v in enumerate(item)]
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as err:
                code, at = ord(item[err.start]), place.lstrip(".") or "its top"
                raise UnreadableFile(
                    f"{shown}: {what} holds a lone surrogate (\\u{code:04x}) at {at}, which is not text; "
                    "fix that escape in the file."
                ) from None


def read_json(path: Path | str, kind: Kind, *, follow_links: bool = True, what: str = "JSON") -> Any:
    return parse_json(read_bytes(path, kind, follow_links=follow_links), path, what)


def read_json_object(path: Path | str, kind: Kind, *, follow_links: bool = True) -> dict[str, Any]:
    return json_object(read_bytes(path, kind, follow_links=follow_links), path)


def json_object(data: bytes, shown: Path | str) -> dict[str, Any]:
    """`data` (a file's bytes, read through the reader) parsed as a JSON object."""
    value = parse_json(data, shown)
    if not isinstance(value, dict):
        raise UnreadableFile(f"{shown}: holds a JSON {type(value).__name__}, not an object.")
    return value
