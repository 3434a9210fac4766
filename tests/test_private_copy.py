"""A checkpoint read from any source into this user's private directory
(extractive_qa/storage/private_copy.py): fetched once and kept only whole; a kept copy is a claim
checked against a fresh listing before each use (a rewritten checkpoint, another endpoint, an
emptied, linked or foreign entry are fetched again); a staging directory left by a killed
download is swept; a source that cannot be listed is said, and its copy used as it was."""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from extractive_qa.errors import ConfigError, DataError
from extractive_qa.storage import private_copy, source
from extractive_qa.storage.source import Entry, Progress


@dataclasses.dataclass
class FakeSource:
    """A checkpoint held in memory: name -> (bytes, version); `endpoint` is part of its key."""

    files: dict[str, tuple[bytes, str]]
    endpoint: str = "http://a"
    fetches: int = 0
    down: bool = False

    url = "s3://bucket/runs/0123"
    in_place = None
    partial = True
    advice = "is it up?"

    @property
    def key(self) -> str:
        return f"{self.endpoint} {self.url}"

    def listing(self, progress: Progress) -> list[Entry]:
        if self.down:
            raise DataError(f"{self.url}: cannot read the bucket (connection refused).")
        progress.add(1)
        return [Entry(name, len(data), version) for name, (data, version) in self.files.items()]

    def fetch(self, entries: Sequence[Entry], target: Path, progress: Progress) -> None:
        self.fetches += 1
        source.write_entries(
            entries, target, self.url, progress, lambda e, out: out.write(self.files[e.name][0])
        )


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private root of this test's own (tempfile's directory, as TMPDIR sets it)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return private_copy.private_root()


def cached(src: FakeSource, part: str | None = None) -> Path:
    return private_copy.cached(src, "--checkpoint", source.checkpoint_limit, part=part)


def test_a_checkpoint_is_fetched_once_and_reused_while_its_listing_holds(root: Path) -> None:
    src = FakeSource({"metadata.json": (b"{}", "v1"), "hf/config.json": (b"{1}", "v1")})
    first, again = cached(src), cached(src)
    assert first == again and src.fetches == 1
    assert (first / "hf" / "config.json").read_bytes() == b"{1}"
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == [first.name, f"{first.name}.json"]


def test_a_checkpoint_rewritten_under_the_same_url_is_fetched_again(root: Path) -> None:
    src = FakeSource({"metadata.json": (b"{}", "v1")})
    first = cached(src)
    src.files["metadata.json"] = (b"{2}", "v2")  # the same name, another version and size
    again = cached(src)
    assert src.fetches == 2 and again == first and (again / "metadata.json").read_bytes() == b"{2}"


def test_the_same_url_on_another_endpoint_is_another_checkpoint(root: Path) -> None:
    a = FakeSource({"metadata.json": (b"{a}", "1")}, endpoint="http://a")
    b = FakeSource({"metadata.json": (b"{b}", "1")}, endpoint="http://b")
    assert (cached(a) / "metadata.json").read_bytes() == b"{a}"
    assert (cached(b) / "metadata.json").read_bytes() == b"{b}" and b.fetches == 1


@pytest.mark.parametrize("damage", ["emptied", "a link", "a file changed"])
def test_a_broken_or_changed_entry_is_fetched_again(damage: str, root: Path, tmp_path: Path) -> None:
    src = FakeSource({"metadata.json": (b"{}", "v1"), "hf/config.json": (b"{1}", "v1")})
    kept = cached(src)
    if damage == "emptied":
        for path in sorted(kept.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
    elif damage == "a link":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "metadata.json").write_text("{}")
        (kept / "metadata.json").unlink()
        (kept / "metadata.json").symlink_to(elsewhere / "metadata.json")
    else:
        (kept / "hf" / "config.json").write_bytes(b"{22}")
    again = cached(src)
    assert src.fetches == 2 and (again / "hf" / "config.json").read_bytes() == b"{1}"
    assert not (again / "metadata.json").is_symlink()


def test_a_failed_fetch_leaves_nothing_and_the_next_call_fetches_again(root: Path) -> None:
    src = FakeSource({"metadata.json": (b"{}", "v1")})
    real = src.fetch

    def broken(entries: Sequence[Entry], target: Path, progress: Progress) -> None:
        (target / "half").write_text("x")
        raise DataError("the storage went away")

    src.fetch = broken  # type: ignore[method-assign]
    with pytest.raises(DataError, match="went away"):
        cached(src)
    assert list((root / "checkpoints").iterdir()) == []
    src.fetch = real  # type: ignore[method-assign]
    assert (cached(src) / "metadata.json").read_bytes() == b"{}"


def test_a_source_that_cannot_be_listed_is_said_and_its_copy_used_as_it_was(root: Path, capsys) -> None:
    src = FakeSource({"metadata.json": (b"{}", "v1")})
    kept = cached(src)
    src.down = True
    assert cached(src) == kept
    said = capsys.readouterr().err
    assert "could not list it to check the copy downloaded before" in said and "connection refused" in said
    with pytest.raises(DataError, match="connection refused"):  # nothing kept: the reason, in one line
        cached(FakeSource({"x": (b"1", "1")}, endpoint="http://elsewhere", down=True))


def test_a_staging_directory_of_a_killed_download_is_swept_and_a_live_one_kept(root: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = root / f".fetch-{int(dead.stdout)}-abc"
    live = root / f".fetch-{os.getpid()}-def"
    for path in (gone, live):
        path.mkdir()
        (path / "state_dict.pth").write_bytes(b"x" * 10)
    private_copy.private_root()
    assert not gone.exists() and live.exists()


def test_a_cache_that_is_another_users_or_a_link_is_refused(root: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "open"
    elsewhere.mkdir(mode=0o777)
    (root / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="checkpoint cache is not this user's alone"):
        cached(FakeSource({"metadata.json": (b"{}", "v1")}))


def test_a_download_that_cannot_be_put_in_place_is_named_not_returned(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename refused leaves no copy at the target: the call says so, not return a directory
    that does not exist (which predict.py would then call "not a checkpoint of this project")."""

    def refused(source: object, target: object) -> None:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(private_copy.os, "replace", refused)
    with pytest.raises(ConfigError, match=r"--checkpoint s3://bucket/runs/0123: cannot keep the download at"):
        cached(FakeSource({"metadata.json": (b"{}", "v1")}))
    assert list((root / "checkpoints").iterdir()) == []  # the staging copy is removed
