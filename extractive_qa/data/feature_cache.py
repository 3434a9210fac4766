"""The feature cache: NumPy arrays in a directory named by a fingerprint of everything that shapes
them, built once per machine (file lock), read and checked by every rank, damage detected."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from extractive_qa.config.settings import WindowSpec
from extractive_qa.data.features import Features, build_features, tokenizer_fingerprint
from extractive_qa.data.squad_files import SquadSet
from extractive_qa.errors import DataError
from extractive_qa.io import reading
from extractive_qa.io.files import file_lock, shared_mode

logger = logging.getLogger("squad")

# Bump when the feature layout or labelling changes: old caches then stop matching.
# 4: meta.json records each array file's SHA-256.
FEATURES_VERSION = "4"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with reading.open_regular(path, reading.DATA, follow_links=False) as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Cache: NumPy arrays in a directory named by a fingerprint of everything that shapes them.
# --------------------------------------------------------------------------------------------


def features_fingerprint(
    squad: SquadSet, tokenizer_name: str, tokenizer: Any, spec: WindowSpec, split: str
) -> str:
    key = {
        "file_sha256": squad.sha256,
        "tokenizer": tokenizer_name,
        "vocab_sha256": tokenizer_fingerprint(tokenizer),
        "spec": [spec.max_seq_length, spec.doc_stride, spec.max_query_length],
        "split": split,
        "code": FEATURES_VERSION,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def _save_features(features: Features, directory: Path, meta: dict[str, Any]) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    try:
        for name in Features.ARRAYS:
            array = getattr(features, name)
            if array is not None:
                np.save(tmp / f"{name}.npy", array, allow_pickle=False)
        arrays = {
            name: {
                "shape": list(getattr(features, name).shape),
                "dtype": getattr(features, name).dtype.str,
                "sha256": file_sha256(tmp / f"{name}.npy"),
            }
            for name in Features.ARRAYS
            if getattr(features, name) is not None
        }
        meta = {**meta, "cls_index": features.cls_index, "features": len(features), "arrays": arrays}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        shared_mode(tmp, directory=True)  # other users of a shared cache can map it
        os.replace(tmp, directory)  # atomic publish of the whole directory
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class CacheDamage(Exception):
    """Why a cache directory cannot be used as it is."""


def read_entry(directory: Path) -> Features:
    """The arrays of a cache directory, each file read once, checked, and used as read.

    Each array file is checked against what meta.json says it holds (shape, dtype), against the
    bytes its own header promises, so a truncated copy (a full disk, a partial rsync to a shared
    mount) is caught, and against its SHA-256, so bytes changed in place are too. The arrays are
    read-only views of the very bytes that were hashed: a file rewritten after the check never
    reaches training, as it could through a memory map (cost: bench/cache_check.py,
    docs/results.md). Raises CacheDamage.
    """
    try:
        meta = reading.read_json_object(directory / "meta.json", reading.RECORD, follow_links=False)
    except reading.UnreadableFile as err:
        raise CacheDamage(f"meta.json unreadable ({err})") from None
    arrays = meta.get("arrays")
    if (
        not isinstance(arrays, dict)
        or set(arrays) - set(Features.ARRAYS)
        or not all(
            isinstance(r, dict) and isinstance(r.get("shape"), list) and isinstance(r.get("dtype"), str)
            for r in arrays.values()
        )
    ):
        raise CacheDamage("meta.json holds no array records of this cache's arrays")
    if type(meta.get("cls_index")) is not int:
        raise CacheDamage("meta.json's cls_index is not an integer")
    return Features(
        **{name: _read_array(directory / f"{name}.npy", record) for name, record in arrays.items()},
        cls_index=meta["cls_index"],
    )


def _read_array(path: Path, record: dict[str, Any]) -> np.ndarray:
    """One .npy file as a read-only array over its bytes, if they are the ones `record` describes."""
    try:
        data = reading.read_bytes(path, reading.DATA, follow_links=False)
        header = io.BytesIO(data)
        version = np.lib.format.read_magic(header)
        read_header = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, fortran_order, dtype = read_header(header)
    except (OSError, ValueError, reading.UnreadableFile) as err:
        raise CacheDamage(f"{path.name}: unreadable ({err})") from None
    if list(shape) != record["shape"] or dtype.str != record["dtype"] or fortran_order:
        said = f"{record['shape']} {record['dtype']}"
        raise CacheDamage(f"{path.name}: holds {list(shape)} {dtype.str}, meta.json says {said}")
    count, offset = int(np.prod(shape, dtype=np.int64)), header.tell()
    if len(data) != offset + count * dtype.itemsize:
        raise CacheDamage(f"{path.name}: {len(data)} bytes, expected {offset + count * dtype.itemsize}")
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise CacheDamage(f"{path.name}: its contents are not the ones written (SHA-256 differs)")
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)


def features_damage(features: Features, squad: SquadSet, spec: WindowSpec, vocabulary: int) -> str | None:
    """Why arrays whose files are intact still cannot be these questions' windows (None: they can).

    The SHA-256 records catch bytes changed behind meta.json's back, not a cache rewritten whole
    with its records; such arrays would index past a context, a vocabulary or the question list
    after minutes of training. Checked here in a few vectorised passes (0.1 s on SQuAD v1.1)."""
    rows = len(features)
    width = features.input_ids.shape[1] if features.input_ids.ndim == 2 else -1
    if features.input_ids.ndim != 2 or not 0 < width <= spec.max_seq_length or rows == 0:
        shape = features.input_ids.shape
        return f"input_ids are {shape}, not windows of at most {spec.max_seq_length} tokens"
    for name in Features.ARRAYS:
        array = getattr(features, name)
        if array is not None and (array.shape[0] != rows or np.issubdtype(array.dtype, np.floating)):
            return f"{name} has {array.shape[0]} rows of {array.dtype}, the windows {rows}"
    if int(features.input_ids.min()) < 0 or int(features.input_ids.max()) >= vocabulary:
        return f"input_ids outside the tokenizer's {vocabulary} tokens"
    if int(features.lengths.min()) < 1 or int(features.lengths.max()) > width:
        return f"window lengths outside 1..{width}"
    index = features.example_index
    if int(index.min()) < 0 or int(index.max()) >= len(squad.examples) or np.any(np.diff(index) < 0):
        return f"example_index outside the {len(squad.examples)} questions, or out of order"
    for name in ("start_positions", "end_positions"):
        labels = getattr(features, name)
        if labels is not None and (int(labels.min()) < 0 or int(labels.max()) >= width):
            return f"{name} outside the windows' {width} tokens"
    if features.offsets is not None:
        contexts = np.array([len(example.context) for example in squad.examples], dtype=np.int64)
        ends = features.offsets[..., 1].max(axis=1)
        if int(features.offsets.min()) < -1 or np.any(ends > contexts[index]):
            return "character offsets outside their contexts"
    return None


def prepare_features(
    squad: SquadSet,
    tokenizer: Any,
    tokenizer_name: str,
    spec: WindowSpec,
    split: str,
    cache_dir: Path | None,
    progress: bool = False,
) -> tuple[Features, str]:
    """Features for a split, from the cache when present. Returns (features, cache state: off,
    hit, built or rebuilt)."""
    training = split == "train"

    def build() -> Features:
        return build_features(
            squad.examples, tokenizer, spec, labels=training, offsets=not training, progress=progress
        )

    if cache_dir is None:
        return build(), "off"
    fp = features_fingerprint(squad, tokenizer_name, tokenizer, spec, split)
    directory = Path(cache_dir) / f"{split}-{fp}"

    def sound_entry() -> Features | str:  # the files, then the arrays against these questions
        if not directory.exists():
            return "no entry for this data and tokenizer"
        try:
            features = read_entry(directory)
        except CacheDamage as err:
            return str(err)
        return features_damage(features, squad, spec, len(tokenizer)) or features

    if Path(cache_dir).is_dir() and not os.access(cache_dir, os.W_OK):
        # A read-only cache (a shared mount built by someone else): a sound entry is used without
        # the lock, which would need a lock file there.
        found = sound_entry()
        if isinstance(found, Features):
            return found, "hit"
        raise DataError(
            f"data.cache_dir {cache_dir}: not writable, and its entry {directory.name} cannot be "
            f"used ({found}). Point data.cache_dir at a writable directory, or build the entry "
            "there first (python3 data.py)."
        )
    with file_lock(directory):  # one process builds; the others wait and read it
        remove_stale_builds(directory)
        state = "built"
        if directory.exists():
            found = sound_entry()
            if isinstance(found, Features):
                return found, "hit"
            logger.warning("feature cache %s is damaged (%s); rebuilding it", directory, found)
            aside = directory.with_name(f".{directory.name}.damaged-{os.getpid()}")
            os.replace(directory, aside)
            shutil.rmtree(aside, ignore_errors=True)
            state = "rebuilt"
        features = build()
        save_features(features, directory, squad, split, cache_dir)
    return features, state


def remove_stale_builds(directory: Path) -> None:
    """Temporary build directories of this entry that a killed process left behind: only the
    lock's holder builds, so any that exist while it is held are dead."""
    for stale in directory.parent.glob(f".{directory.name}.*"):
        if stale.is_dir():
            logger.warning("removing %s, left by an interrupted feature-cache build", stale)
            shutil.rmtree(stale, ignore_errors=True)


def save_features(features: Features, directory: Path, squad: SquadSet, split: str, cache_dir: Path) -> None:
    """The entry written whole (its partial directory removed on failure), or a DataError saying
    how much room it needs."""
    meta = {"source": str(squad.path), "split": split, "examples": len(squad.examples)}
    try:
        _save_features(features, directory, meta)
    except OSError as err:
        arrays = (getattr(features, name) for name in Features.ARRAYS)
        needed = sum(array.nbytes for array in arrays if array is not None)
        raise DataError(
            f"data.cache_dir {cache_dir}: cannot write the feature cache ({err.strerror or err}); "
            f"it needs about {needed / 1e6:.0f} MB. Free space there, or point data.cache_dir "
            "elsewhere."
        ) from None
