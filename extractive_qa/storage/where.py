"""Where a checkpoint lies, as a source: what a user types (a directory, an s3://, gs:// or
azure:// URL, a master's UUID) or what a cluster trial is given (its checkpoint_storage and the
master's latest checkpoint id). The one place a storage is told from another; everything past it
reads a `storage.source.CheckpointSource`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from extractive_qa import det_internals
from extractive_qa.errors import DataError
from extractive_qa.storage import buckets, master
from extractive_qa.storage.buckets import BucketSource
from extractive_qa.storage.local_dir import LocalDirectory
from extractive_qa.storage.source import CheckpointSource

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
STORAGE_TYPES = ("shared_fs", "directory", "s3", "gcs", "azure")


def source_for(text: str | Path, what: str) -> CheckpointSource:
    """The checkpoint a command line names: a bucket URL, an existing path, a master's UUID (a
    UUID is never a URL, and a directory of that name wins), or a path the caller then finds
    missing (LocalDirectory names it)."""
    if isinstance(text, str) and buckets.is_url(text):
        return BucketSource(buckets.parse_url(text, what))
    path = Path(text)
    if not path.exists() and UUID.match(str(text)):
        return master.from_environment(str(text), what)
    return LocalDirectory(path)


def in_storage(exp_conf: dict[str, Any], storage_id: str) -> CheckpointSource:
    """A cluster's checkpoint `storage_id` in its experiment's checkpoint_storage: a directory on
    shared_fs (or `directory`) as this container sees it, or its place in a bucket."""
    conf = exp_conf.get("checkpoint_storage") or {}
    kind = conf.get("type")
    if kind in ("shared_fs", "directory"):
        path = det_internals.shared_fs_checkpoint(exp_conf, storage_id)
        assert path is not None  # a shared_fs or directory storage always has its path
        return LocalDirectory(path)
    if kind in ("s3", "gcs", "azure"):
        return BucketSource(buckets.from_storage(conf, storage_id))
    raise DataError(
        f"checkpoint_storage.type {kind!r}: a checkpoint there cannot be read by this trial; use one of "
        f"{', '.join(STORAGE_TYPES)}."
    )
