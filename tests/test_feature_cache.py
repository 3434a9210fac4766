"""The feature cache: an entry written once and found again by its fingerprint, damage detected and
rebuilt, a read-only shared cache used when sound, entries readable by others as the umask says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from extractive_qa.config.model_family import EMBEDDED_MODEL
from extractive_qa.config.settings import WindowSpec
from extractive_qa.data import feature_cache, squad_files
from extractive_qa.data.features import load_tokenizer
from extractive_qa.errors import DataError
from tests.support.project import DEV_V1, TRAIN_V1

pytestmark = pytest.mark.cluster_stack  # the cache's arrays are NumPy's, its entries the tokenizers'


def test_cache_roundtrip_and_fingerprint(tokenizer, tiny_bert, tmp_path: Path) -> None:
    squad = squad_files.load_squad(TRAIN_V1, training=True)
    spec = WindowSpec(128, 32, 32)
    f1, state1 = feature_cache.prepare_features(squad, tokenizer, "m", spec, "train", tmp_path)
    f2, state2 = feature_cache.prepare_features(squad, tokenizer, "m", spec, "train", tmp_path)
    assert (state1, state2) == ("built", "hit")
    assert not f2.input_ids.flags.writeable  # a view of the bytes read and checked
    for name in ("input_ids", "lengths", "start_positions", "token_type_ids"):
        assert np.array_equal(getattr(f1, name), getattr(f2, name))
    base = feature_cache.features_fingerprint(squad, "m", tokenizer, spec, "train")
    other_file = squad_files.load_squad(DEV_V1, training=True)
    other_tok = load_tokenizer(str(tiny_bert))
    other_tok.add_tokens(["zzzqqq"])  # a different vocabulary
    variants = [
        feature_cache.features_fingerprint(other_file, "m", tokenizer, spec, "train"),
        feature_cache.features_fingerprint(squad, "other-name", tokenizer, spec, "train"),
        feature_cache.features_fingerprint(squad, "m", other_tok, spec, "train"),
        feature_cache.features_fingerprint(squad, "m", tokenizer, WindowSpec(128, 32, 16), "train"),
        feature_cache.features_fingerprint(squad, "m", tokenizer, WindowSpec(256, 32, 32), "train"),
        feature_cache.features_fingerprint(squad, "m", tokenizer, WindowSpec(128, 64, 32), "train"),
        feature_cache.features_fingerprint(squad, "m", tokenizer, spec, "validation"),
    ]
    assert base not in variants and len(set(variants)) == len(variants)
    assert not list(tmp_path.glob(".*")), "no temporary directories left behind"


@pytest.mark.parametrize("damage", ["truncate", "drop_file", "shape_mismatch", "same_size_bytes"])
def test_damaged_cache_is_detected_and_rebuilt(damage: str, tokenizer, tmp_path: Path, caplog) -> None:
    squad = squad_files.load_squad(TRAIN_V1, training=True)
    spec = WindowSpec(128, 32, 32)
    good = feature_cache.prepare_features(squad, tokenizer, "m", spec, "train", tmp_path)[0].input_ids
    (directory,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    array = directory / "input_ids.npy"
    if damage == "truncate":  # a full disk or a cut-short copy to a shared mount
        array.write_bytes(array.read_bytes()[: array.stat().st_size // 3])
    elif damage == "drop_file":
        array.unlink()
    elif damage == "same_size_bytes":  # contents changed in place: shapes and sizes still agree
        raw = bytearray(array.read_bytes())
        raw[-64:] = b"\xff" * 64
        array.write_bytes(bytes(raw))
    else:  # an array from another build
        np.save(array, np.zeros((3, 5), dtype=np.int32))
    with pytest.raises(feature_cache.CacheDamage, match="input_ids.npy"):
        feature_cache.read_entry(directory)
    with caplog.at_level("WARNING", logger="squad"):
        again, state = feature_cache.prepare_features(squad, tokenizer, "m", spec, "train", tmp_path)
    assert state == "rebuilt" and str(directory) in caplog.text
    assert np.array_equal(again.input_ids, good)
    assert np.array_equal(feature_cache.read_entry(directory).input_ids, good)
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no debris left


def test_bytes_written_after_the_check_never_reach_the_arrays(tokenizer, tmp_path: Path) -> None:
    """A cache hit's arrays are the bytes that were hashed: a file rewritten in place afterwards
    (another user of a shared cache) changes nothing a run reads, as it would through a map."""
    squad = squad_files.load_squad(TRAIN_V1, training=True)
    spec = WindowSpec(128, 32, 32)
    feature_cache.prepare_features(squad, tokenizer, "m", spec, "train", tmp_path)
    hit, state = feature_cache.prepare_features(squad, tokenizer, "m", spec, "train", tmp_path)
    before = hit.input_ids.copy()
    (directory,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    with open(directory / "input_ids.npy", "r+b") as f:  # in place: same inode, same size
        f.seek(-64, 2)
        f.write(b"\xff" * 64)
    assert state == "hit" and np.array_equal(hit.input_ids, before)
    with pytest.raises(feature_cache.CacheDamage, match="SHA-256 differs"):
        feature_cache.read_entry(directory)


def test_data_cli_rebuilds_a_truncated_cache(tmp_path: Path) -> None:
    from tests.support.project import run_cli

    args = ["data.py", "--squad", str(TRAIN_V1), "--tokenizer", EMBEDDED_MODEL, "--split", "train"]
    args += ["--cache-dir", str(tmp_path)]
    assert run_cli(args)["cache"] == "built"
    (directory,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    lengths = directory / "lengths.npy"
    lengths.write_bytes(lengths.read_bytes()[:100])
    assert run_cli(args)["cache"] == "rebuilt"
    assert run_cli(args)["cache"] == "hit"


def test_a_read_only_cache_with_a_sound_entry_is_used_and_without_one_named(
    tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache on a read-only mount (access(2) says EROFS, even to root): a sound entry maps
    without the lock file it cannot create; a missing one is a named error, not Errno 30."""
    import os

    squad = squad_files.load_squad(TRAIN_V1, training=True)
    spec = WindowSpec(128, 32, 32)
    built, _ = feature_cache.prepare_features(squad, tokenizer, "m", spec, "train", tmp_path)
    real_access = os.access

    def read_only(path: object, mode: int) -> bool:
        return False if Path(str(path)) == tmp_path and mode == os.W_OK else real_access(path, mode)

    monkeypatch.setattr(os, "access", read_only)
    again, state = feature_cache.prepare_features(squad, tokenizer, "m", spec, "train", tmp_path)
    assert state == "hit" and np.array_equal(again.input_ids, built.input_ids)
    with pytest.raises(DataError, match="not writable"):
        feature_cache.prepare_features(squad, tokenizer, "m", WindowSpec(128, 48, 32), "train", tmp_path)


def test_cache_entries_and_outputs_are_readable_by_others_as_the_umask_says(
    tokenizer, tmp_path: Path
) -> None:
    """Written through a private temporary (mkstemp 0600, mkdtemp 0700), then given the mode a
    plain write would have: another user of a shared cache or answer directory can read them."""
    import os
    import stat

    from extractive_qa.io.files import write_text_atomic

    old = os.umask(0o022)
    try:
        squad = squad_files.load_squad(TRAIN_V1, training=True)
        spec = WindowSpec(128, 32, 32)
        feature_cache.prepare_features(squad, tokenizer, "m", spec, "train", tmp_path / "c")
        (entry,) = [p for p in (tmp_path / "c").iterdir() if p.is_dir()]
        write_text_atomic(tmp_path / "preds.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "preds.json").stat().st_mode) == 0o644
