"""The download cache in this user's private directory: a checkpoint fetched once, kept only
whole, reused by later calls; a download that cannot be put in place is named, never returned."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from extractive_qa import private_dir
from extractive_qa.errors import ConfigError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private root of this test's own (tempfile's directory, as TMPDIR sets it)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return private_dir.private_root() / "checkpoints"


def fetch_into(files: dict[str, str], calls: list[Path]):
    def fetch(directory: Path) -> None:
        calls.append(directory)
        directory.mkdir()
        for name, text in files.items():
            (directory / name).write_text(text)

    return fetch


def test_a_download_is_fetched_once_and_reused(cache: Path) -> None:
    calls: list[Path] = []
    fetch = fetch_into({"metadata.json": "{}"}, calls)
    first = private_dir.cached_download("abc", "--checkpoint abc", fetch)
    again = private_dir.cached_download("abc", "--checkpoint abc", fetch)
    assert first == again == cache / "abc" and len(calls) == 1
    assert (first / "metadata.json").read_text() == "{}"
    assert sorted(p.name for p in cache.iterdir()) == ["abc"]  # no staging directory left


def test_a_failed_fetch_leaves_nothing_and_the_next_call_fetches_again(cache: Path) -> None:
    def broken(directory: Path) -> None:
        directory.mkdir()
        (directory / "half").write_text("x")
        raise ConfigError("the storage went away")

    with pytest.raises(ConfigError, match="went away"):
        private_dir.cached_download("abc", "--checkpoint abc", broken)
    assert list(cache.iterdir()) == []
    calls: list[Path] = []
    kept = private_dir.cached_download("abc", "--checkpoint abc", fetch_into({"a": "1"}, calls))
    assert len(calls) == 1 and sorted(p.name for p in kept.iterdir()) == ["a"]


def test_a_download_another_call_placed_first_is_the_one_used(cache: Path) -> None:
    """Two processes fetching one checkpoint: the second rename finds the first one's copy (the
    same files) and uses it."""

    def racing(directory: Path) -> None:
        fetch_into({"a": "theirs"}, [])(cache / "abc")  # the other call finishes first
        fetch_into({"a": "mine"}, [])(directory)

    kept = private_dir.cached_download("abc", "--checkpoint abc", racing)
    assert kept == cache / "abc" and (kept / "a").read_text() == "theirs"
    assert sorted(p.name for p in cache.iterdir()) == ["abc"]


def test_a_download_that_cannot_be_put_in_place_is_named_not_returned(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename refused for any other reason leaves no copy at the target: the call must say so,
    not return a directory that does not exist (which predict.py would then call "not a
    checkpoint of this project")."""

    def refused(source: object, target: object) -> None:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(private_dir.os, "replace", refused)
    kept_nowhere = r"--checkpoint abc: cannot keep the download at .*abc \(Permission"
    with pytest.raises(ConfigError, match=kept_nowhere):
        private_dir.cached_download("abc", "--checkpoint abc", fetch_into({"a": "1"}, []))
    assert list(cache.iterdir()) == []  # the staging copy is removed
