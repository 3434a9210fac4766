"""A checkpoint in a directory this machine can read: a local run's, a path given on the command
line, or a cluster's shared_fs or `directory` storage (det_internals.shared_fs_checkpoint maps
the master's host path into the container). Its files are read where they lie, through the
reader (regular files only, never through a link), so fetching one is copying it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from extractive_qa.errors import DataError
from extractive_qa.io import reading
from extractive_qa.storage import source
from extractive_qa.storage.source import Entry, Progress


@dataclasses.dataclass(frozen=True)
class LocalDirectory:
    """A checkpoint directory on a file system this machine mounts (storage.source's protocol)."""

    path: Path

    @property
    def url(self) -> str:
        return str(self.path)

    @property
    def key(self) -> str:
        return f"file {os.path.realpath(self.path)}"

    @property
    def in_place(self) -> Path | None:
        return self.path

    @property
    def partial(self) -> bool:
        return True

    @property
    def advice(self) -> str:
        return "check the file system it lies on is mounted and answering"

    def listing(self, progress: Progress) -> list[Entry]:
        """Every file and directory below it (links are listed as what they are and refused by
        the entries' checks: a checkpoint's files are never links); the version is the
        modification time and inode, which change when a file is rewritten."""
        if not self.path.is_dir():
            raise DataError(f"{self.path}: no such checkpoint directory.")
        found = []
        for root, dirs, files in os.walk(self.path):
            progress.add(1)
            for name in [*dirs, *files]:
                full = Path(root, name)
                info = full.lstat()
                relative = full.relative_to(self.path).as_posix()
                if stat.S_ISLNK(info.st_mode):
                    raise DataError(
                        f"{self.path}: {relative} is a symbolic link; a checkpoint's files never are."
                    )
                if stat.S_ISDIR(info.st_mode):
                    found.append(Entry(relative + "/", 0))
                else:
                    found.append(Entry(relative, info.st_size, f"{info.st_mtime_ns}-{info.st_ino}"))
        return found

    def fetch(self, entries: Sequence[Entry], target: Path, progress: Progress) -> None:
        def copy(entry: Entry, out: source.BoundedFile) -> None:
            # The listing's size bounds the copy (out); the reader refuses a link, a FIFO, a device.
            with reading.open_regular(self.path / entry.name, reading.WEIGHTS, follow_links=False) as file:
                shutil.copyfileobj(file, out, 1 << 20)

        source.write_entries(entries, target, self.url, progress, copy)
