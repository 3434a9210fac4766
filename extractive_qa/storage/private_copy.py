"""This user's private directory on this machine, and a checkpoint read from any source into it.

The private root (`private_root`) is where a resume keeps its checked copy of a checkpoint and
where a checkpoint fetched from a master or a bucket is kept: nobody else can rename, replace or
plant anything in it. Two ways a source's files reach a reader:

- `fetched`: the files a resume reads, for one use -- where they lie for a local directory,
  else downloaded into a new directory that is removed afterwards;
- `cached`: a checkpoint kept for later calls (predict.py, export.py, --resume URL). An entry is
  a claim that can be checked: it is keyed by the source's endpoint and URL, and records the
  listing it was downloaded from (names, sizes, version tags). Before use it is checked against
  a fresh listing (a checkpoint rewritten under the same UUID is fetched again), or the line
  says the listing could not be had; an entry that is empty, broken, a link or another user's
  is removed and fetched again.

Every download lands in a staging directory named with its process id and is renamed into place
only whole; a staging directory whose process is gone (a SIGKILL) is removed by the next call.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from extractive_qa.errors import ConfigError, DataError
from extractive_qa.io import reading
from extractive_qa.storage import source
from extractive_qa.storage.source import CheckpointSource, Entry

STAGING = re.compile(r"^\.(?:fetch|stage)-(\d+)-")  # what a download in flight is called, with its pid


def private_root() -> Path:
    """The directory a resume's checked copies live in: <temp dir>/extractive-qa-<uid>, made 0700
    by this user on this machine, with every ancestor owned by this user or root and writable by
    no one else (or sticky, as /tmp is: no one else can rename an entry there). Nobody else can
    then rename, replace or plant anything inside it -- unlike a storage root, which Determined
    makes 0777 for shared_fs."""
    uid = os.getuid()
    base = Path(os.path.realpath(tempfile.gettempdir()))
    for ancestor in (base, *base.parents):
        info = os.stat(ancestor)
        if info.st_uid not in (0, uid) or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
            raise ConfigError(
                f"{ancestor}: other users can write there, so a resume cannot keep its checked copy of "
                "the checkpoint safe under it. Set TMPDIR to a directory only you (or root) can write."
            )
    root = base / f"extractive-qa-{uid}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    own_directory(root, "the directory a resume keeps its checked copy in")
    sweep_stale(root)
    return root


def own_directory(path: Path, what: str) -> None:
    """`path` is a directory (not a link) of this user's that no one else may enter, or ConfigError."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise ConfigError(
            f"{path}: {what} is not this user's alone (owner {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}; a link or another user's). Remove it, or set TMPDIR to a "
            "directory only you can write, and run again."
        )


def sweep_stale(directory: Path) -> None:
    """Staging directories of downloads whose process is gone (killed mid-download) are removed;
    a live process's are left alone."""
    for entry in directory.iterdir() if directory.is_dir() else ():
        match = STAGING.match(entry.name)
        if match and not _alive(int(match[1])) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process of that number: not this user's download
    return True


def _staging(parent: Path, kind: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f".{kind}-{os.getpid()}-", dir=parent))


# --------------------------------------------------------------------------------------------
# Listing and fetching, bounded.
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def named(what: str, src: CheckpointSource) -> Iterator[None]:
    """A storage's refusal, named as the command's argument is (`--checkpoint s3://...: ...`)."""
    try:
        yield
    except DataError as err:
        text = str(err)
        raise DataError(text if text.startswith(what) else f"{what} {text}") from None


def checked_listing(
    src: CheckpointSource, what: str, limit_of: Callable[[str], int], wanted: Callable[[str], bool]
) -> list[Entry]:
    """The source's entries that `wanted` picks, within the listing's deadline and each entry's
    limit; a source that holds nothing is named."""
    with named(what, src):
        entries = source.watched(src.listing, source.LISTING, src.url, src.advice)
    if not entries:
        raise DataError(
            f"{what} {src.url}: no checkpoint there (it holds no files). `python3 train.py --checkpoints`, "
            "`det checkpoint list` or the bucket's listing shows the checkpoints; give one."
        )
    picked = [e for e in entries if wanted(e.name)]
    source.check_entries(picked, f"{what} {src.url}", limit_of)
    return picked


def download(src: CheckpointSource, entries: Sequence[Entry], target: Path, what: str) -> None:
    """`entries` of the source into `target` (new, private), if the disk holds them, each
    download watched for stalls."""
    source.check_room(entries, target, f"{what} {src.url}")
    source.watched(
        lambda progress: src.fetch(entries, target, progress),
        source.DOWNLOAD,
        f"{what} {src.url}",
        src.advice,
    )


@contextlib.contextmanager
def fetched(
    src: CheckpointSource, what: str, limit_of: Callable[[str], int], wanted: Callable[[str], bool]
) -> Iterator[Path]:
    """The files `wanted` picks, readable for one use: where they lie (a local directory: the
    reader opens each as a plain file), or in a new private directory removed afterwards."""
    if src.in_place is not None:
        yield src.in_place
        return
    entries = checked_listing(src, what, limit_of, wanted)
    target = _staging(private_root(), "fetch")
    try:
        download(src, entries, target, what)
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# The cache: a checkpoint kept for later calls, checked against its source before each use.
# --------------------------------------------------------------------------------------------


def cache_name(src: CheckpointSource, part: str | None) -> str:
    """The entry's name: a digest of the endpoint and URL, and the checkpoint's own last name."""
    digest = hashlib.sha256(src.key.encode()).hexdigest()[:16]
    tail = re.sub(r"[^A-Za-z0-9._-]", "_", src.url.rstrip("/").rsplit("/", 1)[-1])[:64]
    return f"{digest}-{tail}" + (f"-{part}" if part else "")


def _record(entries: Sequence[Entry], src: CheckpointSource) -> dict:
    return {
        "source": src.key,
        "url": src.url,
        "entries": sorted([e.name, e.size, e.version] for e in entries),
    }


def _usable(entry: Path, record_path: Path, expected: dict | None) -> bool:
    """Whether a kept entry is whole, this user's alone, and (with `expected`) the listing's."""
    try:
        own_directory(entry, "a kept checkpoint")
        kept = reading.read_json_object(record_path, reading.RECORD, follow_links=False)
    except (OSError, ValueError, ConfigError):
        return False
    names = {name: size for name, size, _ in kept.get("entries", [])}
    if not names or (expected is not None and kept != expected):
        return False
    for name, size in names.items():
        path = entry / name.rstrip("/")
        try:
            info = path.lstat()
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
            return False
        if not name.endswith("/") and (not stat.S_ISREG(info.st_mode) or info.st_size != size):
            return False
    return True


def cached(
    src: CheckpointSource,
    what: str,
    limit_of: Callable[[str], int],
    part: str | None = None,
    check: Callable[[list[Entry]], None] | None = None,
) -> Path:
    """The checkpoint (with `part`, "hf": only that folder and metadata.json -- what serving
    reads) in this user's private cache, fetched whole once and checked against the source's
    listing before each reuse; a local directory is read where it lies. `check` refuses a listing
    that is not this project's checkpoint before anything is fetched."""
    if src.in_place is not None:
        return src.in_place
    cache = private_root() / "checkpoints"
    with contextlib.suppress(FileExistsError):
        os.mkdir(cache, 0o700)
    own_directory(cache, "the checkpoint cache")
    sweep_stale(cache)
    names = [cache_name(src, part)] + ([cache_name(src, None)] if part else [])
    shown = f"{what} {src.url}"
    try:
        entries = checked_listing(src, what, limit_of, lambda name: True)
    except DataError as err:
        for name in names:
            if _usable(cache / name, cache / f"{name}.json", None):
                print(f"{shown}: could not list it to check the copy downloaded before ({err}); using that "
                      f"copy, {cache / name}, as it was", file=sys.stderr)  # fmt: skip
                return cache / name
        raise
    if check is not None:
        check(entries)
    picked = [
        e for e in entries if part is None or e.name == "metadata.json" or e.name.startswith(f"{part}/")
    ]
    for name, listed in zip(names, (picked, entries), strict=False):
        if _usable(cache / name, cache / f"{name}.json", _record(listed, src)):
            print(f"{shown}: the copy downloaded before, {cache / name}", file=sys.stderr)
            return cache / name
    return _download_into_cache(src, what, picked, cache, names[0])


def _download_into_cache(
    src: CheckpointSource, what: str, entries: list[Entry], cache: Path, name: str
) -> Path:
    """`entries` into cache/name with their record beside it, replacing what was kept there (another
    version, or broken); put in place only whole."""
    shown = f"{what} {src.url}"
    for stale in (cache / name, cache / f"{name}.json"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        elif stale.exists() or stale.is_symlink():
            stale.unlink()
    staging = _staging(cache, "stage")
    try:
        (staging / "download").mkdir(mode=0o700)
        download(src, entries, staging / "download", what)
        # A copying download (Determined's SDK: shutil.copytree from shared_fs) gives the folder
        # the storage's mode; the kept copy is this user's alone, as _usable requires.
        os.chmod(staging / "download", 0o700)
        (staging / "record.json").write_text(json.dumps(_record(entries, src)))
        os.replace(staging / "download", cache / name)
        os.replace(staging / "record.json", cache / f"{name}.json")
    except OSError as err:
        raise ConfigError(
            f"{shown}: cannot keep the download at {cache / name} ({err.strerror or err}); free "
            f"{cache} or set TMPDIR to a directory only you can write, and run again."
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(e.size for e in entries)
    print(
        f"{shown}: downloaded {size / 1e6:,.1f} MB into {cache / name}; later calls reuse it", file=sys.stderr
    )
    return cache / name
