"""Every remote read has a deadline and a total (extractive_qa/storage/source.py), against
servers on loopback that misbehave on purpose (tests/support/hostile_store.py): one that accepts
and never answers, a listing that never ends, a download that trickles, a listing larger than any
checkpoint, sizes and listings that are not what the storage gives, an endpoint setting that is
not a URL. Each ends in one line naming the URL and the cause, and nothing is kept. The watch's
windows are shortened here (the shipped ones: 45 s for a listing, 20 s of stall)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from extractive_qa.errors import DataError
from extractive_qa.storage import private_copy, source, where
from tests.support import hostile_store
from tests.support.hostile_store import Behaviour

URL = {"s3": "s3://bucket/runs/0123", "gs": "gs://bucket/runs/0123"}
KEY = "runs/0123"


@pytest.fixture(autouse=True)
def short_watches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "LISTING", source.Watch("listing", 3.0, 3.0, 1))
    monkeypatch.setattr(source, "DOWNLOAD", source.Watch("download", None, 2.0, 64 << 10))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "test")


def point_at(scheme: str, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL" if scheme == "s3" else "STORAGE_EMULATOR_HOST", endpoint)


def fetch(scheme: str) -> Path:
    src = where.source_for(URL[scheme], "--checkpoint")
    return private_copy.cached(src, "--checkpoint", source.checkpoint_limit)


def refused_within(seconds: float, scheme: str) -> str:
    took, err = hostile_store.answers_within(seconds, lambda: fetch(scheme))
    assert took < seconds, f"no answer within {seconds} s"
    assert isinstance(err, DataError), repr(err)
    message = str(err)
    assert "\n" not in message and URL[scheme] in message, message
    return message


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_server_that_accepts_and_never_answers_is_given_up_on(scheme: str, monkeypatch, tmp_path) -> None:
    with hostile_store.silent_server() as endpoint:
        point_at(scheme, endpoint, monkeypatch)
        message = refused_within(15, scheme)
    assert "the listing did not finish within 3 s" in message or "moved less than" in message, message
    assert "is the endpoint up" in message
    assert not any(p.name.startswith(".") for p in (tmp_path / f"extractive-qa-{os.getuid()}").rglob("*"))


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_listing_that_never_ends_is_cut_off(scheme: str, monkeypatch) -> None:
    with hostile_store.store(Behaviour(endless_listing=True)) as endpoint:
        point_at(scheme, endpoint, monkeypatch)
        message = refused_within(15, scheme)
    assert f"went on past {source.MAX_PAGES} pages" in message or "did not finish" in message, message


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_download_that_trickles_is_stopped(scheme: str, monkeypatch, tmp_path) -> None:
    objects = {f"{KEY}/metadata.json": b"{}", f"{KEY}/state_dict.pth": b"x" * 200_000}
    with hostile_store.store(Behaviour(objects=objects, trickle_s=0.5)) as endpoint:
        point_at(scheme, endpoint, monkeypatch)
        message = refused_within(20, scheme)
    assert "the download moved less than 65,536 bytes in 2 s" in message, message
    root = tmp_path / f"extractive-qa-{os.getuid()}" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == []  # nothing kept, no staging left


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_listing_larger_than_any_checkpoint_is_refused_before_a_byte_is_fetched(
    scheme, monkeypatch
) -> None:
    # The total is the subject, not the deadline: the listing's pages get the time they need on
    # a loaded machine (3 s was too short for the first page's 1,000 keys with the suite beside it).
    monkeypatch.setattr(source, "LISTING", source.Watch("listing", 60.0, 60.0, 1))
    extra = [(f"{KEY}/hf/part-{i:05d}.safetensors", 200 << 20) for i in range(9_000)]
    behaviour = Behaviour(objects={f"{KEY}/metadata.json": b"{}"}, extra_listing=extra)
    with hostile_store.store(behaviour) as endpoint:
        point_at(scheme, endpoint, monkeypatch)
        message = refused_within(90, scheme)
    assert "9,001 objects of 1,887,436,800,002 bytes in all, more than a checkpoint" in message, message


def test_a_download_that_would_not_fit_the_disk_is_refused_before_it_starts(monkeypatch, tmp_path) -> None:
    objects = {f"{KEY}/metadata.json": b"{}", f"{KEY}/state_dict.pth": b"x" * 1000}
    monkeypatch.setattr(source, "DISK_MARGIN", 1 << 60)
    with hostile_store.store(Behaviour(objects=objects)) as endpoint:
        point_at("s3", endpoint, monkeypatch)
        message = refused_within(15, "s3")
    assert "the download needs" in message and "free space there or set TMPDIR" in message, message


@pytest.mark.parametrize("size", ["abc", "1.5e3"])
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_size_that_is_not_a_number_of_bytes_is_the_servers_fault(
    scheme: str, size: str, monkeypatch
) -> None:
    behaviour = Behaviour(
        objects={f"{KEY}/metadata.json": b"{}"}, listed_sizes={f"{KEY}/metadata.json": size}
    )
    with hostile_store.store(behaviour) as endpoint:
        point_at(scheme, endpoint, monkeypatch)
        message = refused_within(15, scheme)
    assert "bug" not in message and (
        "not a number of bytes" in message or "not one this storage gives" in message
    )


def test_a_gcs_listing_that_is_a_list_is_the_servers_fault(monkeypatch) -> None:
    with hostile_store.store(Behaviour(gcs_listing_a_list=True)) as endpoint:
        point_at("gs", endpoint, monkeypatch)
        message = refused_within(15, "gs")
    assert "the server's answer is not one this storage gives" in message, message


def test_a_gcs_checksum_mismatch_is_the_servers_fault(monkeypatch) -> None:
    objects = {f"{KEY}/metadata.json": b"{}", f"{KEY}/state_dict.pth": b"x" * 5000}
    with hostile_store.store(Behaviour(objects=objects, wrong_checksum=True)) as endpoint:
        point_at("gs", endpoint, monkeypatch)
        message = refused_within(15, "gs")
    assert "bug" not in message and ("checksum" in message.lower() or "other bytes" in message), message


@pytest.mark.parametrize("endpoint", ["junk", "http://", "http://[::1"])
def test_an_endpoint_setting_that_is_not_a_url_is_named(endpoint: str, monkeypatch) -> None:
    point_at("s3", endpoint, monkeypatch)
    with pytest.raises(DataError, match=r"AWS_ENDPOINT_URL '.*': not an http\(s\) URL with a host"):
        fetch("s3")
