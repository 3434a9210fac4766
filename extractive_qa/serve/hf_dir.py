"""Where a checkpoint's model for answering is: a checkpoint directory train.py or a cluster wrote,
its hf/ export, a directory export.py wrote, a Determined checkpoint UUID (downloaded through
the Determined SDK when a master is reachable) or a checkpoint's s3:// or gs:// URL.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from extractive_qa import buckets
from extractive_qa.errors import DataError
from extractive_qa.private_dir import cached_download
from extractive_qa.qa import qa_settings

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def find_hf_dir(checkpoint: str) -> Path:
    """The hf/ export inside a checkpoint (downloading a UUID through the Determined SDK, an
    s3:// or gs:// URL from its bucket)."""
    if buckets.is_url(checkpoint):
        return _hf_dir_of(buckets.cached_checkpoint(checkpoint, "--checkpoint", part="hf"), checkpoint)
    path = Path(checkpoint)
    if not path.exists() and UUID.match(checkpoint):
        path = download_checkpoint(checkpoint)
    if not path.is_dir():
        raise DataError(f"--checkpoint {checkpoint}: {_not_a_directory(path)}")
    return _hf_dir_of(path, checkpoint)


LIST_THEM = "`python3 train.py --checkpoints` lists the checkpoints a run wrote, with the path to paste"


def _not_a_directory(path: Path) -> str:
    """Why `path` names no checkpoint, with where it was looked for and the next command."""
    where = Path.cwd() / path if not path.is_absolute() else path
    if path.name == "UUID":
        return (
            "UUID stands for a checkpoint's directory name, the one a run printed "
            f'("checkpoint": ...). {LIST_THEM}; none yet: train one first with `python3 train.py`.'
        )
    if path.exists():
        return f"{where} is a file, not a checkpoint directory. {LIST_THEM}."
    return (
        f"no such directory ({where}), and not a Determined checkpoint UUID or an s3:// or gs:// URL. "
        f"{LIST_THEM}; none yet: train one first with `python3 train.py`."
    )


def _hf_dir_of(path: Path, checkpoint: str) -> Path:
    """path/hf, or path itself (an hf/ or export.py's directory), if it holds this project's
    config.json and qa_settings.json."""
    for candidate in (path / "hf", path):
        if (candidate / "config.json").is_file() and (candidate / qa_settings.QA_SETTINGS).is_file():
            return candidate
    raise DataError(
        f"--checkpoint {checkpoint}: not a checkpoint of this project (no hf/config.json and "
        "hf/qa_settings.json); pass a directory train.py wrote."
    )


def download_checkpoint(uuid: str) -> Path:
    """The checkpoint UUID through the Determined SDK, in this user's private directory
    (private_dir.cached_download: fetched once, whole, reused by later calls). Each file the
    master lists must be there with the size it records, and the checkpoint must be this
    project's, before the download is kept."""
    from determined.experimental import client

    master = os.environ.get("DET_MASTER")
    if not master:
        raise DataError(
            f"--checkpoint {uuid}: looks like a Determined checkpoint UUID, but DET_MASTER is not "
            "set; set it (and log in with `det user login`) or pass a directory."
        )

    def fetch(directory: Path) -> None:
        try:
            # A Determined object of its own, not client.login(): that may be called once a process.
            checkpoint = client.Determined(master=master).get_checkpoint(uuid)
            with _tar_members_stay_inside():
                checkpoint.download(str(directory))
        except DataError:
            raise
        except Exception as err:  # the SDK raises many kinds; all mean "could not fetch"
            why = f"{err}; {err.__cause__}" if err.__cause__ else str(err)  # a proxied download's reason
            raise DataError(f"--checkpoint {uuid}: cannot download from {master} ({why}).") from None
        if problem := _short_of_record(directory, checkpoint.resources or {}):
            raise DataError(
                f"--checkpoint {uuid}: the download from {master} is incomplete ({problem}); run again."
            )
        _hf_dir_of(directory, uuid)  # not this project's: refused now, not kept

    return cached_download(uuid, f"--checkpoint {uuid}", fetch)


def _short_of_record(directory: Path, resources: dict[str, Any]) -> str | None:
    """The first file the master lists (path -> bytes, as a decimal string; a directory ends in
    '/') that the download lacks or holds at another size, or None."""
    for name, recorded in sorted(resources.items()):
        if name.endswith("/"):
            continue
        path = directory / name
        if not path.is_file() or path.is_symlink():
            return f"{name} is missing"
        size = path.stat().st_size
        if str(recorded) != str(size):
            return f"{name} has {size} bytes, the master records {recorded}"
    return None


@contextlib.contextmanager
def _tar_members_stay_inside() -> Iterator[None]:
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
