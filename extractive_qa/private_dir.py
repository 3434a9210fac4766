"""This user's private directory on this machine: where a resume keeps its checked copy of a
checkpoint and where a checkpoint downloaded from a master or a bucket is kept. Nobody else can
rename, replace or plant anything in it."""

from __future__ import annotations

import os
import stat
import tempfile
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
