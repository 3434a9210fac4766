"""Storage servers that misbehave, on loopback, for the tests of storage.source's bounds: one that
accepts a connection and never answers, and an HTTP server that speaks enough of S3's and GCS's
APIs to list and serve objects -- as told: a listing that never ends, sizes that are not numbers,
a listing that is not one, a download that trickles, bytes that do not match their checksum.

One idea: a store a test points the product at, which does one wrong thing on purpose.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.server
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """http://127.0.0.1:PORT of a socket that accepts every connection and never sends a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                held.append(conn)  # kept open, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()


@dataclasses.dataclass
class Behaviour:
    """What the fake store does: its objects (key -> bytes), and one wrong thing."""

    objects: dict[str, bytes] = dataclasses.field(default_factory=dict)
    listed_sizes: dict[str, str] = dataclasses.field(default_factory=dict)  # key -> the size listed
    endless_listing: bool = False
    gcs_listing_a_list: bool = False
    trickle_s: float = 0.0  # seconds between the bytes of a download
    wrong_checksum: bool = False
    extra_listing: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # listed, not held


def _s3_listing(b: Behaviour, prefix: str, token: str | None) -> bytes:
    entries = [(k, str(len(v))) for k, v in b.objects.items() if k.startswith(prefix)]
    entries = [(k, b.listed_sizes.get(k, size)) for k, size in entries]
    entries += [(k, str(size)) for k, size in b.extra_listing if k.startswith(prefix)]
    if b.endless_listing:
        following = f"t{int(token[1:]) + 1 if token else 1}"
        entries = []
        more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{following}</NextContinuationToken>"
    else:
        more = "<IsTruncated>false</IsTruncated>"
    contents = "".join(
        f"<Contents><Key>{k}</Key><Size>{size}</Size><ETag>&quot;e{i}&quot;</ETag>"
        "<LastModified>2026-01-01T00:00:00.000Z</LastModified></Contents>"
        for i, (k, size) in enumerate(entries)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>b</Name><Prefix>{prefix}</Prefix><KeyCount>{len(entries)}</KeyCount><MaxKeys>1000</MaxKeys>"
        f"{more}{contents}</ListBucketResult>"
    ).encode()


def _gcs_listing(b: Behaviour, bucket: str, prefix: str, token: str | None) -> bytes:
    if b.gcs_listing_a_list:
        return b"[]"
    if b.endless_listing:
        return json.dumps(
            {"kind": "storage#objects", "nextPageToken": f"t{int(token[1:]) + 1 if token else 1}"}
        ).encode()
    items = [
        {"kind": "storage#object", "name": k, "bucket": bucket, "size": b.listed_sizes.get(k, str(len(v))),
         "generation": "1"}
        for k, v in b.objects.items()
        if k.startswith(prefix)
    ]  # fmt: skip
    items += [{"kind": "storage#object", "name": k, "bucket": bucket, "size": str(s), "generation": "1"}
              for k, s in b.extra_listing if k.startswith(prefix)]  # fmt: skip
    return json.dumps({"kind": "storage#objects", "items": items}).encode()


def _handler(b: Behaviour) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def send(self, body: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if b.trickle_s and len(body) > 1000:
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(b.trickle_s)
            else:
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
            if parts[:3] == ["storage", "v1", "b"] and len(parts) == 4:  # GCS: the bucket's metadata
                self.send(
                    json.dumps({"kind": "storage#bucket", "name": parts[3]}).encode(), "application/json"
                )
            elif parts[:3] == ["storage", "v1", "b"] and len(parts) == 5 and parts[4] == "o":  # GCS listing
                self.send(
                    _gcs_listing(b, parts[3], query.get("prefix", ""), query.get("pageToken")),
                    "application/json",
                )
            elif parts[:4] == ["download", "storage", "v1", "b"] or (
                parts[:3] == ["storage", "v1", "b"] and "alt" in query
            ):
                key = parts[-1] if parts[0] != "download" else parts[6]
                data = b.objects[urllib.parse.unquote(key)]
                digest = base64.b64encode(b"\0\0\0\0" if b.wrong_checksum else _crc32c(data)).decode()
                self.send(data, "application/octet-stream", {"x-goog-hash": f"crc32c={digest}"})
            elif "list-type" in query:  # S3 ListObjectsV2, path style: /bucket?list-type=2&prefix=
                self.send(
                    _s3_listing(b, query.get("prefix", ""), query.get("continuation-token")),
                    "application/xml",
                )
            else:  # S3 GetObject: /bucket/key
                data = b.objects["/".join(parts[1:])]
                self.send(data, "application/octet-stream", {"ETag": '"e"'})

    return Handler


def _crc32c(data: bytes) -> bytes:
    import google_crc32c

    return google_crc32c.Checksum(data).digest()


@contextlib.contextmanager
def store(behaviour: Behaviour) -> Iterator[str]:
    """http://127.0.0.1:PORT of a fake S3 / GCS server doing what `behaviour` says."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(behaviour))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def answers_within(seconds: float, call: Callable[[], Any]) -> tuple[float, BaseException | None]:
    """(seconds taken, what `call` raised) -- or (inf, None) when it had not returned by then: a
    hang shows as a failed assertion, not as a test that never ends."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            call()
        except BaseException as err:  # noqa: BLE001 -- what the test asserts on
            outcome["error"] = err
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if "seconds" not in outcome:
        return float("inf"), None
    return outcome["seconds"], outcome.get("error")
