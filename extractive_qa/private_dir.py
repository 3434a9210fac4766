"""This user's private directory on this machine: where a resume keeps its checked copy of a
checkpoint and where a checkpoint downloaded from a master or a bucket is kept, each download
once and whole (`cached_download`). Nobody else can rename, replace or plant anything in it."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from extractive_qa.errors import ConfigError


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
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or stat.S_IMODE(info.st_mode) & 0o077:
        raise ConfigError(
            f"{root}: the directory a resume keeps its checked copy in is not this user's alone "
            f"(owner {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}; a link or another user's). "
            "Remove it, or set TMPDIR to a directory only you can write, and resume again."
        )
    return root


def cached_download(name: str, shown: str, fetch: Callable[[Path], None], reuse: Sequence[str] = ()) -> Path:
    """private_root()/checkpoints/`name`, downloaded once and reused by later calls: a copy kept
    before (under `name` or one of `reuse`, a copy that holds what is asked) is returned as it
    is; else `fetch(directory)` fills a new directory beside its place, which is renamed into
    place only whole -- an interrupted, short or refused download is never used, and is removed.
    `shown` names the source in the line each call prints."""
    cache = private_root() / "checkpoints"
    cache.mkdir(mode=0o700, exist_ok=True)
    for kept in (*reuse, name):
        if (cache / kept).is_dir():
            print(f"{shown}: the copy downloaded before, {cache / kept}", file=sys.stderr)
            return cache / kept
    target = cache / name
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=f".{name}."))
    try:
        fetch(staging / "download")
        try:
            os.replace(staging / "download", target)
        except OSError as err:
            if not target.is_dir():  # not another call's download that got there first
                raise ConfigError(
                    f"{shown}: cannot keep the download at {target} ({err.strerror or err}); free "
                    f"{cache} or set TMPDIR to a directory only you can write, and run again."
                ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    print(f"{shown}: downloaded {size / 1e6:,.1f} MB into {target}; later calls reuse it", file=sys.stderr)
    return target
