"""data.py on the real SQuAD excerpts: windows, labels, offsets, cache, sources, bad input."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path

import numpy as np
import pytest

import data
from extractive_qa.config.settings import WindowSpec
from extractive_qa.data import squad_files
from extractive_qa.data.features import build_features
from extractive_qa.errors import DataError
from extractive_qa.qa import squad_metric
from tests.support.cli_result import last_json
from tests.support.project import DATA, DEV_V1, DEV_V2, TRAIN_V1
from tests.support.reference_features import compare, standard_recipe

pytestmark = pytest.mark.cluster_stack  # tokenizers' offsets and NumPy arrays make the windows

LOCAL_TRAIN = DATA / "local-train-v1.1.json"


def _labelled_span_matches(examples, tokenizer, spec) -> tuple[int, list[str]]:
    f = build_features(examples, tokenizer, spec, labels=True, offsets=True)
    checked, bad = 0, []
    for row in range(len(f)):
        ex = examples[f.example_index[row]]
        s, e = f.start_positions[row], f.end_positions[row]
        if ex.is_impossible or s == f.cls_index:
            continue
        checked += 1
        text = ex.context[f.offsets[row, s, 0] : f.offsets[row, e, 1]]
        if squad_metric.normalize_answer(text) != squad_metric.normalize_answer(ex.answers[0]["text"]):
            bad.append(f"{ex.id}: {text!r} != {ex.answers[0]['text']!r}")
    return checked, bad


@pytest.mark.parametrize("path", [TRAIN_V1, LOCAL_TRAIN, DEV_V2])
def test_labelled_spans_decode_to_the_answer(path: Path, tokenizer) -> None:
    squad = squad_files.load_squad(path, training=True)
    checked, bad = _labelled_span_matches(squad.examples, tokenizer, WindowSpec(384, 128, 64))
    assert checked > 250
    assert len(bad) <= 0.005 * checked, "\n".join(bad)


def test_sub_word_answers_are_covered_by_their_token_span(tokenizer) -> None:
    # The dev article has answers that are parts of words ("gold" in "golden", "8" in "18"):
    # no token span isolates them, but the labelled span must still contain the answer.
    squad = squad_files.load_squad(DEV_V1, training=True)
    checked, bad = _labelled_span_matches(squad.examples, tokenizer, WindowSpec(384, 128, 64))
    assert len(bad) <= 0.03 * checked, "\n".join(bad)
    for line in bad:
        labelled, answer = line.split(": ", 1)[1].split(" != ")
        assert answer.strip("'").lower() in labelled.strip("'").lower(), line


def test_short_windows_label_every_window_and_cls_elsewhere(tokenizer) -> None:
    squad = squad_files.load_squad(TRAIN_V1, training=True)
    spec = WindowSpec(96, 24, 32)  # many windows per example
    f = build_features(squad.examples, tokenizer, spec, labels=True, offsets=True)
    assert len(f) > 2 * len(squad.examples)
    checked, bad = _labelled_span_matches(squad.examples, tokenizer, spec)
    assert len(bad) <= 0.005 * checked, "\n".join(bad)
    # A window whose context does not hold the answer labels CLS.
    assert (f.start_positions == f.cls_index).sum() > 0
    assert (f.lengths <= 96).all() and (np.diff(f.example_index) >= 0).all()


def test_features_identical_to_the_standard_recipe(tokenizer) -> None:
    squad = squad_files.load_squad(TRAIN_V1, training=True)
    for spec in (WindowSpec(384, 128, 64), WindowSpec(128, 32, 32)):
        ours = build_features(squad.examples, tokenizer, spec, labels=True, offsets=False)
        assert compare(ours, standard_recipe(squad.examples, tokenizer, spec)) == []
    # In batches (as datasets.map runs it), the reference still numbers examples globally.
    assert compare(ours, standard_recipe(squad.examples, tokenizer, spec, batch_size=37)) == []


def test_long_question_long_context_and_non_ascii(tokenizer) -> None:
    context = ("Zürich’s café — “naïve” façade, 東京 and Ελλάδα. " * 60) + "The answer is Ödön."
    question = "Where " + "really " * 120 + "is it?"
    start = context.index("Ödön")
    ex = squad_files.Example("q1", question, context, [{"text": "Ödön", "answer_start": start}])
    spec = WindowSpec(128, 48, 64)
    f = build_features([ex], tokenizer, spec, labels=True, offsets=True)
    assert len(f) > 5 and (f.lengths <= 128).all()
    # The question is cut to max_query_length tokens: 1 [CLS] + 64 + 1 [SEP] before the context.
    assert (f.offsets[:, :66, 0] == -1).all() and (f.offsets[:, 66, 0] >= 0).all()
    row = np.flatnonzero(f.start_positions != f.cls_index)[-1]
    s, e = f.start_positions[row], f.end_positions[row]
    assert context[f.offsets[row, s, 0] : f.offsets[row, e, 1]] == "Ödön"


def test_every_question_of_the_first_commands_validation_has_a_window(tokenizer) -> None:
    """local.yaml's validation, as the first command runs it (the bundled dev excerpt, the
    embedded model's tokenizer, 256 / 128 / 64): each of its 810 questions gets a window, so each
    is scored. (The cluster test of local.yaml validates its first questions only.)"""
    examples = squad_files.load_squad(DEV_V1, training=False).examples
    f = build_features(examples, tokenizer, WindowSpec(256, 128, 64), labels=False, offsets=True)
    assert len(examples) == 810 and set(f.example_index.tolist()) == set(range(810))


def test_window_spec_rejects_a_stride_longer_than_the_window() -> None:
    with pytest.raises(DataError, match="doc_stride"):
        WindowSpec(100, 60, 64).check()


BAD_FILES = {
    "empty": (b"", "empty"),
    "truncated": (b'{"data": [{"title": "x", "paragraphs": [', "truncated JSON"),
    "latin1": ('{"data": []}  café'.encode("latin-1"), "not UTF-8"),
    "no-data": (b'{"version": "1.1"}', "'data' list"),
}


def _squad(qas, context="Paris is the capital of France.") -> dict:
    return {"data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


QA = {"id": "a", "question": "What?", "answers": [{"text": "Paris", "answer_start": 0}]}
BAD_DOCS = {
    "missing-context": (
        {"data": [{"title": "T", "paragraphs": [{"qas": []}]}]},
        "paragraph 0: missing or empty 'context'",
    ),
    "missing-id": (_squad([{"question": "q", "answers": []}]), "question 0: missing 'id'"),
    "missing-answers": (_squad([{"id": "a", "question": "q"}]), "question id a: missing 'answers'"),
    "duplicate-id": (_squad([QA, QA]), "question id a: duplicate"),
    "answer-outside": (
        _squad([{**QA, "answers": [{"text": "x", "answer_start": 999}]}]),
        "answer_start 999 is outside the context",
    ),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_files_get_a_clear_error(name: str, tmp_path: Path) -> None:
    raw, message = BAD_FILES[name]
    path = tmp_path / f"{name}.json"
    path.write_bytes(raw)
    with pytest.raises(DataError, match=message) as err:
        squad_files.load_squad(path, training=False)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("name", BAD_DOCS)
def test_bad_documents_name_the_place(name: str, tmp_path: Path) -> None:
    doc, message = BAD_DOCS[name]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=message) as err:
        squad_files.load_squad(path, training=False)
    assert str(path) in str(err.value) and "article 0" in str(err.value)


def test_training_skips_and_reports_answers_not_in_the_context(tmp_path: Path) -> None:
    moved = {**QA, "id": "b", "answers": [{"text": "Paris", "answer_start": 3}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_squad([QA, moved])))
    train = squad_files.load_squad(path, training=True)
    assert [e.id for e in train.examples] == ["a"] and train.skipped == ["b"]
    assert len(squad_files.load_squad(path, training=False).examples) == 2  # evaluation keeps all


def test_versions_detected_and_missing_version_key_is_fine() -> None:
    assert squad_files.load_squad(TRAIN_V1, training=True).version == "1.1"  # no "version" key
    v2 = squad_files.load_squad(DEV_V2, training=False)
    assert v2.version == "2.0" and sum(e.is_impossible for e in v2.examples) == 702


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def http_dir(tmp_path: Path):
    root = tmp_path / "served"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_download_verifies_the_official_digest(
    http_dir, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, url = http_dir
    (root / "dev-v1.1.json").write_bytes(DEV_V1.read_bytes())  # not the full official file
    dest = tmp_path / "dl"
    with pytest.raises(DataError, match="expected 95aa6a52"):
        squad_files.resolve_source(f"{url}/dev-v1.1.json", dest)
    assert not (dest / "dev-v1.1.json").exists() and not list(dest.glob(".dev*"))
    (root / "mine.json").write_bytes(DEV_V1.read_bytes())  # a name with no pinned digest
    path = squad_files.resolve_source(f"{url}/mine.json", dest)
    assert path.read_bytes() == DEV_V1.read_bytes()
    with caplog.at_level("INFO", logger="squad"):  # the second time: the cached copy, said so
        assert squad_files.load_squad(f"{url}/mine.json", training=False, download_dir=dest).examples
    assert "using the copy downloaded" in caplog.text and "delete it to download it again" in caplog.text


def test_offline_download_says_where_to_put_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="copy the file to .*train-v1.1.json"):
        squad_files.resolve_source("http://127.0.0.1:9/train-v1.1.json", tmp_path)


def test_missing_local_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        squad_files.resolve_source(tmp_path / "nope.json")


def test_cli_prints_json_last_and_fails_cleanly(tiny_bert, tmp_path: Path, capsys) -> None:
    args = [
        "--squad",
        str(TRAIN_V1),
        "--tokenizer",
        str(tiny_bert),
        "--split",
        "train",
        "--max-seq-length",
        "128",
        "--doc-stride",
        "32",
        "--cache-dir",
        str(tmp_path),
    ]
    assert data.main(args) == 0
    out = last_json(capsys.readouterr().out)
    assert out["examples"] == 269 and out["cache"] == "built" and out["features"] >= 269
    assert data.main(args) == 0
    assert last_json(capsys.readouterr().out)["cache"] == "hit"
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert (
        data.main(["--squad", str(bad), "--tokenizer", str(tiny_bert), "--split", "train", "--no-cache"]) == 2
    )
    assert "invalid or truncated JSON" in capsys.readouterr().err


def test_two_urls_with_the_same_file_name_get_their_own_download(http_dir, tmp_path: Path) -> None:
    """The download cache is keyed by the full URL: a second URL ending in the same name is fetched,
    not answered with the first one's file."""
    root, url = http_dir
    (root / "a").mkdir()
    (root / "b").mkdir()
    (root / "a" / "custom.json").write_bytes(DEV_V1.read_bytes())
    (root / "b" / "custom.json").write_bytes(DEV_V2.read_bytes())
    dest = tmp_path / "dl"
    first = squad_files.resolve_source(f"{url}/a/custom.json", dest)
    second = squad_files.resolve_source(f"{url}/b/custom.json", dest)
    assert first != second
    assert first.read_bytes() == DEV_V1.read_bytes() and second.read_bytes() == DEV_V2.read_bytes()
    assert squad_files.resolve_source(f"{url}/a/custom.json", dest) == first  # and reused


@pytest.mark.parametrize(
    ("text", "needle"),
    [('{"data": ' + "[   " * 100000 + "]" * 100000 + "}", "nested too deeply"),
     ('{"version": "1.1", "x": ' + "9" * 5000 + ', "data": []}', "not readable SQuAD JSON")],
)  # fmt: skip
def test_hostile_json_is_a_named_error(text: str, needle: str, tmp_path: Path) -> None:
    path = tmp_path / "hostile.json"
    path.write_text(text)
    with pytest.raises(DataError, match=needle) as err:
        squad_files.load_squad(path, training=False)
    assert str(path) in str(err.value)


def test_the_pinned_digest_guards_the_bytes_parsed_not_the_path(tmp_path: Path, monkeypatch) -> None:
    """An official file checked on disk and swapped before it is read: load_squad hashes the
    bytes it parses, so the swap is refused, also from a read-only download directory."""
    import hashlib
    import os

    url = f"{squad_files.OFFICIAL_BASE_URL}dev-v1.1.json"
    dest = tmp_path / "dl" / "dev-v1.1.json"
    dest.parent.mkdir()
    dest.write_bytes(DEV_V1.read_bytes())
    pinned = hashlib.sha256(DEV_V1.read_bytes()).hexdigest()  # this excerpt stands in for the file
    monkeypatch.setitem(squad_files.OFFICIAL_SHA256, "dev-v1.1.json", pinned)
    resolve = squad_files.resolve_source

    def checked_then_swapped(*args: object, **kwargs: object) -> Path:
        path = resolve(*args, **kwargs)
        path.write_bytes(DEV_V2.read_bytes())
        return path

    monkeypatch.setattr(squad_files, "resolve_source", checked_then_swapped)
    with pytest.raises(DataError, match="SHA-256 differs"):
        squad_files.load_squad(url, training=False, download_dir=dest.parent)
    monkeypatch.setattr(squad_files, "resolve_source", resolve)
    dest.write_bytes(DEV_V1.read_bytes())
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode == os.W_OK else real_access(p, mode))
    assert squad_files.load_squad(url, training=False, download_dir=dest.parent).examples  # no lock file
