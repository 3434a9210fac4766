"""Checkpoints in S3, GCS and Azure Blob, against the real APIs on loopback (moto's S3 server,
gcp-storage-emulator, Azurite): a checkpoint uploaded by Determined's own storage manager comes
back whole through an s3://, gs:// or azure:// URL; predict.py, export.py and train.py --resume
take the URL; what a bucket can hold that is not a checkpoint, or not the listed one, gets one
line and exit 2 with nothing half-written; a planted pickle in a bucket runs nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extractive_qa.io import reading
from extractive_qa.storage import private_copy, source, where
from tests.support import object_stores
from tests.support.project import DEV_V1, completed, run_train, trained_config

pytestmark = pytest.mark.cluster_stack  # the SDKs and the resume guard on both stacks

QUESTION = ["--question", "Who won the title?", "--context", "Denver won the title in 2016."]


@pytest.fixture(scope="module", params=[*object_stores.KINDS, "azure"])
def store(request: pytest.FixtureRequest) -> Iterator[object_stores.ObjectStore]:
    with object_stores.object_store(request.param) as store:
        yield store


@pytest.fixture
def private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: object_stores.ObjectStore) -> Path:
    """This test's own private directory (private_root() lives under the temp dir), with the
    bucket's endpoint and keys in the environment, as a user sets them."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    return tmp_path / "tmp" / f"extractive-qa-{os.getuid()}"


def cached(url: str, what: str, part: str | None = None) -> Path:
    """The checkpoint at `url` in the private cache, as predict.py (part="hf") and --resume keep it."""
    return private_copy.cached(where.source_for(url, what), what, source.checkpoint_limit, part=part)


def uploaded(store: object_stores.ObjectStore, checkpoint: Path, name: str) -> str:
    """The checkpoint uploaded as a trial uploads it (Determined's storage manager): its URL."""
    store.upload(checkpoint, name)
    return store.url(name)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (None) under root, by relative path."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))
    }


def test_a_checkpoint_goes_up_and_comes_back_whole_once(trained, store, private: Path) -> None:
    """Every file of the checkpoint (state, records, hf/, the code copy) and every empty directory
    comes back byte for byte; the bytes down equal the bytes up; a second call reuses the copy."""
    ckpt, _ = trained
    (ckpt / "empty-dir").mkdir(exist_ok=True)
    try:
        url = uploaded(store, ckpt, "whole")
        listed = store.listing(store.key("whole/"))
        copy = cached(url, "--checkpoint")
        assert tree(copy) == tree(ckpt)
    finally:
        (ckpt / "empty-dir").rmdir()
    assert sum(listed.values()) == sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    assert {k for k in listed if k.endswith("/")} >= {store.key("whole/hf/")}
    assert copy.parent == private / "checkpoints" and (private / "checkpoints").stat().st_mode & 0o077 == 0
    assert cached(url, "--checkpoint") == copy  # reused: the listing is the one it was fetched from


def test_serving_fetches_only_hf_and_a_resume_the_whole_checkpoint(trained, store, private: Path) -> None:
    """predict.py and export.py read hf/ alone: from a bucket they fetch it and metadata.json,
    byte for byte, and not the optimizer state (most of a checkpoint's bytes); a resume fetches
    the whole checkpoint, and serving then reuses that copy."""
    ckpt, _ = trained
    url = uploaded(store, ckpt, "served-part")
    part = cached(url, "--checkpoint", part="hf")
    wanted = {k: v for k, v in tree(ckpt).items() if k == "metadata.json" or k.startswith("hf")}
    assert tree(part) == wanted and not (part / "state_dict.pth").exists()
    assert cached(url, "--checkpoint", part="hf") == part  # reused
    whole = cached(url, "--resume")
    assert whole != part and tree(whole) == tree(ckpt)
    other = uploaded(store, ckpt, "resumed-first")
    first = cached(other, "--resume")
    assert cached(other, "--checkpoint", part="hf") == first
    store.put(store.key("no-hf/metadata.json"), b"{}")
    assert "not a checkpoint of this project (no hf/config.json" in _refused(store.url("no-hf"))


def test_predict_and_resume_take_a_bucket_url(trained, store, private: Path, tmp_path: Path) -> None:
    """predict.py --checkpoint s3://… / gs://… answers as the local checkpoint does; train.py
    --resume URL continues it exactly as --resume DIR does."""
    ckpt, _ = trained
    url = uploaded(store, ckpt, "served")
    local = completed(
        ["predict.py", "--checkpoint", str(ckpt), "--squad", str(DEV_V1), "--out", str(tmp_path / "a.json")]
    )
    remote = completed(
        ["predict.py", "--checkpoint", url, "--squad", str(DEV_V1), "--out", str(tmp_path / "b.json")]
    )
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    assert f"--checkpoint {url}: downloaded" in remote.stderr
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads((tmp_path / "a.json").read_text())
    common = [
        "--config",
        str(trained_config(ckpt)),
        "--checkpoint-dir",
        str(tmp_path / "out"),
        "--batches",
        "8",
    ]
    code, by_url, err = run_train([*common, "--resume", url])
    assert code == 0, err
    code, by_dir, err = run_train([*common, "--resume", str(ckpt)])
    assert code == 0, err
    assert by_url["steps_completed"] == by_dir["steps_completed"] == 8
    assert (by_url["last_train_loss"], by_url["f1"]) == (by_dir["last_train_loss"], by_dir["f1"])


@pytest.mark.skipif(importlib.util.find_spec("onnx") is None, reason="needs requirements-export.txt")
def test_export_takes_a_bucket_url(trained, store, private: Path, tmp_path: Path) -> None:
    ckpt, _ = trained
    url = uploaded(store, ckpt, "exported")
    out = completed(["export.py", "--checkpoint", url, "--out", str(tmp_path / "exported")])
    assert out.returncode == 0 and f"--checkpoint {url}: downloaded" in out.stderr, out.stderr
    answer = completed(
        ["predict.py", "--checkpoint", str(tmp_path / "exported"), "--runtime", "onnx", *QUESTION]
    )
    assert answer.returncode == 0, answer.stderr


def _refused(url: str, *extra: str) -> str:
    out = completed(["predict.py", "--checkpoint", url, *QUESTION, *extra])
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert "Traceback" not in out.stderr and len(lines) == 1, out.stderr
    return lines[0]


def test_what_is_not_a_checkpoint_is_named_in_one_line(trained, store, private: Path) -> None:
    ckpt, _ = trained
    scheme, bucket = store.scheme, store.bucket
    assert "no checkpoint there" in _refused(store.url("nothing-here"))
    store.put(store.key("a-file"), b"{}")
    assert "an object, not a checkpoint directory" in _refused(store.url("a-file"))
    store.put(store.key("not-one/notes.txt"), b"hello")
    assert "no metadata.json" in _refused(store.url("not-one"))
    assert "cannot read the bucket" in _refused(f"{scheme}://no-such-bucket/{object_stores.PREFIX}/x")
    assert "not a checkpoint URL" in _refused(f"{scheme}://{bucket}")
    assert not list((private / "checkpoints").iterdir())


def test_a_key_that_would_leave_the_directory_is_refused_before_anything_is_fetched(
    trained, store, private: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key with '..' parts (S3 stores it as given; Determined's own download would write it at
    os.path.join(dst, relpath(key)), outside) or an empty part (GCS): the checkpoint is refused
    from its listing, and no object is fetched."""
    ckpt, _ = trained
    url = uploaded(store, ckpt, "climbing")
    bad = "../../outside" if store.kind == "s3" else "hf//config.json"  # the emulator refuses '..'
    store.put(store.key(f"climbing/{bad}"), b"x")
    fetched: list[str] = []
    monkeypatch.setattr(source.BoundedFile, "write", lambda self, data: fetched.append(self.shown))
    line = _refused(url)
    assert "has an empty, '.' or '..' part; refusing the checkpoint" in line and bad in line
    assert fetched == [] and not list((private / "checkpoints").iterdir())


def test_an_object_over_its_limit_is_refused_from_the_listing(
    trained, store, private: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt, _ = trained
    url = uploaded(store, ckpt, "large")
    fetched: list[str] = []
    monkeypatch.setattr(source.BoundedFile, "write", lambda self, data: fetched.append(self.shown))
    monkeypatch.setattr(reading, "MODEL_FILE", reading.Kind("model file", 1000))
    line = _refused(url)
    assert (
        "more than such a file of a checkpoint holds (1,000)" in line and "refused before downloading" in line
    )
    assert fetched == [] and not list((private / "checkpoints").iterdir())


@pytest.mark.parametrize("off_by", [1, -1], ids=["cut-short", "grew"])
def test_an_object_that_differs_from_its_listing_is_refused(
    trained, store, private: Path, monkeypatch: pytest.MonkeyPatch, off_by: int
) -> None:
    """The listing says one size and another arrives (the object changed between the two, or the
    connection was cut): refused, and no copy is kept."""
    ckpt, _ = trained
    url = uploaded(store, ckpt, "changing")
    from extractive_qa.storage.buckets import BucketSource

    listed = BucketSource.listing

    def listing_of_another_size(self, progress):
        entries = listed(self, progress)
        return [source.Entry(e.name, e.size + off_by) if e.name == "hf/config.json" else e for e in entries]

    monkeypatch.setattr(BucketSource, "listing", listing_of_another_size)
    line = _refused(url)
    assert "hf/config.json" in line
    assert ("cut short" in line) if off_by > 0 else ("more bytes arrived" in line)
    assert not list((private / "checkpoints").iterdir())


def test_an_endpoint_that_is_down_is_answered_in_seconds(store, private: Path, monkeypatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens there once closed
    down = f"http://127.0.0.1:{port}"
    if store.kind == "azure":  # the endpoint is part of the connection string
        account = store.endpoint.rsplit("/", 1)[0]
        connection = store.env["AZURE_STORAGE_CONNECTION_STRING"].replace(account, down)
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL" if store.kind == "s3" else "STORAGE_EMULATOR_HOST", down)
    start = time.monotonic()
    line = _refused(store.url("anything"))
    assert time.monotonic() - start < 30 and "cannot read the bucket" in line and "endpoint" in line


def test_wrong_credentials_are_named(store, private: Path) -> None:
    if store.kind != "s3":
        pytest.skip("gcp-storage-emulator checks no credentials")
    with object_stores.refuse_unknown_keys(store):
        line = _refused(store.url("anything"))
    assert "credentials were refused" in line


def test_a_planted_pickle_in_a_bucket_runs_nothing(trained, store, private: Path, tmp_path: Path) -> None:
    """train.py --resume s3://… of a checkpoint whose trial_state.pkl would run a command: the
    download goes through the resume guard like a local directory, and nothing runs."""
    import pickle

    ckpt, _ = trained
    planted = tmp_path / "planted"
    shutil.copytree(ckpt, planted)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (planted / "trial_state.pkl").write_bytes(pickle.dumps(Payload()))
    url = uploaded(store, planted, "planted")
    code, _, err = run_train(
        ["--config", str(trained_config(ckpt)), "--checkpoint-dir", str(tmp_path / "out"), "--resume", url]
    )
    assert code == 2 and "trial_state.pkl" in err, err
    assert not marker.exists()


def test_a_cluster_restore_fetches_the_resume_files_alone_into_a_private_directory(
    trained, store, private: Path, tmp_path: Path
) -> None:
    """The master's latest checkpoint in a bucket (checkpoint_storage, as a cloud cluster gives
    it) is one source among the others: the files a resume reads, and nothing else, arrive in a
    private directory that is gone afterwards."""
    ckpt, _ = trained
    uploaded(store, ckpt, "latest")
    with store.environment():
        src = where.in_storage({"checkpoint_storage": store.storage()}, "latest")
        limits = {"metadata.json": 1 << 20, "trial_state.pkl": 1 << 20, "state_dict.pth": 1 << 30,
                  "no-such-file": 1}  # fmt: skip
        with private_copy.fetched(
            src, "DET_LATEST_CHECKPOINT", limits.__getitem__, limits.__contains__
        ) as local:
            fetched = sorted(p.name for p in local.rglob("*"))
            assert fetched == ["metadata.json", "state_dict.pth", "trial_state.pkl"]
            assert local.parent == private and local.stat().st_mode & 0o077 == 0
            assert (local / "state_dict.pth").read_bytes() == (ckpt / "state_dict.pth").read_bytes()
    assert not local.exists()
