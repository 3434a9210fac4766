"""SQuAD v1.1 / v2.0 JSON -> checked examples: every question with its context and answers, the
place of anything malformed named."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extractive_qa.squad_sources import DataError, resolve_source

# --------------------------------------------------------------------------------------------
# Parsing and validation.
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Example:
    id: str
    question: str
    context: str
    answers: list[dict[str, Any]]  # [{"text": str, "answer_start": int}], may be empty (v2.0)
    is_impossible: bool = False


@dataclass
class SquadSet:
    path: Path
    version: str  # "1.1" or "2.0"
    examples: list[Example]
    sha256: str
    skipped: list[str] = field(default_factory=list)  # training ids whose answer is not found


def load_squad(source: str | os.PathLike, *, training: bool, download_dir: Path | None = None) -> SquadSet:
    """Parse and validate a SQuAD v1.1 / v2.0 file.

    Training drops (and reports) questions whose first answer is not where `answer_start` says;
    evaluation keeps every question, as the official scripts do.
    """
    path = resolve_source(source, download_dir)
    raw = path.read_bytes()
    doc = _read_json(path, raw)
    examples: list[Example] = []
    skipped: list[str] = []
    seen: set[str] = set()
    has_impossible = False  # any question so far carries is_impossible: a v2.0 file
    for a, article in enumerate(doc["data"]):
        title = article.get("title", "?") if isinstance(article, dict) else "?"
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataError(f"{path}: article {a} ({title!r}) has no 'paragraphs' list.")
        for p, para in enumerate(paragraphs):
            where = f"{path}: article {a} ({title!r}) paragraph {p}"
            context = para.get("context") if isinstance(para, dict) else None
            if not isinstance(context, str) or not context.strip():
                raise DataError(f"{where}: missing or empty 'context'.")
            qas = para.get("qas")
            if not isinstance(qas, list):
                raise DataError(f"{where}: missing 'qas' list.")
            for q, qa in enumerate(qas):
                qid = qa.get("id") if isinstance(qa, dict) else None
                if not isinstance(qid, str) or not qid:
                    raise DataError(f"{where} question {q}: missing 'id'.")
                if qid in seen:
                    raise DataError(f"{where} question id {qid}: duplicate question id; ids must be unique.")
                seen.add(qid)
                has_impossible |= "is_impossible" in qa
                example = _question(qa, context, f"{where} question id {qid}", has_impossible)
                if training and not example.is_impossible and not _answer_is_where_it_says(example):
                    skipped.append(qid)
                    continue
                examples.append(example)
    if not examples:
        raise DataError(f"{path}: no questions found.")
    version = "2.0" if has_impossible or str(doc.get("version", "")).startswith("v2") else "1.1"
    return SquadSet(path, version, examples, hashlib.sha256(raw).hexdigest(), skipped)


def _read_json(path: Path, raw: bytes) -> dict[str, Any]:
    """The file's JSON document, with a clear error for empty, non-UTF-8 or truncated files."""
    if not raw.strip():
        raise DataError(f"{path}: file is empty; expected SQuAD JSON with a 'data' list.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not UTF-8 (bad byte at offset {err.start}); SQuAD files are UTF-8 JSON."
        ) from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply to be a SQuAD file.") from None
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}: invalid or truncated JSON at line {err.lineno} column {err.colno}: {err.msg}."
        ) from None
    except ValueError as err:  # e.g. an integer of thousands of digits
        raise DataError(f"{path}: unreadable JSON value ({str(err)[:200]}).") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DataError(f"{path}: no top-level 'data' list; is this a SQuAD file?")
    return doc


def _question(qa: dict[str, Any], context: str, place: str, v2_file: bool) -> Example:
    """One checked question. No answers is allowed only where the file is v2.0 (`v2_file`)."""
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{place}: missing or empty 'question'.")
    impossible = bool(qa.get("is_impossible", False))
    answers = qa.get("answers")
    if not isinstance(answers, list):
        raise DataError(f"{place}: missing 'answers' list.")
    for ans in answers:
        if not isinstance(ans, dict) or not isinstance(ans.get("text"), str):
            raise DataError(f"{place}: each answer needs 'text' and 'answer_start'.")
        start = ans.get("answer_start")
        if not isinstance(start, int) or not 0 <= start < len(context):
            raise DataError(
                f"{place}: answer_start {start!r} is outside the context (length {len(context)})."
            )
    if not impossible and not answers and not v2_file:
        raise DataError(f"{place}: no answers and not marked is_impossible (v1.1 needs answers).")
    return Example(qa["id"], question, context, answers, impossible or not answers)


def _answer_is_where_it_says(example: Example) -> bool:
    first = example.answers[0]
    start = first["answer_start"]
    return example.context[start : start + len(first["text"])] == first["text"]
