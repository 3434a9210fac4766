"""A checkpoint in an S3, GCS or Azure bucket, where a cloud cluster's `checkpoint_storage` keeps
it: its place (an s3://, gs:// or azure:// URL, or the storage config and a checkpoint's UUID) and
one client per storage behind the same three calls -- a listing page by page, a streamed read
into a bounded file, the version tag of an object -- so that `BucketSource` is one source for all
of them.

Determined's own download (common/storage/s3.py:93-140, gcs.py:93-141, azure.py:62-80) lists
every key under the prefix, writes each at os.path.join(dst, relpath(key, prefix)) -- a key with
`..` parts lands outside, a sibling prefix (UUID0 beside UUID) is swept in, no size is bounded --
and its caller then hands the files to torch.load and pickle.load. Here the listing is checked
and bounded before a byte of content is fetched (storage.source), and each object is streamed
into a new file bounded by its listed size.

The clients are the SDKs' own (boto3, google-cloud-storage, azure-storage-blob: all come with
determined), with their standard configuration: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ~/.aws, ...;
Application Default Credentials or STORAGE_EMULATOR_HOST; AZURE_STORAGE_CONNECTION_STRING. Every
request has a connect and a read timeout and few retries; storage.source bounds the whole. What an
SDK, an endpoint setting or a server's answer gets wrong is one line naming the setting or the
server (`sdk_errors_named`), not this project's bug.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import urllib.parse
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from extractive_qa.errors import DataError
from extractive_qa.storage import source
from extractive_qa.storage.source import BoundedFile, Entry, Progress

SCHEMES = {"s3": "s3", "gs": "gcs", "azure": "azure"}  # URL scheme -> checkpoint_storage type
CHUNK = 64 << 10  # a streamed read's piece: small enough that a slow link still shows progress
ATTEMPTS = 3  # per request; a refused connection fails each at once
GCS_RETRY_S = 8.0  # google-api-core retries a request for this long
# The SDKs' names for refused credentials, and for an endpoint that could not be reached.
REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden", "Unauthorized",
           "NoCredentialsError", "DefaultCredentialsError", "AuthenticationFailed", "403")  # fmt: skip
UNREACHED = ("EndpointConnectionError", "ConnectionError", "ConnectTimeoutError", "RetryError",
             "ServiceRequestError", "ServiceResponseError")  # fmt: skip
# A bucket or container name as S3, GCS and Azure allow them (GCS's dotted names up to 222).
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
ADVICE = {
    "s3": "is the endpoint up and is it S3 (AWS_ENDPOINT_URL, checkpoint_storage.endpoint_url)?",
    "gs": "is the endpoint up and is it GCS (STORAGE_EMULATOR_HOST)?",
    "azure": "is the account's endpoint up "
    "(AZURE_STORAGE_CONNECTION_STRING, checkpoint_storage.connection_string)?",
}


@dataclasses.dataclass(frozen=True)
class Location:
    """A checkpoint directory in a bucket: every object whose key starts with `prefix` + '/'."""

    scheme: str  # "s3", "gs" or "azure"
    bucket: str  # Azure: the container
    prefix: str  # no leading or trailing slash
    endpoint_url: str | None = None  # S3: None is the SDK's own (AWS_ENDPOINT_URL, AWS)
    access_key: str | None = dataclasses.field(default=None, repr=False)
    secret_key: str | None = dataclasses.field(default=None, repr=False)
    # Azure: the config's connection string, or an account URL and its credential
    connection_string: str | None = dataclasses.field(default=None, repr=False)
    account_url: str | None = None
    credential: str | None = dataclasses.field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"

    def endpoint(self) -> str:
        """Where the objects are served from (what a cached copy is keyed by beside the URL)."""
        if self.scheme == "s3":
            return (
                self.endpoint_url
                or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL", "aws")
            )
        if self.scheme == "gs":
            return os.environ.get("STORAGE_EMULATOR_HOST", "gcs")
        text = self.connection_string or os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
        parts = dict(p.split("=", 1) for p in text.split(";") if "=" in p)
        return self.account_url or parts.get("BlobEndpoint") or parts.get("AccountName", "azure")


def is_url(text: str | Path) -> bool:
    return isinstance(text, str) and "://" in text and text.split("://", 1)[0] in SCHEMES


def parse_url(text: str, what: str) -> Location:
    """s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or azure://CONTAINER/PREFIX, the prefix naming one
    checkpoint directory."""
    scheme, _, rest = text.partition("://")
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if scheme not in SCHEMES or not BUCKET_NAME.fullmatch(bucket) or not prefix:
        raise DataError(
            f"{what} {text}: not a checkpoint URL; give {scheme or 's3'}://BUCKET/PREFIX/UUID, the "
            "bucket, the checkpoint_storage prefix and the checkpoint's UUID."
        )
    if bad := source.bad_name(prefix):
        raise DataError(f"{what} {text}: the path has {bad}; give the checkpoint's own prefix.")
    return Location(scheme, bucket, prefix)


def from_storage(conf: dict[str, Any], storage_id: str) -> Location:
    """Where a cluster's checkpoint `storage_id` lies, for `checkpoint_storage` of type s3, gcs or
    azure: the bucket, the config's prefix (normalised as Determined's storage.normalize_prefix
    does; an Azure container's path, which config.schema refuses for a run, is read as a prefix)
    and the endpoint and credentials the config gives."""
    kind = conf.get("type")
    if source.bad_name(storage_id) or "/" in storage_id:
        raise DataError(f"checkpoint {storage_id!r}: not a checkpoint id a master hands out.")
    if kind == "azure":
        container, _, path = str(conf.get("container") or "").strip("/").partition("/")
        prefix = f"{path}/{storage_id}" if path else storage_id
        return Location(
            "azure", container, prefix, connection_string=conf.get("connection_string"),
            account_url=conf.get("account_url"), credential=conf.get("credential"),
        )  # fmt: skip
    prefix = os.path.normpath(str(conf.get("prefix") or "")).strip("/") if conf.get("prefix") else ""
    return Location(
        scheme="s3" if kind == "s3" else "gs",
        bucket=str(conf.get("bucket")),
        prefix=f"{prefix}/{storage_id}" if prefix else storage_id,
        endpoint_url=conf.get("endpoint_url") if kind == "s3" else None,
        access_key=conf.get("access_key") if kind == "s3" else None,
        secret_key=conf.get("secret_key") if kind == "s3" else None,
    )


# --------------------------------------------------------------------------------------------
# The three SDKs, behind one listing and one streamed read.
# --------------------------------------------------------------------------------------------


def _checked_endpoint(value: str | None, setting: str) -> str | None:
    """An endpoint setting an SDK is given: an http(s) URL with a host, or one line saying so."""
    if value is None:
        return None
    try:
        parts = urllib.parse.urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise DataError(
            f"{setting} {value!r}: not an http(s) URL with a host; set it to the storage's endpoint, "
            "e.g. https://s3.amazonaws.com or http://127.0.0.1:9000."
        )
    return value


class S3:
    def __init__(self, loc: Location) -> None:
        import boto3
        import botocore.config

        env = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
        _checked_endpoint(os.environ.get(env), env)
        endpoint = _checked_endpoint(loc.endpoint_url, "checkpoint_storage.endpoint_url")
        config = botocore.config.Config(
            connect_timeout=source.CONNECT_TIMEOUT_S,
            read_timeout=source.READ_TIMEOUT_S,
            retries={"max_attempts": ATTEMPTS, "mode": "standard"},
        )
        self.loc = loc
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, aws_access_key_id=loc.access_key,
            aws_secret_access_key=loc.secret_key, config=config,
        )  # fmt: skip

    def listing(self, prefix: str, progress: Progress) -> Iterator[tuple[str, Any, str]]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.loc.bucket, Prefix=prefix)
        for page in source.pages_of(iter(pages), progress, self.loc.url):
            for obj in page.get("Contents") or []:
                yield obj["Key"], obj.get("Size"), str(obj.get("ETag", ""))

    def read_into(self, key: str, out: BoundedFile) -> None:
        body = self.client.get_object(Bucket=self.loc.bucket, Key=key)["Body"]
        try:
            for chunk in body.iter_chunks(CHUNK):
                out.write(chunk)
        finally:
            body.close()


class GCS:
    def __init__(self, loc: Location) -> None:
        with google_quietly():
            from google.api_core import retry
            from google.cloud import storage

        host = os.environ.get("STORAGE_EMULATOR_HOST")
        _checked_endpoint(host, "STORAGE_EMULATOR_HOST")
        self.loc = loc
        self.client = storage.Client()
        self.bucket = self.client.bucket(loc.bucket)
        self.retry = retry.Retry(initial=0.5, maximum=2.0, deadline=GCS_RETRY_S)
        self.timeout = (source.CONNECT_TIMEOUT_S, source.READ_TIMEOUT_S)

    def listing(self, prefix: str, progress: Progress) -> Iterator[tuple[str, Any, str]]:
        blobs = self.client.list_blobs(self.bucket, prefix=prefix, timeout=self.timeout, retry=self.retry)
        for page in source.pages_of(iter(blobs.pages), progress, self.loc.url):
            for blob in page:
                yield blob.name, blob.size, str(blob.generation or "")

    def read_into(self, key: str, out: BoundedFile) -> None:
        self.bucket.blob(key).download_to_file(out, timeout=self.timeout, retry=self.retry)


class Azure:
    def __init__(self, loc: Location) -> None:
        from azure.storage import blob
        from azure.storage.blob import ExponentialRetry

        text = loc.connection_string or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        timeouts = {"connection_timeout": source.CONNECT_TIMEOUT_S, "read_timeout": source.READ_TIMEOUT_S}
        sizes = {"max_single_get_size": CHUNK * 4, "max_chunk_get_size": CHUNK * 4}
        # The SDK's own policy waits 15 s before its first retry and longer after; these waits are
        # 1, 3 and 5 s, so an account that is down is named in seconds.
        retries = {"retry_policy": ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=ATTEMPTS,
                                                    random_jitter_range=0)}  # fmt: skip
        timeouts |= retries
        self.loc = loc
        if text:
            self.client = blob.BlobServiceClient.from_connection_string(text, **timeouts, **sizes)
        elif loc.account_url:
            url = _checked_endpoint(loc.account_url, "checkpoint_storage.account_url")
            self.client = blob.BlobServiceClient(url, loc.credential, **timeouts, **sizes)
        else:
            raise DataError(
                f"{loc.url}: no Azure account to read it from; set AZURE_STORAGE_CONNECTION_STRING (or "
                "checkpoint_storage.connection_string / account_url)."
            )
        self.container = self.client.get_container_client(loc.bucket)

    def listing(self, prefix: str, progress: Progress) -> Iterator[tuple[str, Any, str]]:
        pages = self.container.list_blobs(name_starts_with=prefix, results_per_page=1000).by_page()
        for page in source.pages_of(iter(pages), progress, self.loc.url):
            for item in page:
                yield item.name, item.size, str(item.etag or "")

    def read_into(self, key: str, out: BoundedFile) -> None:
        for chunk in self.container.download_blob(key).chunks():
            out.write(chunk)


def client_for(loc: Location) -> S3 | GCS | Azure:
    with sdk_errors_named(loc):
        return {"s3": S3, "gs": GCS, "azure": Azure}[loc.scheme](loc)


def sdk_errors(scheme: str) -> tuple[type[BaseException], ...]:
    """What a bucket's SDK raises when the bucket cannot be read, its endpoint setting is not one,
    or the server's answer is not a listing: its reason is shown, in one line."""
    import requests

    malformed: tuple[type[BaseException], ...] = (ValueError, TypeError, KeyError, AttributeError)
    if scheme == "s3":
        import botocore.exceptions

        return (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError,
                requests.RequestException, *malformed)  # fmt: skip
    if scheme == "azure":
        import azure.core.exceptions

        return azure.core.exceptions.AzureError, requests.RequestException, *malformed
    with google_quietly():
        import google.api_core.exceptions
        import google.auth.exceptions
        from google.resumable_media import common as resumable

    return (
        google.api_core.exceptions.GoogleAPIError,
        google.auth.exceptions.GoogleAuthError,
        resumable.DataCorruption,  # the download's checksum: the server sent other bytes
        resumable.InvalidResponse,
        requests.RequestException,
        *malformed,
    )


@contextlib.contextmanager
def google_quietly() -> Iterator[None]:
    """google-api-core warns on import about Python versions it will stop supporting one day: a
    line on every command that is about neither the command nor the bucket."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def reason(err: BaseException, scheme: str) -> str:
    """The SDK's reason, with the fix for the usual ones."""
    text = " ".join(str(err).split())[:300] or type(err).__name__
    response = getattr(err, "response", None)
    code = (response.get("Error") or {}).get("Code") if isinstance(response, dict) else None
    code = code or getattr(err, "error_code", None) or type(err).__name__
    if code in ("NoSuchBucket", "NotFound", "ContainerNotFound", "ResourceNotFoundError"):
        return f"{text}; check the bucket's name"
    if code in REFUSED or str(code).endswith("AuthenticationError"):
        return (
            f"{text}; the credentials were refused or are missing: set AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY (S3), GOOGLE_APPLICATION_CREDENTIALS (GCS) or "
            "AZURE_STORAGE_CONNECTION_STRING (Azure)"
        )
    if code in UNREACHED:
        return f"{text}; {ADVICE[scheme]}"
    if code == "DataCorruption":
        return f"{text}; the server sent other bytes than it lists. Run again"
    if isinstance(err, (ValueError, TypeError, KeyError, AttributeError)):
        answer = f"{type(err).__name__}: {text}"
        return f"the server's answer is not one this storage gives ({answer}); {ADVICE[scheme]}"
    return text


@contextlib.contextmanager
def sdk_errors_named(loc: Location) -> Iterator[None]:
    try:
        yield
    except DataError:
        raise
    except sdk_errors(loc.scheme) as err:
        raise DataError(f"{loc.url}: cannot read the bucket ({reason(err, loc.scheme)}).") from None


# --------------------------------------------------------------------------------------------
# The bucket as a checkpoint source.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BucketSource:
    """A checkpoint in a bucket (storage.source.CheckpointSource)."""

    loc: Location

    @property
    def url(self) -> str:
        return self.loc.url

    @property
    def key(self) -> str:
        return f"{self.loc.endpoint()} {self.loc.url}"

    @property
    def in_place(self) -> Path | None:
        return None

    @property
    def partial(self) -> bool:
        return True

    @property
    def advice(self) -> str:
        return ADVICE[self.loc.scheme]

    def listing(self, progress: Progress) -> list[Entry]:
        with sdk_errors_named(self.loc):
            client = client_for(self.loc)
            found: list[Entry] = []
            for key, size, version in client.listing(self.loc.prefix + "/", progress):
                name = key[len(self.loc.prefix) + 1 :] if key.startswith(self.loc.prefix + "/") else None
                if name is None:
                    raise DataError(f"{self.url}: the listing holds {key!r}, outside the prefix asked for.")
                if not name:
                    continue  # the checkpoint directory's own marker (a console's "folder")
                if len(found) >= source.MAX_OBJECTS:
                    raise DataError(
                        f"{self.url}: more than {source.MAX_OBJECTS:,} objects; not a checkpoint."
                    )
                found.append(Entry(name, source.listed_size(size, name, self.url), version))
            if not found and any(
                k == self.loc.prefix for k, _, _ in client.listing(self.loc.prefix, progress)
            ):
                raise DataError(
                    f"{self.url}: an object, not a checkpoint directory; give the prefix a checkpoint's "
                    "files lie under (…/UUID)."
                )
        return found

    def fetch(self, entries: Sequence[Entry], target: Path, progress: Progress) -> None:
        with sdk_errors_named(self.loc):
            client = client_for(self.loc)
            source.write_entries(
                entries, target, self.url, progress,
                lambda entry, out: client.read_into(f"{self.loc.prefix}/{entry.name}", out),
            )  # fmt: skip
