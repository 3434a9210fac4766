"""A checkpoint a Determined master hands out by UUID (DET_MASTER, `det user login`), read through
the Determined SDK: its listing is the master's record of the checkpoint's files and sizes, and
its download is the SDK's, whole, checked against that record afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from extractive_qa.errors import DataError
from extractive_qa.storage import source
from extractive_qa.storage.source import Entry, Progress


@dataclasses.dataclass(frozen=True)
class MasterCheckpoint:
    """A checkpoint UUID on the master DET_MASTER names (storage.source's protocol)."""

    uuid: str
    master: str

    @property
    def url(self) -> str:
        return self.uuid

    @property
    def key(self) -> str:
        return f"{self.master} {self.uuid}"

    @property
    def in_place(self) -> Path | None:
        return None

    @property
    def partial(self) -> bool:
        return False  # the SDK downloads a checkpoint whole

    @property
    def advice(self) -> str:
        return f"is the master at {self.master} up (DET_MASTER)?"

    def _checkpoint(self) -> Any:
        from determined.experimental import client

        # A Determined object of its own, not client.login(): that may be called once a process.
        return client.Determined(master=self.master).get_checkpoint(self.uuid)

    def listing(self, progress: Progress) -> list[Entry]:
        with self._sdk_errors("cannot look it up"):
            resources = self._checkpoint().resources or {}
        progress.add(1)
        return [
            Entry(name, source.listed_size(size, name, self.url)) for name, size in sorted(resources.items())
        ]

    def fetch(self, entries: Sequence[Entry], target: Path, progress: Progress) -> None:
        """The SDK downloads the whole checkpoint (it has no selection); every listed file must
        then be there with its listed size, and nothing else."""
        progress.measure = lambda: sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
        with self._sdk_errors("cannot download it"), tar_members_stay_inside():
            self._checkpoint().download(str(target))
        listed = {e.name: e.size for e in entries if not e.name.endswith("/")}
        for path in sorted(target.rglob("*")):
            name = path.relative_to(target).as_posix()
            if path.is_symlink() or (path.is_file() and name not in listed):
                raise DataError(f"{self.url}: the download from {self.master} holds {name}, which the master "
                                "does not list; refusing it.")  # fmt: skip
        for name, size in sorted(listed.items()):
            path = target / name
            if not path.is_file():
                raise DataError(f"{self.url}: the download from {self.master} is incomplete ({name} is "
                                "missing); run again.")  # fmt: skip
            if path.stat().st_size != size:
                raise DataError(
                    f"{self.url}: the download from {self.master} is incomplete ({name} has "
                    f"{path.stat().st_size} bytes, the master records {size}); run again."
                )

    @contextlib.contextmanager
    def _sdk_errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except DataError:
            raise
        except Exception as err:  # the SDK raises many kinds; all mean "the master did not give it"
            why = f"{err}; {err.__cause__}" if err.__cause__ else str(err)  # a proxied download's reason
            raise DataError(f"{self.url}: {what} on {self.master} ({' '.join(why.split())[:300]}).") from None


def from_environment(uuid: str, what: str) -> MasterCheckpoint:
    master = os.environ.get("DET_MASTER")
    if not master:
        raise DataError(
            f"{what} {uuid}: looks like a Determined checkpoint UUID, but DET_MASTER is not set; set it "
            "(and log in with `det user login`) or pass a directory."
        )
    return MasterCheckpoint(uuid, master)


@contextlib.contextmanager
def tar_members_stay_inside() -> Iterator[None]:
    """Where the storage cannot be reached from here, the SDK unpacks the master's tar of the
    checkpoint with a bare extractall: a member named ../x or /x, or a file under a link that
    points out, would land outside the download. tarfile's data filter keeps every member inside
    (refusing ../ and links out, making absolute names relative); it is extractall's default
    while this lasts."""
    if not hasattr(tarfile, "data_filter"):  # Python 3.10.12+ and 3.11.4+ have it
        raise DataError(
            f"unpacking a checkpoint download safely needs Python 3.11.4 or newer (this is "
            f"{sys.version.split()[0]}): its tarfile has no data filter. Upgrade Python."
        )
    # vermin dates extraction_filter to 3.12; the backport to 3.10.12 / 3.11.4 is checked above.
    before = tarfile.TarFile.extraction_filter  # novermin
    tarfile.TarFile.extraction_filter = staticmethod(tarfile.data_filter)  # novermin
    try:
        yield
    finally:
        tarfile.TarFile.extraction_filter = before  # novermin
