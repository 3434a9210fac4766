"""Where SQuAD files come from: a local path or an official URL, downloaded once per machine
(under a file lock), checked against the official SHA-256 digest and written atomically; and the
error every data module raises for bad input."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

OFFICIAL_BASE_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
OFFICIAL_SHA256 = {
    "train-v1.1.json": "3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955",
    "dev-v1.1.json": "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9",
    "train-v2.0.json": "68dcfbb971bd3e96d5b46c7177b16c1a4e7d4bdef19fb204502738552dede002",
    "dev-v2.0.json": "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8",
}


class DataError(Exception):
    """Bad input: the message names the file / field and says what to do."""


# --------------------------------------------------------------------------------------------
# Sources: local path or URL (downloaded once per machine, verified, written atomically).
# --------------------------------------------------------------------------------------------


def default_download_dir() -> Path:
    return Path(os.environ.get("SQUAD_DOWNLOAD_DIR", Path.home() / ".cache" / "squad"))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_lock(path: Path) -> Any:
    # filelock comes with transformers (via huggingface_hub); one lock file per target, so the
    # ranks of a machine serialise on it and all but the first find the work already done.
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path) + ".lock")


def resolve_source(source: str | os.PathLike, download_dir: Path | None = None) -> Path:
    """Return a local path for `source`, downloading an http(s) URL once per machine."""
    text = str(source)
    if not text.startswith(("http://", "https://")):
        path = Path(text).expanduser()
        if not path.is_file():
            raise DataError(
                f"{path}: no such file. Give a SQuAD JSON path or one of the official URLs "
                f"({OFFICIAL_BASE_URL}train-v1.1.json, ...)."
            )
        return path
    name = text.rstrip("/").rsplit("/", 1)[-1]
    expected = OFFICIAL_SHA256.get(name)
    dest = (download_dir or default_download_dir()) / cache_name(text, name, expected)
    if expected is None and text.startswith("http://"):
        logging.getLogger("squad").warning(
            "%s: plain http with no pinned SHA-256: anyone on the network path can change what is "
            "trained on. Prefer https, or copy the file here and give its path.", text
        )
    with file_lock(dest):
        if dest.is_file() and (expected is None or sha256_file(dest) == expected):
            return dest
        try:
            _download(text, dest, expected)
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            raise DataError(
                f"could not download {text} ({err}). If this machine is offline, copy the file "
                f"to {dest} (sha256 {expected or 'not pinned'}) or point the config at a local path."
            ) from None
    return dest


def cache_name(url: str, name: str, expected_sha256: str | None) -> str:
    """The download's file name: the official files keep their own name (their content is pinned
    by SHA-256 whatever the URL); any other URL gets a key of the full URL, so two URLs that end
    in the same file name never share a download."""
    if expected_sha256 is not None:
        return name
    return f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}"


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _download(url: str, dest: Path, expected_sha256: str | None) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            for block in iter(lambda: response.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
        if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
            raise DataError(
                f"{url}: downloaded file has sha256 {digest.hexdigest()}, expected "
                f"{expected_sha256}; not using it. Retry, or copy a verified file to {dest}."
            )
        os.replace(tmp, dest)  # atomic: readers never see a partial file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
