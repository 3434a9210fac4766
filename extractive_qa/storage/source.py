"""What a checkpoint source is, and the bounds every read from one obeys.

A checkpoint lies in one of several storages -- a directory (a local run's, shared_fs), an S3,
GCS or Azure bucket, a master that hands it out by UUID -- and every command that reads one
(--resume, predict.py, export.py, a cluster trial's restore) reads it the same way, through
`CheckpointSource`: list what it holds with sizes (and a version tag, where the storage keeps
one), then fetch named entries into a private directory. Adding a storage is one class.

The bounds are here, once, for every remote storage:
- a listing has a deadline and at most MAX_PAGES pages (a listing that never ends is cut off);
- a download stalls when it moves fewer than STALL_BYTES in STALL_WINDOW_S (a server that
  accepts and never answers, or trickles), and every object is bounded by its listed size;
- the whole checkpoint is bounded before a byte is fetched: each entry by its kind's limit, the
  sum by the checkpoint's own largest entry (`total_limit`), and the disk must hold it.
Each ends in one line that names the URL and what to change.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

from extractive_qa.errors import DataError
from extractive_qa.io import reading

MAX_OBJECTS = 10_000  # a checkpoint holds tens of files (code/ included)
MAX_PAGES = 100  # of a listing: S3 and GCS give 1,000 entries a page
CONNECT_TIMEOUT_S = 5.0  # what the SDKs get: one connection attempt
READ_TIMEOUT_S = 20.0  # one read of a response
LISTING_DEADLINE_S = 45.0  # the whole listing, every page and retry
STALL_WINDOW_S = 20.0  # a download that moved fewer than STALL_BYTES in this long is stalled
STALL_BYTES = 64 << 10
SMALL_FILES = 64 << 20  # what a checkpoint holds beside its weights: records, tokenizer, code/
DISK_MARGIN = 256 << 20  # left free on the disk after a download

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One object of a checkpoint: its name below the checkpoint ('hf/config.json'; a directory
    marker ends in '/'), its size, and the storage's version tag of it (an ETag, a generation,
    a modification time), which a cached copy is checked against."""

    name: str
    size: int
    version: str = ""


class CheckpointSource(Protocol):
    """A checkpoint in some storage. `url` names it to the user; `key` is what a private copy of
    it is cached by (the storage's endpoint and the URL: the same URL on another endpoint is
    another checkpoint); `in_place` is its directory where its files can be read where they lie
    (a local directory), else None; `advice` says what to check when it does not answer."""

    @property
    def url(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def in_place(self) -> Path | None: ...

    @property
    def partial(self) -> bool:
        """Whether it can fetch some of a checkpoint's entries without the rest."""
        ...

    @property
    def advice(self) -> str: ...

    def listing(self, progress: Progress) -> list[Entry]:
        """Every entry below the checkpoint, names checked (`checked_name`); each page counted
        in `progress`."""
        ...

    def fetch(self, entries: Sequence[Entry], target: Path, progress: Progress) -> None:
        """Each entry into `target` (a new, private, empty directory), each through a
        `BoundedFile` of its listed size, its bytes counted in `progress`."""
        ...


# --------------------------------------------------------------------------------------------
# Names and sizes: what a listing may hold.
# --------------------------------------------------------------------------------------------


def bad_name(name: str) -> str | None:
    """Why `name` (an entry below the checkpoint, '/'-separated) could leave its directory."""
    parts = name[:-1].split("/") if name.endswith("/") else name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' part"
    if any(c in name for c in "\0\\") or len(name) > 1024:
        return "a NUL or backslash, or more than 1024 characters"
    return None


def listed_size(value: Any, name: str, url: str) -> int:
    """A size as a server listed it: a whole number of bytes, or the listing is refused (the
    server is not the store it claims to be)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise DataError(
            f"{url}: the listing gives {name!r} a size of {str(value)[:40]!r}, not a number of bytes; "
            "the server at that address does not answer as the storage does. Check the endpoint."
        )
    return int(value)


def checkpoint_limit(name: str) -> int:
    """The most bytes an entry of a checkpoint may hold, by what it is: weights (state_dict.pth,
    safetensors, ONNX) as a model weights file, everything else as a model file."""
    if name == "state_dict.pth" or name.endswith((".safetensors", ".onnx")):
        return reading.WEIGHTS.bytes
    return reading.MODEL_FILE.bytes


def total_limit(entries: Sequence[Entry]) -> int:
    """The most bytes a checkpoint may hold in all: a checkpoint is its weights (state_dict.pth:
    the model and the optimizer's moments; hf/'s model) and small files, so at most four times
    its largest entry, plus SMALL_FILES."""
    return 4 * max((e.size for e in entries), default=0) + SMALL_FILES


def check_entries(entries: Sequence[Entry], url: str, limit_of: Callable[[str], int]) -> None:
    """Every name a path below the checkpoint, no file also a directory, each file within its
    kind's limit and the whole within `total_limit`: refused before a byte is fetched."""
    if len(entries) > MAX_OBJECTS:
        raise DataError(f"{url}: more than {MAX_OBJECTS:,} objects; not a checkpoint.")
    files = {e.name for e in entries if not e.name.endswith("/")}
    for entry in entries:
        if bad := bad_name(entry.name):
            raise DataError(f"{url}: the object {entry.name!r} has {bad}; refusing the checkpoint.")
        parts = entry.name.rstrip("/").split("/")
        shown = f"{url}: {entry.name!r}"
        if any("/".join(parts[:i]) in files for i in range(1, len(parts))):
            raise DataError(f"{shown} lies under an object of the same name; refusing the checkpoint.")
        if entry.name.endswith("/"):
            if entry.size:
                raise DataError(f"{shown} is a directory marker holding bytes; refusing the checkpoint.")
            continue
        limit = limit_of(entry.name)
        if entry.size > limit:
            raise DataError(
                f"{url}/{entry.name}: {entry.size:,} bytes in the listing, more than such a file of a "
                f"checkpoint holds ({limit:,}); refused before downloading."
            )
    total, bound = sum(e.size for e in entries), total_limit(entries)
    if total > bound:
        raise DataError(
            f"{url}: {len(entries):,} objects of {total:,} bytes in all, more than a checkpoint whose "
            f"largest file is {max(e.size for e in entries):,} bytes holds ({bound:,}); refused before "
            "downloading. Give the prefix of one checkpoint."
        )


def check_room(entries: Sequence[Entry], target: Path, url: str) -> None:
    """The disk under `target` holds the download with DISK_MARGIN to spare, or nothing starts."""
    need = sum(e.size for e in entries) + DISK_MARGIN
    free = shutil.disk_usage(target).free
    if free < need:
        raise DataError(
            f"{url}: the download needs {need / 1e6:,.0f} MB and {target} has {free / 1e6:,.0f} MB free; "
            "free space there or set TMPDIR to a disk with room, and run again."
        )


# --------------------------------------------------------------------------------------------
# Progress, a file bounded by its listed size, and a call that may not hang.
# --------------------------------------------------------------------------------------------


class Progress:
    """What a remote operation has moved so far (pages or bytes), as the watch reads it; set
    `abandoned` and the next write stops (the watch gave up on the operation). An operation whose
    writes happen inside an SDK sets `measure` (e.g. the bytes under its target) instead."""

    def __init__(self) -> None:
        self.moved = 0
        self.abandoned = False
        self.measure: Callable[[], int] | None = None

    def now(self) -> int:
        return self.measure() if self.measure is not None else self.moved

    def add(self, amount: int) -> None:
        if self.abandoned:
            raise DataError("abandoned")  # the caller has already said why, in one line
        self.moved += amount


class BoundedFile:
    """A file that takes at most `size` bytes: one more and the download stops there."""

    def __init__(self, file: BinaryIO, size: int, shown: str, progress: Progress) -> None:
        self.file, self.size, self.shown, self.progress, self.written = file, size, shown, progress, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.size:
            raise DataError(
                f"{self.shown}: more bytes arrived than the listing's {self.size:,}; the object "
                "changed while it was downloaded. Run again."
            )
        self.progress.add(len(data))
        return self.file.write(data)


def write_entries(
    entries: Sequence[Entry],
    target: Path,
    url: str,
    progress: Progress,
    read_into: Callable[[Entry, BoundedFile], None],
) -> None:
    """Each listed entry into `target`: directories made, each file new (O_EXCL, no link
    followed), filled by `read_into` within its listed size and refused when it ends short."""
    for entry in sorted(entries, key=lambda e: e.name):
        path = target.joinpath(*entry.name.rstrip("/").split("/"))
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if entry.name.endswith("/"):
            path.mkdir(mode=0o700, exist_ok=True)
            continue
        shown = f"{url}/{entry.name}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as file:
            out = BoundedFile(file, entry.size, shown, progress)
            read_into(entry, out)
        if out.written != entry.size:
            raise DataError(
                f"{shown}: {out.written:,} bytes arrived, the listing says {entry.size:,}; the "
                "download was cut short or the object changed. Run again."
            )


@dataclasses.dataclass(frozen=True)
class Watch:
    """How long a remote operation may take: `deadline_s` in all (None: as long as it moves),
    and at least `least` units moved in every `window_s` (pages of a listing, bytes of a
    download)."""

    what: str  # "listing", "download"
    deadline_s: float | None
    window_s: float
    least: int


LISTING = Watch("listing", LISTING_DEADLINE_S, LISTING_DEADLINE_S, 1)
DOWNLOAD = Watch("download", None, STALL_WINDOW_S, STALL_BYTES)


def watched(call: Callable[[Progress], T], watch: Watch, url: str, advice: str) -> T:
    """`call(progress)` on a thread of its own, given up (one line naming `url`, what happened
    and `advice`) when it passes the watch's deadline or moves too little in a window; the SDKs'
    own timeouts bound each request, this bounds the whole."""
    progress, outcome = Progress(), {}

    def run() -> None:
        try:
            outcome["value"] = call(progress)
        except BaseException as err:  # noqa: BLE001 -- handed to the waiting thread as it is
            outcome["error"] = err

    thread = threading.Thread(target=run, name=f"storage {watch.what}", daemon=True)
    started = time.monotonic()
    thread.start()
    marks = [(started, 0)]
    while thread.is_alive():
        thread.join(0.2)
        now = time.monotonic()
        moved = progress.now()
        marks.append((now, moved))
        while len(marks) > 1 and marks[1][0] <= now - watch.window_s:
            marks.pop(0)
        late = watch.deadline_s is not None and now - started > watch.deadline_s
        stalled = now - marks[0][0] >= watch.window_s and moved - marks[0][1] < watch.least
        if thread.is_alive() and (late or stalled):
            progress.abandoned = True
            so_far = f"{moved:,} {'pages' if watch.what == 'listing' else 'bytes'} so far"
            why = (
                f"did not finish within {watch.deadline_s:.0f} s"
                if late
                else f"moved less than {watch.least:,} {'page' if watch.what == 'listing' else 'bytes'} "
                f"in {watch.window_s:.0f} s"
            )
            raise DataError(f"{url}: the {watch.what} {why} ({so_far}); {advice}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def pages_of(pages: Iterator[Any], progress: Progress, url: str) -> Iterator[Any]:
    """A listing's pages, each counted, at most MAX_PAGES of them."""
    for count, page in enumerate(pages, 1):
        if count > MAX_PAGES:
            raise DataError(
                f"{url}: the listing went on past {MAX_PAGES} pages ({MAX_OBJECTS:,} objects is more than "
                "any checkpoint); the server keeps answering with more. Give the prefix of one checkpoint."
            )
        progress.add(1)
        yield page
