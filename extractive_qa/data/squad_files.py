"""SQuAD files -> checked examples: where a file comes from (a local path, or an official URL
downloaded once per machine, checked against its SHA-256 digest and written atomically) and
what it holds (v1.1 or v2.0 JSON, every answer checked against its context)."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extractive_qa.data import squad_formats
from extractive_qa.errors import ConfigError, DataError
from extractive_qa.io import reading
from extractive_qa.io.files import file_lock, shared_mode

# --------------------------------------------------------------------------------------------
# Checking every question, whatever container it came in (squad_formats reads them).
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Example:
    id: str
    question: str
    context: str
    answers: list[dict[str, Any]]  # [{"text": str, "answer_start": int}], may be empty (v2.0)
    is_impossible: bool = False
    title: str = ""


@dataclass
class SquadSet:
    path: Path
    version: str  # "1.1" or "2.0"
    examples: list[Example]
    sha256: str  # identifies these examples: the file's digest, or a subset's own (first_examples)
    skipped: list[str] = field(default_factory=list)  # training ids whose answer is not found
    file_sha256: str = ""  # the whole file's digest (= sha256 unless this is a subset)
    first: int | None = None  # a subset: the file's first `first` questions
    # Every question whose first answer is not where its answer_start says, by place and field
    # (training skips them; evaluation keeps them, as the official scripts do).
    misplaced: list[str] = field(default_factory=list)
    declared: bool = False  # the file states its version (SQuAD's nested JSON); flat records do not

    def misplaced_note(self, shown: int = 3) -> str:
        """One line naming the misplaced answers (the first `shown`), or "" when there are none."""
        if not self.misplaced:
            return ""
        more = f" (and {len(self.misplaced) - shown} more)" if len(self.misplaced) > shown else ""
        return (f"{len(self.misplaced)} question(s) whose first answer is not at its answer_start -- "
                f"training skips them: {'; '.join(self.misplaced[:shown])}{more}")  # fmt: skip

    def __post_init__(self) -> None:
        self.file_sha256 = self.file_sha256 or self.sha256


def load_squad(source: str | os.PathLike, *, training: bool, download_dir: Path | None = None) -> SquadSet:
    """Parse and validate a SQuAD v1.1 / v2.0 file: SQuAD's nested JSON, or the flat `squad`
    schema (JSON Lines, a JSON array, Parquet, or `datasets:NAME_OR_DIR:SPLIT`), told apart by
    the file's content (squad_formats).

    Training drops (and reports) questions whose first answer is not where `answer_start` says;
    evaluation keeps every question, as the official scripts do.
    """
    if not str(source).startswith(squad_formats.DATASETS_PREFIX):
        path, pinned = resolve_source(source, download_dir), _pinned_sha256(source)
        raw = reading.read_bytes(path, reading.DATA)
        digest = hashlib.sha256(raw).hexdigest()
        if pinned is not None and digest != pinned:
            # The digest is checked on the bytes parsed here, not only on the file before reading.
            raise DataError(f"{path}: its contents are not the official {source} (SHA-256 differs); "
                            "delete it to download it again.")  # fmt: skip
        questions = squad_formats.read_questions(path, raw)
    else:
        path = Path(str(source))
        questions, digest = squad_formats.datasets_questions(str(source))
    return _checked(path, questions, digest, training)


def _checked(path: Path, questions: squad_formats.Questions, digest: str, training: bool) -> SquadSet:
    """The checks every format shares: ids present and unique, contexts and questions non-empty,
    answers inside their context; v2.0 where a question can have no answer."""
    examples: list[Example] = []
    skipped: list[str] = []
    misplaced: list[str] = []
    seen: set[str] = set()
    flat = questions.flat
    has_impossible = flat  # flat records mark an unanswerable question by empty answers
    for where, title, context, qa in questions.items:
        if not isinstance(context, str) or not context.strip():
            raise DataError(f"{where}: missing or empty 'context'.")
        if len(context) > MAX_CONTEXT_CHARS:
            raise DataError(
                f"{where}: 'context' is {len(context):,} characters; the limit is {MAX_CONTEXT_CHARS:,} "
                "(SQuAD's longest is about 25,000). Split it into paragraphs of their own."
            )
        qid = qa.get("id") if isinstance(qa, dict) else None
        squad_formats.check_id(qid, where)
        if qid in seen:
            raise DataError(f"{where} question id {qid}: duplicate question id; ids must be unique.")
        seen.add(qid)
        has_impossible |= "is_impossible" in qa
        example = _question(qa, context, f"{where} question id {qid}", has_impossible)
        example.title = title
        if not example.is_impossible and (found := _misplaced(example)) is not None:
            misplaced.append(f"{where} question id {qid}: answers[0].answer_start {found}")
            if training:
                skipped.append(qid)
                continue
        examples.append(example)
    if not examples:
        raise DataError(f"{path}: no questions found.")
    v2 = any(ex.is_impossible for ex in examples) if flat else has_impossible or questions.declared_v2
    return SquadSet(
        path, "2.0" if v2 else "1.1", examples, digest, skipped, misplaced=misplaced, declared=not flat
    )


def check_version(squad: SquadSet, squad_version: str, setting: str) -> None:
    """data.squad_version against what a file is: a v2.0 file (it holds unanswerable questions,
    or says v2) trained or scored as v1.1, or a file that says it is v1.1 as v2.0, is refused --
    the dry run and the run alike -- naming the file and the setting to change."""
    if squad.version == "2.0" and squad_version != "2.0":
        raise ConfigError(
            f"{setting} ({squad.path}) is SQuAD v2.0 but data.squad_version is {squad_version}; "
            "set data.squad_version: 2.0."
        )
    if squad.declared and squad.version == "1.1" and squad_version == "2.0":
        raise ConfigError(
            f"{setting} ({squad.path}) is SQuAD v1.1 (it says so, and no question in it can be "
            'unanswerable) but data.squad_version is 2.0; set data.squad_version: "1.1", or give '
            "v2.0 files."
        )


def first_examples(squad: SquadSet, limit: int | None) -> SquadSet:
    """The first `limit` questions (data.max_train_examples / max_eval_examples), with a digest
    of their own so that a subset never shares a feature cache with the whole file."""
    if limit is None or limit >= len(squad.examples):
        return squad
    digest = hashlib.sha256(f"{squad.sha256}:first:{limit}".encode()).hexdigest()
    examples = squad.examples[:limit]
    return SquadSet(
        squad.path,
        squad.version,
        examples,
        digest,
        squad.skipped,
        squad.sha256,
        limit,
        squad.misplaced,
        squad.declared,
    )


# Windows per context grow with its length (and tokenizing it holds every offset): a 100 MB
# context would take gigabytes before the first window. 40x SQuAD's longest paragraph.
MAX_CONTEXT_CHARS = 1_000_000


def _question(qa: dict[str, Any], context: str, place: str, v2_file: bool) -> Example:
    """One checked question. No answers is allowed only where the file is v2.0 (`v2_file`)."""
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{place}: missing or empty 'question'.")
    if len(question) > MAX_CONTEXT_CHARS:
        limit = f"the limit is {MAX_CONTEXT_CHARS:,}"
        raise DataError(f"{place}: 'question' is {len(question):,} characters; {limit}.")
    impossible = bool(qa.get("is_impossible", False))
    answers = qa.get("answers")
    if not isinstance(answers, list):
        raise DataError(f"{place}: missing 'answers' list.")
    for ans in answers:
        if not isinstance(ans, dict) or not isinstance(ans.get("text"), str):
            raise DataError(f"{place}: each answer needs 'text' and 'answer_start'.")
        start = ans.get("answer_start")
        if not isinstance(start, int) or isinstance(start, bool):
            what = "a whole number (a character offset)"
            raise DataError(f"{place}: answer_start must be {what}, not {start!r}.")
        if not 0 <= start < len(context):
            raise DataError(
                f"{place}: answer_start {start!r} is outside the context (length {len(context)})."
            )
    if impossible and answers:  # the official v2.0 files give unanswerable questions no answers
        raise DataError(
            f"{place}: is_impossible is true but it has {len(answers)} answer(s); one of the two is "
            "wrong (SQuAD v2.0 keeps an unanswerable question's guesses in plausible_answers)."
        )
    if not impossible and not answers and not v2_file:
        raise DataError(f"{place}: no answers and not marked is_impossible (v1.1 needs answers).")
    return Example(qa["id"], question, context, answers, impossible or not answers)


def _misplaced(example: Example) -> str | None:
    """What the first answer's answer_start points at, where that is not its text; else None."""
    first = example.answers[0]
    start, text = first["answer_start"], first["text"]
    there = example.context[start : start + len(text)]
    return None if there == text else f"{start} points at {there[:40]!r}, not {text[:40]!r}"


# --------------------------------------------------------------------------------------------
# Sources: local path or URL (downloaded once per machine, verified, written atomically).
# --------------------------------------------------------------------------------------------

OFFICIAL_BASE_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
OFFICIAL_SHA256 = {
    "train-v1.1.json": "3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955",
    "dev-v1.1.json": "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9",
    "train-v2.0.json": "68dcfbb971bd3e96d5b46c7177b16c1a4e7d4bdef19fb204502738552dede002",
    "dev-v2.0.json": "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8",
}


def default_download_dir() -> Path:
    return Path(os.environ.get("SQUAD_DOWNLOAD_DIR", Path.home() / ".cache" / "squad"))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with reading.open_regular(path, reading.DATA) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cached(url: str, dest: Path, expected: str | None) -> Path:
    """An earlier download of `url`. An unpinned URL is not fetched again (its content may have
    changed since): say which copy is used and how to refresh it."""
    if expected is None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(dest.stat().st_mtime))
        logging.getLogger("squad").info(
            "%s: using the copy downloaded %s (%s); delete it to download it again", url, when, dest
        )
    return dest


def _pinned_sha256(source: str | os.PathLike) -> str | None:
    text = str(source)
    if not text.startswith(("http://", "https://")):
        return None
    return OFFICIAL_SHA256.get(text.rstrip("/").rsplit("/", 1)[-1])


def resolve_source(source: str | os.PathLike, download_dir: Path | None = None) -> Path:
    """Return a local path for `source`, downloading an http(s) URL once per machine."""
    text = str(source)
    if not text.startswith(("http://", "https://")):
        path = Path(text).expanduser()
        if not path.is_file():
            raise DataError(
                f"{reading.not_a_file(path)} Give a SQuAD JSON, JSON Lines or Parquet path, "
                "datasets:NAME_OR_DIR:SPLIT, or one of the official URLs "
                f"({OFFICIAL_BASE_URL}train-v1.1.json, ...)."
            )
        return path
    name = text.rstrip("/").rsplit("/", 1)[-1]
    expected = OFFICIAL_SHA256.get(name)
    dest = (download_dir or default_download_dir()) / cache_name(text, name, expected)
    if expected is None and text.startswith("http://"):
        logging.getLogger("squad").warning(
            "%s: plain http with no pinned SHA-256: anyone on the network path can change what is "
            "trained on. Prefer https, or copy the file here and give its path.",
            text,
        )
    if dest.is_file() and not os.access(dest.parent, os.W_OK):
        return _cached(text, dest, expected)  # a read-only download dir: no lock; load_squad checks bytes
    with file_lock(dest):
        if dest.is_file() and (expected is None or sha256_file(dest) == expected):
            return _cached(text, dest, expected)
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
        shared_mode(tmp)
        os.replace(tmp, dest)  # atomic: readers never see a partial file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
