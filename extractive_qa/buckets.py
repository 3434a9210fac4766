"""A checkpoint in S3 or GCS, where a cloud cluster's `checkpoint_storage` keeps it: where it is
(an s3:// or gs:// URL, or the storage config and a checkpoint's UUID), what the bucket's listing
says it holds, and a download bounded by that listing into this user's private directory.

Determined's own download (common/storage/s3.py:93-140, gcs.py:93-141) lists every key under the
prefix, writes each at os.path.join(dst, relpath(key, prefix)) -- a key with `..` parts lands
outside, a sibling prefix (UUID0 beside UUID) is swept in, no size is bounded -- and its caller
then hands the files to torch.load and pickle.load. Here, before a byte of content is fetched:
every key is checked (relative, no empty, `.` or `..` part, no name that is both a file and a
directory), every object's size against its kind's limit and the whole against the sum, from the
listing alone. Each object is then streamed into a new file (O_EXCL, no link followed) and refused
the moment it holds more bytes than listed, or when it ends with fewer. A download lands in a new
directory of private_dir.private_root() and is used only whole.

The clients are the SDKs' own (boto3, google-cloud-storage: both come with determined), with
their standard configuration: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ~/.aws, ...; Application
Default Credentials or STORAGE_EMULATOR_HOST. An endpoint that is down is answered in seconds (a
few quick retries), not after the SDKs' minutes of them.

One idea: a bucket's checkpoint read as its listing bounds it -- the listing's checks only mean
something for the download that obeys them, so the two stay in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from extractive_qa import reading
from extractive_qa.errors import DataError
from extractive_qa.private_dir import cached_download, private_root

SCHEMES = {"s3": "s3", "gs": "gcs"}  # URL scheme -> checkpoint_storage type
MAX_OBJECTS = 10_000  # a checkpoint holds tens of files (code/ included)
CHUNK = 1 << 20
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 120
ATTEMPTS = 3  # per request; a refused connection fails each at once
GCS_RETRY_S = 8.0
# The SDKs' names for refused credentials, and for an endpoint that could not be reached.
REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden", "Unauthorized",
           "NoCredentialsError", "DefaultCredentialsError", "403")  # fmt: skip
UNREACHED = ("EndpointConnectionError", "ConnectionError", "ConnectTimeoutError", "RetryError")

# A bucket name as S3 and GCS allow them (GCS's dotted names up to 222 characters).
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


@dataclasses.dataclass(frozen=True)
class Location:
    """A checkpoint directory in a bucket: every object whose key starts with `prefix` + '/'."""

    scheme: str  # "s3" or "gs"
    bucket: str
    prefix: str  # no leading or trailing slash
    endpoint_url: str | None = None  # S3 only; None: the SDK's own (AWS_ENDPOINT_URL, AWS)
    access_key: str | None = dataclasses.field(default=None, repr=False)
    secret_key: str | None = dataclasses.field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One object of a checkpoint's listing: its name under the prefix ('hf/config.json'; a
    directory marker ends in '/') and the size the bucket reports."""

    name: str
    size: int


def is_url(text: str | Path) -> bool:
    return isinstance(text, str) and text.split("://", 1)[0] in SCHEMES and "://" in text


def parse_url(text: str, what: str) -> Location:
    """s3://BUCKET/PREFIX or gs://BUCKET/PREFIX, the prefix naming one checkpoint directory."""
    scheme, _, rest = text.partition("://")
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if scheme not in SCHEMES or not BUCKET_NAME.fullmatch(bucket) or not prefix:
        raise DataError(
            f"{what} {text}: not a checkpoint URL; give {scheme or 's3'}://BUCKET/PREFIX/UUID, the "
            "bucket, the checkpoint_storage prefix and the checkpoint's UUID."
        )
    if bad := _bad_part(prefix):
        raise DataError(f"{what} {text}: the path has {bad}; give the checkpoint's own prefix.")
    return Location(scheme, bucket, prefix)


def from_storage(conf: dict[str, Any], storage_id: str) -> Location | None:
    """Where a cluster's checkpoint `storage_id` lies, for `checkpoint_storage` of type s3 or gcs
    (None for other types): the bucket, the config's prefix (normalised as Determined's
    storage.normalize_prefix does) and, for S3, the endpoint and keys the config gives."""
    kind = conf.get("type")
    if kind not in ("s3", "gcs"):
        return None
    prefix = os.path.normpath(str(conf.get("prefix") or "")).strip("/") if conf.get("prefix") else ""
    if _bad_part(storage_id) or "/" in storage_id:
        raise DataError(f"checkpoint {storage_id!r}: not a checkpoint id a master hands out.")
    return Location(
        scheme="s3" if kind == "s3" else "gs",
        bucket=str(conf.get("bucket")),
        prefix=f"{prefix}/{storage_id}" if prefix else storage_id,
        endpoint_url=conf.get("endpoint_url") if kind == "s3" else None,
        access_key=conf.get("access_key") if kind == "s3" else None,
        secret_key=conf.get("secret_key") if kind == "s3" else None,
    )


def _bad_part(name: str) -> str | None:
    """Why `name` (a key below the prefix, '/'-separated) could leave its directory, or None."""
    parts = name[:-1].split("/") if name.endswith("/") else name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' part"
    if any(c in name for c in "\0\\") or len(name) > 1024:
        return "a NUL or backslash, or more than 1024 characters"
    return None


# --------------------------------------------------------------------------------------------
# The two SDKs, behind one listing and one streamed read.
# --------------------------------------------------------------------------------------------


class _S3:
    def __init__(self, loc: Location) -> None:
        import boto3
        import botocore.config

        config = botocore.config.Config(
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            retries={"max_attempts": ATTEMPTS, "mode": "standard"},
        )
        self.loc = loc
        self.client = boto3.session.Session().client(
            "s3",
            endpoint_url=loc.endpoint_url,
            aws_access_key_id=loc.access_key,
            aws_secret_access_key=loc.secret_key,
            config=config,
        )

    def listing(self, prefix: str) -> Iterator[tuple[str, int]]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.loc.bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents") or []:
                yield obj["Key"], int(obj["Size"])

    def exists(self, key: str) -> bool:
        return any(k == key for k, _ in self.listing(key))

    def read_into(self, key: str, out: BoundedWriter) -> None:
        body = self.client.get_object(Bucket=self.loc.bucket, Key=key)["Body"]
        try:
            for chunk in body.iter_chunks(CHUNK):
                out.write(chunk)
        finally:
            body.close()


class _GCS:
    def __init__(self, loc: Location) -> None:
        with _google_quietly():
            from google.api_core import retry
            from google.cloud import storage

        self.loc = loc
        self.client = storage.Client()
        self.bucket = self.client.bucket(loc.bucket)
        self.retry = retry.Retry(initial=0.5, maximum=2.0, deadline=GCS_RETRY_S)

    def listing(self, prefix: str) -> Iterator[tuple[str, int]]:
        blobs = self.client.list_blobs(
            self.bucket, prefix=prefix, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S), retry=self.retry
        )
        for blob in blobs:
            yield blob.name, int(blob.size or 0)

    def exists(self, key: str) -> bool:
        return any(k == key for k, _ in self.listing(key))

    def read_into(self, key: str, out: BoundedWriter) -> None:
        self.bucket.blob(key).download_to_file(
            out, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S), retry=self.retry
        )


def _client(loc: Location) -> Any:
    return _S3(loc) if loc.scheme == "s3" else _GCS(loc)


def _sdk_errors(scheme: str) -> tuple[type[BaseException], ...]:
    """What a bucket's SDK raises when the bucket cannot be read: its reason is shown, in one line."""
    import requests

    if scheme == "s3":
        import botocore.exceptions

        return botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, requests.RequestException
    with _google_quietly():
        import google.api_core.exceptions
        import google.auth.exceptions

    return (
        google.api_core.exceptions.GoogleAPIError,
        google.auth.exceptions.GoogleAuthError,
        requests.RequestException,
    )


@contextlib.contextmanager
def _google_quietly() -> Iterator[None]:
    """google-api-core warns on import about Python versions it will stop supporting one day: a
    line on every command that is about neither the command nor the bucket."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _reason(err: BaseException) -> str:
    """The SDK's reason, with the fix for the usual ones."""
    text = " ".join(str(err).split())[:300]
    response = getattr(err, "response", None)
    code = (response.get("Error") or {}).get("Code") if isinstance(response, dict) else None
    code = code or type(err).__name__
    if code in ("NoSuchBucket", "NotFound"):
        return f"{text}; check the bucket's name"
    if code in REFUSED:
        return (
            f"{text}; the credentials were refused or are missing: set AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY (S3) or GOOGLE_APPLICATION_CREDENTIALS (GCS)"
        )
    if code in UNREACHED:
        return f"{text}; is the endpoint up (AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST)?"
    return text


@contextlib.contextmanager
def _sdk_errors_named(loc: Location, what: str) -> Iterator[None]:
    try:
        yield
    except DataError:
        raise
    except _sdk_errors(loc.scheme) as err:
        raise DataError(f"{what} {loc.url}: cannot read the bucket ({_reason(err)}).") from None


# --------------------------------------------------------------------------------------------
# The listing, checked before anything is fetched.
# --------------------------------------------------------------------------------------------


def checkpoint_limit(name: str) -> int:
    """The most bytes an object of a checkpoint may hold, by what it is: weights (state_dict.pth,
    safetensors, ONNX) as a model weights file, everything else as a model file."""
    if name == "state_dict.pth" or name.endswith((".safetensors", ".onnx")):
        return reading.WEIGHTS.bytes
    return reading.MODEL_FILE.bytes


def list_checkpoint(
    loc: Location,
    what: str,
    limit_of: Callable[[str], int] = checkpoint_limit,
    wanted: Callable[[str], bool] | None = None,
) -> list[Entry]:
    """The checkpoint's objects (those `wanted` picks), each name checked and each size within
    `limit_of(name)` as the listing reports it; a prefix holding nothing, or an object where the
    checkpoint directory should be, is refused with what was found."""
    with _sdk_errors_named(loc, what):
        client = _client(loc)
        found: list[Entry] = []
        for key, size in client.listing(loc.prefix + "/"):
            name = key[len(loc.prefix) + 1 :]
            if not name:
                continue  # the checkpoint directory's own marker (a console's "folder")
            if len(found) >= MAX_OBJECTS:
                raise DataError(f"{what} {loc.url}: more than {MAX_OBJECTS:,} objects; not a checkpoint.")
            if bad := _bad_part(name):
                raise DataError(f"{what} {loc.url}: the object {key!r} has {bad}; refusing the checkpoint.")
            if wanted is None or wanted(name):
                found.append(Entry(name, size))
        if not found and client.exists(loc.prefix):
            raise DataError(
                f"{what} {loc.url}: an object, not a checkpoint directory; give the prefix a "
                "checkpoint's files lie under (…/UUID)."
            )
    if not found:
        raise DataError(
            f"{what} {loc.url}: no checkpoint there (the prefix holds no objects). `det checkpoint "
            "list` or the bucket's listing shows the UUIDs; give …/PREFIX/UUID."
        )
    _check_entries(found, loc, what, limit_of)
    return found


def _check_entries(entries: list[Entry], loc: Location, what: str, limit_of: Callable[[str], int]) -> None:
    files = {e.name for e in entries if not e.name.endswith("/")}
    for entry in entries:
        parts = entry.name.rstrip("/").split("/")
        shown = f"{what} {loc.url}: {entry.name!r}"
        if any("/".join(parts[:i]) in files for i in range(1, len(parts))):
            raise DataError(f"{shown} lies under an object of the same name; refusing the checkpoint.")
        if entry.name.endswith("/"):
            if entry.size:
                raise DataError(f"{shown} is a directory marker holding bytes; refusing the checkpoint.")
            continue
        limit = limit_of(entry.name)
        if entry.size > limit:
            raise DataError(
                f"{what} {loc.url}/{entry.name}: {entry.size:,} bytes in the listing, more than such a "
                f"file of a checkpoint holds ({limit:,}); refused before downloading."
            )


# --------------------------------------------------------------------------------------------
# The download: into a new private directory, each object bounded by its listed size.
# --------------------------------------------------------------------------------------------


class BoundedWriter:
    """A file that takes at most `size` bytes: one more and the download stops there."""

    def __init__(self, file: BinaryIO, size: int, shown: str) -> None:
        self.file, self.size, self.shown, self.written = file, size, shown, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.size:
            raise DataError(
                f"{self.shown}: more bytes arrived than the listing's {self.size:,}; the object "
                "changed while it was downloaded. Run again."
            )
        return self.file.write(data)


def download(loc: Location, entries: list[Entry], target: Path, what: str) -> int:
    """Every listed object into `target` (a new, empty, private directory); the bytes fetched."""
    total = 0
    with _sdk_errors_named(loc, what):
        client = _client(loc)
        for entry in sorted(entries, key=lambda e: e.name):
            path = target.joinpath(*entry.name.rstrip("/").split("/"))
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if entry.name.endswith("/"):
                path.mkdir(mode=0o700, exist_ok=True)
                continue
            shown = f"{what} {loc.url}/{entry.name}"
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as file:
                out = BoundedWriter(file, entry.size, shown)
                client.read_into(f"{loc.prefix}/{entry.name}", out)
            if out.written != entry.size:
                raise DataError(
                    f"{shown}: {out.written:,} bytes arrived, the listing says {entry.size:,}; the "
                    "download was cut short or the object changed. Run again."
                )
            total += out.written
    return total


@contextlib.contextmanager
def downloaded(
    loc: Location, what: str, limit_of: Callable[[str], int], wanted: Callable[[str], bool]
) -> Iterator[Path]:
    """The objects `wanted` picks, in a new private directory that is removed afterwards."""
    entries = list_checkpoint(loc, what, limit_of, wanted)
    target = Path(tempfile.mkdtemp(prefix=".bucket-", dir=private_root()))
    try:
        download(loc, entries, target, what)
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)


def cached_checkpoint(url: str, what: str, part: str | None = None) -> Path:
    """The checkpoint at `url` in this user's private directory (private_dir.cached_download:
    fetched once, whole, reused by later calls), listed and checked before any object is fetched.
    `part` (a folder, "hf"): only that folder and metadata.json -- what serving reads, without the
    optimizer state that makes up most of a checkpoint; a whole copy downloaded before serves too."""
    loc = parse_url(url, what)
    digest = hashlib.sha256(loc.url.encode()).hexdigest()[:12]
    whole = f"{loc.scheme}-{digest}-{loc.prefix.rsplit('/', 1)[-1]}"

    def fetch(directory: Path) -> None:
        entries = list_checkpoint(loc, what)
        if "metadata.json" not in {e.name for e in entries}:
            raise DataError(
                f"{what} {url}: not a checkpoint (no metadata.json, which Determined writes into every "
                "checkpoint); give the prefix of one checkpoint, …/UUID."
            )
        if part is not None:
            entries = [e for e in entries if e.name == "metadata.json" or e.name.startswith(f"{part}/")]
            if len(entries) == 1:
                raise DataError(f"{what} {url}: the checkpoint holds no {part}/; give one train.py wrote.")
        download(loc, entries, directory, what)

    if part is None:
        return cached_download(whole, f"{what} {url}", fetch)
    return cached_download(f"{whole}-{part}", f"{what} {url}", fetch, reuse=(whole,))
