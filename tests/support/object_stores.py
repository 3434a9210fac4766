"""S3, GCS and Azure Blob on loopback, for tests: moto's S3 server, gcp-storage-emulator and Azurite
(npm's `azurite`, installed into .cache/azurite on first use when it is not on PATH), each
started on 127.0.0.1 on a free port and stopped afterwards, with one bucket, and what a test does
with it --
the checkpoint_storage block a cluster trial is given, the environment a local command reads (the
SDKs' standard variables), uploads through Determined's own storage manager (as a trial uploads
a checkpoint), and the listing. Nothing leaves loopback.

One idea: an object store a test can hand to the product exactly as a cloud gives it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("s3", "gcs")  # every test of buckets runs on these; Azure where a test asks for it
AZURITE = "azurite@3.35.0"
# Azurite's well-known development account (its documentation's, not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
PREFIX = "runs"  # checkpoint_storage.prefix, so that keys are PREFIX/UUID/...
KEY = "testing"  # moto accepts any key until its auth is switched on (refuse_unknown_keys)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ObjectStore:
    kind: str  # "s3", "gcs" or "azure"
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str
    env: dict[str, str] = field(default_factory=dict)  # what a local command or container reads
    prefix: str = PREFIX  # S3 and GCS; an Azure container has none (checkpoint_storage has no prefix)

    @property
    def scheme(self) -> str:
        return {"s3": "s3", "gcs": "gs", "azure": "azure"}[self.kind]

    def key(self, path: str) -> str:
        """The object key of `path` under this store's prefix."""
        return f"{self.prefix}/{path}" if self.prefix else path

    def url(self, uuid: str) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix + '/' if self.prefix else ''}{uuid}"

    def storage(self) -> dict[str, Any]:
        """The experiment's checkpoint_storage, as a cloud cluster's YAML gives it."""
        if self.kind == "s3":
            return {"type": "s3", "bucket": self.bucket, "prefix": self.prefix, "endpoint_url": self.endpoint,
                    "access_key": KEY, "secret_key": KEY}  # fmt: skip
        if self.kind == "azure":  # a container alone: Determined cannot list a path inside one
            assert not self.prefix, "checkpoint_storage of type azure has no prefix"
            return {"type": "azure", "container": self.bucket,
                    "connection_string": self.env["AZURE_STORAGE_CONNECTION_STRING"]}  # fmt: skip
        return {"type": "gcs", "bucket": self.bucket, "prefix": self.prefix}

    def manager(self) -> Any:
        """Determined's own storage manager for this bucket (what a trial uploads through)."""
        from determined.common import storage

        with self.environment():
            return storage.build(self.storage(), container_path=None)

    def upload(self, directory: Path, uuid: str) -> None:
        with self.environment():
            self.manager().upload(directory, uuid)

    def put(self, key: str, data: bytes) -> None:
        with self.environment():
            if self.kind == "s3":
                self._s3().put_object(Bucket=self.bucket, Key=key, Body=data)
            elif self.kind == "azure":
                self._azure().upload_blob(key, data, overwrite=True)
            else:
                self._gcs().bucket(self.bucket).blob(key).upload_from_string(data)

    def listing(self, prefix: str = "") -> dict[str, int]:
        """key -> size of every object under `prefix`."""
        with self.environment():
            if self.kind == "s3":
                lister = self._s3().get_paginator("list_objects_v2")
                pages = lister.paginate(Bucket=self.bucket, Prefix=prefix)
                return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents") or []}
            if self.kind == "azure":
                return {b.name: b.size for b in self._azure().list_blobs(name_starts_with=prefix)}
            return {b.name: b.size for b in self._gcs().list_blobs(self.bucket, prefix=prefix)}

    def delete(self, prefix: str) -> None:
        with self.environment():
            keys = list(self.listing(prefix))
            if self.kind == "s3":  # one client: making one costs a fifth of a second
                s3 = self._s3()
                for key in keys:
                    s3.delete_object(Bucket=self.bucket, Key=key)
            elif self.kind == "azure":
                container = self._azure()
                for key in keys:
                    container.delete_blob(key)
            else:
                bucket = self._gcs().bucket(self.bucket)
                for key in keys:
                    bucket.blob(key).delete()

    def _s3(self) -> Any:
        import boto3

        return boto3.session.Session().client("s3", endpoint_url=self.endpoint)

    def _azure(self) -> Any:
        from azure.storage import blob

        client = blob.BlobServiceClient.from_connection_string(self.env["AZURE_STORAGE_CONNECTION_STRING"])
        return client.get_container_client(self.bucket)

    def _gcs(self) -> Any:
        from google.cloud import storage

        return storage.Client()

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        before = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@contextlib.contextmanager
def s3_store(bucket: str = "checkpoints") -> Iterator[ObjectStore]:
    import requests
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    store = ObjectStore("s3", f"http://127.0.0.1:{port}", bucket, env)
    try:
        # moto keeps its buckets in this process, not in the server: an earlier store's objects
        # would still be there. Each store starts empty.
        requests.post(f"{store.endpoint}/moto-api/reset", timeout=10).raise_for_status()
        with store.environment():
            store._s3().create_bucket(Bucket=bucket)
        yield store
    finally:
        server.stop()


@contextlib.contextmanager
def gcs_store(bucket: str = "checkpoints") -> Iterator[ObjectStore]:
    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GOOGLE_CLOUD_PROJECT": "test"}
    try:
        yield ObjectStore("gcs", f"http://127.0.0.1:{port}", bucket, env)
    finally:
        server.stop()


def azurite_binary() -> Path | None:
    """azurite-blob: on PATH, or installed from npm into .cache/azurite (once); None without npm."""
    import shutil
    import subprocess

    from tests.support.project import ROOT

    found = shutil.which("azurite-blob")
    if found:
        return Path(found)
    local = ROOT / ".cache" / "azurite"
    binary = local / "node_modules" / ".bin" / "azurite-blob"
    if not binary.exists() and shutil.which("npm"):
        local.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(local), "--no-audit", "--no-fund", "--silent", AZURITE],
            capture_output=True, timeout=300, check=False,
        )  # fmt: skip
    return binary if binary.exists() else None


@contextlib.contextmanager
def azure_store(bucket: str = "checkpoints") -> Iterator[ObjectStore]:
    """Azurite's blob service in memory, with one container."""
    import shutil
    import subprocess
    import tempfile
    import time

    import pytest

    binary = azurite_binary()
    if binary is None:
        pytest.skip(f"Azure on loopback needs Azurite: npm install {AZURITE} (node and npm)")
    port, workspace = free_port(), tempfile.mkdtemp(prefix="azurite-")
    process = subprocess.Popen(  # in memory: nothing on disk; its cwd holds any file it writes anyway
        [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence", "--silent",
         "--skipApiVersionCheck", "--disableTelemetry"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workspace,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    connection = (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                  f"BlobEndpoint={endpoint};")  # fmt: skip
    store = ObjectStore("azure", endpoint, bucket, {"AZURE_STORAGE_CONNECTION_STRING": connection}, prefix="")
    try:
        for _ in range(100):  # it listens within a second or two
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"Azurite ({binary}) did not listen on port {port} within 10 s")
        from azure.storage import blob

        blob.BlobServiceClient.from_connection_string(connection).create_container(bucket)
        yield store
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(workspace, ignore_errors=True)


def object_store(kind: str, bucket: str = "checkpoints") -> Any:
    return {"s3": s3_store, "gcs": gcs_store, "azure": azure_store}[kind](bucket)


@contextlib.contextmanager
def refuse_unknown_keys(store: ObjectStore) -> Iterator[None]:
    """moto checks credentials from here on (its IAM knows no key, so every key is refused)."""
    import requests

    requests.post(f"{store.endpoint}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
    try:
        yield
    finally:
        requests.post(f"{store.endpoint}/moto-api/reset-auth", data=b"inf", timeout=10).raise_for_status()
