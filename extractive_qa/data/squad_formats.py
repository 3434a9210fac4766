"""SQuAD's containers, read into questions and written from examples.

Two schemas: SQuAD's nested JSON ({"version", "data": articles -> paragraphs -> qas}) and the
flat `squad` schema, one record per question, as Hugging Face `datasets` and most shared QA sets
store it -- `id, title, context, question, answers{text[], answer_start[]}`, an unanswerable
(v2.0) question having empty answer lists. Flat records are read from JSON Lines, a JSON array,
Parquet (with `pyarrow`) or a `datasets` name or saved directory (with `datasets`); both schemas
are written (nested as .json, flat as JSON Lines or Parquet).

`read_questions` tells the container from the bytes themselves and turns it into questions in
SQuAD's nested form, each with a place for error messages (article and paragraph, or file + line
or row); squad_files checks every question alike, whatever container it came in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractive_qa.errors import DataError
from extractive_qa.io import reading
from extractive_qa.io.files import write_bytes_atomic, write_text_atomic

PARQUET_MAGIC = b"PAR1"
DATASETS_PREFIX = "datasets:"
FIELDS = ("id", "title", "context", "question", "answers")
INSTALL_DATA = "pip install -r requirements-data.txt"


@dataclass(slots=True)
class FlatRecord:
    """One question of a flat file: where it is (for error messages) and the record."""

    place: str
    record: Any


# (place for messages, article title, context, the question's dict in SQuAD's nested form)
Question = tuple[str, str, Any, Any]


@dataclass
class Questions:
    """A container's questions, read lazily, and what the container says of its version."""

    items: Iterable[Question]
    flat: bool  # the flat schema: a question with empty answers is unanswerable (v2.0)
    declared_v2: bool = False  # a nested file whose "version" says v2


def read_questions(path: Path, raw: bytes) -> Questions:
    """The questions of the file `path` whose bytes are `raw`: Parquet (by its magic), a JSON array
    or JSON Lines of flat records, or SQuAD's nested JSON document."""
    if raw.startswith(PARQUET_MAGIC):
        return Questions(_flat_questions(parquet_records(path, raw)), flat=True)
    text = _text(path, raw)
    first = first_line_record(text)  # None for an array: its first line is no object
    if first is not None:
        return Questions(_flat_questions(line_records(path, text, first)), flat=True)
    doc = _read_json(path, text)
    if isinstance(doc, list):
        return Questions(_flat_questions(array_records(path, doc)), flat=True)
    if is_flat_record(doc):  # JSON Lines of one line
        return Questions(_flat_questions([FlatRecord(f"{path}: line 1", doc)]), flat=True)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DataError(
            f"{path}: no top-level 'data' list; is this a SQuAD file? (Flat records -- one question "
            "per line with id, title, context, question, answers -- are read as JSON Lines.)"
        )
    v2 = str(doc.get("version", "")).startswith("v2")
    return Questions(_nested_questions(path, doc), flat=False, declared_v2=v2)


def datasets_questions(source: str) -> tuple[Questions, str]:
    """`datasets:NAME_OR_DIR:SPLIT` -> its questions and a digest of their content."""
    records, digest = datasets_records(source)
    return Questions(_flat_questions(records), flat=True), digest


def _text(path: Path, raw: bytes) -> str:
    """The file as text, with a clear error for empty or non-UTF-8 files."""
    if not raw.strip():
        raise DataError(f"{path}: file is empty; expected SQuAD JSON with a 'data' list.")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not UTF-8 (bad byte at offset {err.start}); SQuAD files are UTF-8 JSON."
        ) from None


def _read_json(path: Path, text: str) -> Any:
    """The file's one JSON value, SQuAD's document or an array of flat records (reading.parse_json:
    unique keys, finite numbers, bounded nesting), with a clear error for truncated or unreadable
    JSON."""
    array = text.lstrip().startswith("[")
    try:
        return reading.parse_json(text, path, "JSON array of records" if array else "SQuAD JSON")
    except reading.UnreadableFile as err:
        expected = "Expected a JSON array of question records." if array else (
            "SQuAD files are UTF-8 JSON with a 'data' list.")  # fmt: skip
        raise DataError(f"{err} {expected}") from None


def _nested_questions(path: Path, doc: dict[str, Any]) -> Iterator[Question]:
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
                if not isinstance(qa, dict):
                    raise DataError(f"{where} question {q}: not an object with 'id', 'question', 'answers'.")
                check_id(qa.get("id"), f"{where} question {q}")
                yield where, title if isinstance(title, str) else "?", context, qa


def check_id(qid: Any, where: str) -> None:
    """A question's id: present, a non-empty string."""
    if qid is None:
        raise DataError(f"{where}: missing 'id'.")
    if not isinstance(qid, str) or not qid:
        raise DataError(f"{where}: 'id' must be a non-empty string, got {qid!r}.")


def _flat_questions(records: Iterable[FlatRecord]) -> Iterator[Question]:
    for item in records:
        title, context, qa = as_question(item)
        yield item.place, title, context, qa


def first_line_record(text: str) -> Any:
    """The first line of a JSON Lines text of two or more lines, parsed, where that line alone is
    a flat record; else None. (A one-line file is parsed whole: `is_flat_record` then tells a
    single record from SQuAD's document, which may be pretty-printed over many lines.)"""
    first, _, rest = text.lstrip().partition("\n")
    if not rest.strip():
        return None
    try:
        record = reading.parse_json(first, "first line")
    except reading.UnreadableFile:
        return None
    return record if is_flat_record(record) else None


def is_flat_record(obj: Any) -> bool:
    return isinstance(obj, dict) and "data" not in obj and any(k in obj for k in FIELDS)


def array_records(path: Path, records: list[Any]) -> Iterator[FlatRecord]:
    """The records of a JSON array."""
    for i, record in enumerate(records):
        yield FlatRecord(f"{path}: record {i}", record)


def line_records(path: Path, text: str, first: Any) -> Iterator[FlatRecord]:
    """The records of a JSON Lines file (blank lines skipped); `first`, its first record, was
    parsed already (`first_line_record`) and is not parsed again."""
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if first is not None:
            record, first = first, None
        else:
            try:
                record = reading.parse_json(line, f"{path}: line {number}")
            except reading.UnreadableFile as err:
                raise DataError(
                    f"{path}: line {number} is not one JSON object ({str(err).split(': ', 2)[-1][:200]}); "
                    "JSON Lines holds one question record per line."
                ) from None
        yield FlatRecord(f"{path}: line {number}", record)


# Parquet stores a repeated string once (a dictionary) and a run of rows in a few bytes, so its size
# says little about what reading it makes. Before any column is read, its metadata must promise at
# most one row per PARQUET_BYTES_PER_ROW bytes of file (SQuAD's own Parquet has one per 120 to 170)
# and decoded columns within the data limit (the limit a JSON file's text has); the contexts and
# titles stay one Python string per distinct value, shared by their rows.
PARQUET_BYTES_PER_ROW = 32
SHARED_COLUMNS = ("title", "context")


def parquet_records(path: Path, raw: bytes) -> Iterator[FlatRecord]:
    """The rows of a Parquet file in the flat schema (needs pyarrow), read from `raw`, the bytes
    already read (and digested) by the caller, within the bounds above."""
    pq = _pyarrow_parquet(f"{path} is Parquet")
    import pyarrow as pa

    try:
        parquet = pq.ParquetFile(pa.BufferReader(raw))
        meta, names = parquet.metadata, parquet.schema_arrow.names
        decoded = sum(
            meta.row_group(g).column(c).total_uncompressed_size
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
        )
    except Exception as err:  # pyarrow raises its own error kinds for damaged files
        raise DataError(f"{path}: unreadable Parquet ({str(err).splitlines()[0][:200]}).") from None
    if meta.num_rows > len(raw) // PARQUET_BYTES_PER_ROW or decoded > reading.DATA.bytes:
        raise DataError(
            f"{path}: its metadata promises {meta.num_rows:,} rows and {decoded:,} decoded bytes from "
            f"{len(raw):,} bytes of file; at most one row per {PARQUET_BYTES_PER_ROW} bytes and "
            f"{reading.DATA.bytes:,} decoded bytes ({reading.DATA.override} raises the second) are read."
        )
    missing = [name for name in FIELDS if name != "title" and name not in names]
    if missing:
        raise DataError(
            f"{path}: Parquet columns {names} lack {missing}; the flat squad schema has columns "
            f"{list(FIELDS)}."
        )
    try:
        shared = [name for name in SHARED_COLUMNS if name in names]
        table = pq.ParquetFile(pa.BufferReader(raw), read_dictionary=shared).read()
    except Exception as err:  # as above
        raise DataError(f"{path}: unreadable Parquet ({str(err).splitlines()[0][:200]}).") from None
    columns = {name: _column_values(table.column(name)) for name in names}
    for row in range(table.num_rows):
        yield FlatRecord(f"{path}: row {row}", {name: values[row] for name, values in columns.items()})


def _column_values(column: Any) -> list[Any]:
    """A column's values as Python objects; a dictionary-encoded column's values made once and
    shared by every row that holds them."""
    import pyarrow as pa

    values: list[Any] = []
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):
            distinct = chunk.dictionary.to_pylist()
            values += [None if i is None else distinct[i] for i in chunk.indices.to_pylist()]
        else:
            values += chunk.to_pylist()
    return values


def datasets_records(source: str) -> tuple[list[FlatRecord], str]:
    """`datasets:NAME_OR_DIR:SPLIT` -> its records and a digest of their content. NAME_OR_DIR is a
    directory written by `save_to_disk`, a local directory of data files, or a hub name (which
    needs the network, as `datasets` does)."""
    spec = source[len(DATASETS_PREFIX) :]
    name, _, split = spec.rpartition(":")
    if not name or not split:
        raise DataError(
            f"{source}: expected datasets:NAME_OR_DIR:SPLIT (e.g. datasets:rajpurkar/squad:train or "
            "datasets:/data/my_qa:validation)."
        )
    try:
        import datasets
    except ImportError:
        raise DataError(f"{source}: needs the datasets package ({INSTALL_DATA}).") from None
    try:
        if (Path(name) / "dataset_dict.json").is_file() or (Path(name) / "dataset_info.json").is_file():
            loaded = datasets.load_from_disk(name)
            dataset = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            dataset = datasets.load_dataset(name, split=split)
    except KeyError:
        raise DataError(f"{source}: the dataset has no split {split!r}.") from None
    except Exception as err:  # datasets raises many kinds (not found, offline, bad split)
        reason = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
        raise DataError(f"{source}: cannot load it with datasets ({reason}).") from None
    rows = dataset.to_list()
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return [FlatRecord(f"{source}: row {i}", row) for i, row in enumerate(rows)], digest


def as_question(item: FlatRecord) -> tuple[str, str, dict[str, Any]]:
    """A flat record -> (title, context, question dict in SQuAD's nested form), so the nested
    format's checks apply unchanged. Shape errors name the record and the field."""
    record, place = item.record, item.place
    if not isinstance(record, dict):
        kind = type(record).__name__
        raise DataError(f"{place}: expected an object with fields {list(FIELDS)}, got {kind}.")
    missing = [name for name in FIELDS if name != "title" and name not in record]
    if missing:
        raise DataError(f"{place}: missing field(s) {missing}; the flat squad schema has {list(FIELDS)}.")
    answers = record["answers"]
    texts = answers.get("text") if isinstance(answers, dict) else None
    starts = answers.get("answer_start") if isinstance(answers, dict) else None
    if not isinstance(texts, list) or not isinstance(starts, list):
        raise DataError(
            f'{place}: field \'answers\' must be {{"text": [...], "answer_start": [...]}} (empty lists '
            "for an unanswerable question)."
        )
    if len(texts) != len(starts):
        raise DataError(
            f"{place}: field 'answers' has {len(texts)} text(s) but {len(starts)} answer_start(s)."
        )
    title = record.get("title")
    qa = {
        "id": record["id"],
        "question": record["question"],
        "answers": [{"text": t, "answer_start": s} for t, s in zip(texts, starts, strict=True)],
    }
    return (title if isinstance(title, str) else ""), record["context"], qa


# --------------------------------------------------------------------------------------------
# Writing: nested JSON, JSON Lines or Parquet, atomically.
# --------------------------------------------------------------------------------------------


def write_squad(examples: Sequence[Any], version: str, out: Path) -> None:
    """Write checked examples (squad_files.Example) of a SQuAD `version` ("1.1" or "2.0") as
    SQuAD's nested JSON (`.json`), JSON Lines (`.jsonl`) or Parquet (`.parquet`), whole or not at
    all. Consecutive questions on one context share a paragraph, consecutive paragraphs with one
    title an article, so a file converted there and back is the same questions in the same order."""
    if out.suffix in (".jsonl", ".parquet"):
        write_flat(examples, out)
        return
    if out.suffix != ".json":
        raise DataError(f"{out}: write .json (SQuAD's nested form), .jsonl or .parquet.")
    articles: list[dict[str, Any]] = []
    for ex in examples:
        if not articles or articles[-1]["title"] != ex.title:
            articles.append({"title": ex.title, "paragraphs": []})
        paragraphs = articles[-1]["paragraphs"]
        if not paragraphs or paragraphs[-1]["context"] != ex.context:
            paragraphs.append({"context": ex.context, "qas": []})
        qa: dict[str, Any] = {"id": ex.id, "question": ex.question, "answers": ex.answers}
        if version == "2.0":
            qa["is_impossible"] = ex.is_impossible
        paragraphs[-1]["qas"].append(qa)
    nested = {"version": "v2.0" if version == "2.0" else "1.1", "data": articles}
    write_text_atomic(out, json.dumps(nested, ensure_ascii=False))


def flat_record(example: Any) -> dict[str, Any]:
    """One checked example (squad_files.Example) as a flat-schema record."""
    return {
        "id": example.id,
        "title": example.title,
        "context": example.context,
        "question": example.question,
        "answers": {
            "text": [a["text"] for a in example.answers],
            "answer_start": [a["answer_start"] for a in example.answers],
        },
    }


def write_flat(examples: Sequence[Any], out: Path) -> None:
    """Write examples as JSON Lines (`.jsonl`) or Parquet (`.parquet`), whole or not at all."""
    records = [flat_record(ex) for ex in examples]
    if out.suffix != ".parquet":
        write_text_atomic(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        return
    pq = _pyarrow_parquet(f"writing {out}")
    import pyarrow as pa

    answers = pa.struct([("text", pa.list_(pa.string())), ("answer_start", pa.list_(pa.int32()))])
    schema = pa.schema([("id", pa.string()), ("title", pa.string()), ("context", pa.string()),
                        ("question", pa.string()), ("answers", answers)])  # fmt: skip
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(records, schema=schema), sink)
    write_bytes_atomic(out, sink.getvalue().to_pybytes())


def _pyarrow_parquet(what: str) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{what}: Parquet needs the pyarrow package ({INSTALL_DATA}).") from None
    return pq
