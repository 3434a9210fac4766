"""Your own QA data in the flat `squad` schema: JSON Lines, JSON arrays, Parquet and `datasets`
sources read as the same checked examples as SQuAD's nested JSON; conversion both ways; the
first-N subsets; and a run trained on flat files scoring exactly as on the nested ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import data
from extractive_qa.config.settings import DataSettings, WindowSpec
from extractive_qa.data import squad_files, squad_formats
from extractive_qa.errors import DataError
from tests.support.project import DEV_V1, DEV_V2, TRAIN_V1, run_train, tiny_config, write_yaml

pytestmark = pytest.mark.cluster_stack  # JSON Lines / Parquet readers on the image's NumPy


def _fields(squad: squad_files.SquadSet) -> list[tuple[Any, ...]]:
    return [(e.id, e.title, e.context, e.question, e.answers, e.is_impossible) for e in squad.examples]


@pytest.mark.parametrize("source", [DEV_V1, DEV_V2, TRAIN_V1], ids=["dev-v1.1", "dev-v2.0", "train-v1.1"])
def test_convert_round_trip_keeps_every_question(source: Path, tmp_path: Path) -> None:
    """nested -> JSON Lines -> Parquet -> nested through `data.py --convert`: the same questions,
    titles, answers and version at every step, and the nested file's questions in its order."""
    pytest.importorskip("pyarrow")  # the cluster image's set has no Parquet; .ci/compat skips this
    original = squad_files.load_squad(source, training=False)
    chain = [source, tmp_path / "a.jsonl", tmp_path / "b.parquet", tmp_path / "c.json"]
    for given, out in zip(chain, chain[1:], strict=False):
        assert data.main(["--convert", str(given), "--out", str(out)]) == 0
        converted = squad_files.load_squad(out, training=False)
        assert converted.version == original.version
        assert _fields(converted) == _fields(original), out.name
    back = json.loads(chain[-1].read_text())
    nested = json.loads(source.read_text())
    flat = lambda doc: [  # noqa: E731
        (a["title"], p["context"], [q["id"] for q in p["qas"]]) for a in doc["data"] for p in a["paragraphs"]
    ]
    assert flat(back) == flat(nested)


def test_jsonl_as_datasets_writes_it_and_a_json_array(tmp_path: Path) -> None:
    """What `datasets`' to_json writes (one record per line, answers as two lists) and a JSON
    array of the same records both read as the nested file does; v2.0 from empty answers."""
    squad = squad_files.load_squad(DEV_V2, training=False)
    records = [squad_formats.flat_record(e) for e in squad.examples]
    lines = tmp_path / "dev.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")  # a trailing blank line too
    array = tmp_path / "dev-array.json"
    array.write_text(json.dumps(records))
    for path in (lines, array):
        loaded = squad_files.load_squad(path, training=False)
        assert loaded.version == "2.0" and _fields(loaded) == _fields(squad)
    assert any(not r["answers"]["text"] for r in records)


def test_each_line_of_a_json_lines_file_is_parsed_once(tmp_path: Path, monkeypatch) -> None:
    """The first line tells JSON Lines from SQuAD's document; the record it parsed is the first
    record, not parsed again (before: the first line was parsed twice)."""
    from extractive_qa.io import reading

    squad = squad_files.load_squad(DEV_V1, training=False)
    lines = tmp_path / "dev.jsonl"
    lines.write_text("\n" + "\n".join(json.dumps(squad_formats.flat_record(e)) for e in squad.examples[:3]))
    parsed: list[str] = []
    real = reading.parse_json

    def counted(data: Any, shown: Any, *args: Any) -> Any:
        parsed.append(data if isinstance(data, str) else data.decode())
        return real(data, shown, *args)

    monkeypatch.setattr(reading, "parse_json", counted)
    loaded = squad_files.load_squad(lines, training=False)
    assert _fields(loaded) == _fields(squad)[:3]
    assert sorted(parsed) == sorted(line for line in lines.read_text().split("\n") if line)


FLAT_OK = {"id": "a", "title": "T", "context": "Paris is big.", "question": "What?",
           "answers": {"text": ["Paris"], "answer_start": [0]}}  # fmt: skip
ANSWERS = FLAT_OK["answers"]


def _record(**fields: Any) -> str:
    return json.dumps({**FLAT_OK, "id": "b", **fields})


BAD_RECORDS = {
    "not-json": ("{not json", "line 2 is not one JSON object"),
    "not-an-object": ("[1, 2]", "line 2: expected an object"),
    "missing-field": (
        json.dumps({"id": "b", "context": "x", "answers": ANSWERS}),
        "missing field(s) ['question']",
    ),
    "answers-shape": (_record(answers=[{"text": "Paris"}]), "line 2: field 'answers' must be"),
    "lengths-differ": (
        _record(answers={"text": ["P"], "answer_start": []}),
        "1 text(s) but 0 answer_start(s)",
    ),
    "start-outside": (
        _record(answers={"text": ["P"], "answer_start": [99]}),
        "id b: answer_start 99 is outside",
    ),
    "empty-context": (_record(context=" "), "line 2: missing or empty 'context'"),
    "duplicate-id": (json.dumps(FLAT_OK), "line 2 question id a: duplicate question id"),
    "empty-question": (_record(question=""), "line 2 question id b: missing or empty 'question'"),
}


@pytest.mark.parametrize("name", BAD_RECORDS)
def test_bad_jsonl_record_named_by_line_and_field(name: str, tmp_path: Path) -> None:
    line, message = BAD_RECORDS[name]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(FLAT_OK) + "\n" + line + "\n")
    with pytest.raises(DataError) as err:
        squad_files.load_squad(path, training=False)
    assert str(path) in str(err.value) and message in str(err.value)


def _parquet(path: Path, rows: int, context: Any, qid: Any = "q") -> Path:
    """A flat-schema Parquet file of `rows` questions; `context` and `qid` map a row to its values."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    answers = {"text": ["Denver"], "answer_start": [0]}
    table = pa.table({"id": [qid(i) if callable(qid) else qid for i in range(rows)], "title": ["t"] * rows,
                      "context": [context(i) for i in range(rows)], "question": ["Who won?"] * rows,
                      "answers": [answers] * rows})  # fmt: skip
    pq.write_table(table, path)
    return path


def test_parquet_is_bounded_by_its_metadata_before_a_column_is_read(tmp_path: Path, monkeypatch) -> None:
    """Parquet stores a run of equal rows in a few bytes: 200,000 rows in 5 KB once materialised
    as 200,000 Python records (hundreds of MB) before a check; 20 contexts of 100,000 characters
    compress to little. Both are refused from the file's metadata, naming what it promises."""
    same = _parquet(tmp_path / "same.parquet", 200_000, lambda i: "Denver won.")
    with pytest.raises(
        DataError, match=r"same.parquet: its metadata promises 200,000 rows .* one row per 32"
    ):
        squad_files.load_squad(same, training=False)
    wide = _parquet(tmp_path / "wide.parquet", 20, lambda i: f"Denver won {i}. " + "x" * 100_000, str)
    monkeypatch.setenv("EXTRACTIVE_QA_MAX_INPUT_MB", "1")
    with pytest.raises(DataError, match=r"wide.parquet: .* and 2,0\d\d,\d\d\d decoded bytes .* 1,048,576"):
        squad_files.load_squad(wide, training=False)
    monkeypatch.delenv("EXTRACTIVE_QA_MAX_INPUT_MB")
    assert len(squad_files.load_squad(wide, training=False).examples) == 20


def test_parquet_rows_share_their_context_string(tmp_path: Path) -> None:
    """A context a dictionary stores once is one Python string for all its rows, not one each."""
    shared = _parquet(tmp_path / "shared.parquet", 50, lambda i: "Denver won. " * 1000, str)
    records = list(squad_formats.parquet_records(shared, shared.read_bytes()))
    assert len({id(r.record["context"]) for r in records}) == 1 and len(records) == 50


def test_bad_parquet_named(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    missing = tmp_path / "missing.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "context": "x", "question": "q"}]), missing)
    with pytest.raises(DataError, match=r"missing.parquet: Parquet columns .* lack \['answers'\]"):
        squad_files.load_squad(missing, training=False)
    cut = tmp_path / "cut.parquet"
    whole = tmp_path / "whole.parquet"
    squad_formats.write_flat(squad_files.load_squad(DEV_V1, training=False).examples, whole)
    cut.write_bytes(whole.read_bytes()[:5000])
    with pytest.raises(DataError, match="cut.parquet: unreadable Parquet"):
        squad_files.load_squad(cut, training=False)
    row = tmp_path / "row.parquet"
    bad = {**FLAT_OK, "id": "b", "answers": {"text": ["x"], "answer_start": [99]}}
    pq.write_table(pa.Table.from_pylist([FLAT_OK, bad]), row)
    with pytest.raises(DataError, match="row.parquet: row 1 question id b: answer_start 99"):
        squad_files.load_squad(row, training=False)


def test_training_drops_misplaced_answers_as_for_nested(tmp_path: Path) -> None:
    moved = {**FLAT_OK, "id": "b", "answers": {"text": ["Paris"], "answer_start": [3]}}
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(FLAT_OK) + "\n" + json.dumps(moved) + "\n")
    squad = squad_files.load_squad(path, training=True)
    assert [e.id for e in squad.examples] == ["a"] and squad.skipped == ["b"]
    assert len(squad_files.load_squad(path, training=False).examples) == 2


def test_datasets_sources_offline(tmp_path: Path) -> None:
    """`datasets:DIR:SPLIT` for a directory of data files and for a save_to_disk directory."""
    datasets = pytest.importorskip("datasets")

    squad = squad_files.load_squad(DEV_V1, training=False)
    squad_formats.write_flat(squad.examples, tmp_path / "files" / "validation.jsonl")
    from_files = squad_files.load_squad(f"datasets:{tmp_path / 'files'}:validation", training=False)
    assert _fields(from_files) == _fields(squad)
    loaded = datasets.load_dataset(
        "json", data_files={"validation": str(tmp_path / "files" / "validation.jsonl")}
    )
    loaded.save_to_disk(str(tmp_path / "saved"))
    saved = squad_files.load_squad(f"datasets:{tmp_path / 'saved'}:validation", training=False)
    assert _fields(saved) == _fields(squad) and saved.sha256 == from_files.sha256
    with pytest.raises(DataError, match="has no split 'train'"):
        squad_files.load_squad(f"datasets:{tmp_path / 'saved'}:train", training=False)
    with pytest.raises(DataError, match="expected datasets:NAME_OR_DIR:SPLIT"):
        squad_files.load_squad("datasets:squad", training=False)


def test_first_examples_subset_is_deterministic_and_keyed(tokenizer: Any, tmp_path: Path) -> None:
    settings = DataSettings(train_file=str(TRAIN_V1), validation_file=str(DEV_V1), pretrained_model="x",
                            cache_dir=str(tmp_path), max_train_examples=20, max_eval_examples=30)  # fmt: skip
    whole = squad_files.load_squad(TRAIN_V1, training=True)
    part = squad_files.first_examples(whole, settings.max_train_examples)
    assert [e.id for e in part.examples] == [e.id for e in whole.examples[:20]]
    assert part.sha256 != whole.sha256  # a subset's feature cache is its own
    assert squad_files.first_examples(whole, 10_000) is whole


def test_run_on_flat_files_scores_as_on_nested(tiny_bert: Path, tmp_path: Path) -> None:
    """The training and validation files as JSON Lines, with first-N subsets: the run windows the
    same questions and ends at the nested files' EM/F1 and loss (on the cluster image's software
    too: .ci/compat)."""
    results = []
    for form in ("nested", "flat"):
        train, dev = TRAIN_V1, DEV_V1
        if form == "flat":
            train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
            assert data.main(["--convert", str(TRAIN_V1), "--out", str(train)]) == 0
            assert data.main(["--convert", str(DEV_V1), "--out", str(dev)]) == 0
        conf = tiny_config(tiny_bert, tmp_path / form, train_file=str(train), validation_file=str(dev),
                           max_train_examples=40, max_eval_examples=60)  # fmt: skip
        (tmp_path / form).mkdir()
        config = write_yaml(conf, tmp_path / form / "exp.yaml")
        code, result, err = run_train(
            ["--config", str(config), "--checkpoint-dir", str(tmp_path / form / "ck")]
        )
        assert code == 0, err[-2000:]
        results.append(result)
    nested, flat = results
    assert flat["f1"] == nested["f1"] and flat["exact_match"] == nested["exact_match"]
    assert flat["last_train_loss"] == nested["last_train_loss"]
    assert (
        flat["eval_windows"] == nested["eval_windows"] < 200
    )  # the first 60 questions (all 810: ~1,500 windows)


def test_load_run_data_applies_the_subsets(tokenizer: Any, tiny_bert: Path, tmp_path: Path) -> None:
    model, cache = str(tiny_bert), str(tmp_path)
    settings = DataSettings(train_file=str(TRAIN_V1), validation_file=str(DEV_V1), pretrained_model=model,
                            cache_dir=cache, max_train_examples=20, max_eval_examples=30)  # fmt: skip
    run = data.load_run_data(settings, WindowSpec(128, 32, 32), rank=0)
    assert len(run.train_set.examples) == 20 and len(run.val_set.examples) == 30
    assert set(run.val_features.example_index.tolist()) == set(range(30))


def test_an_answer_off_its_start_is_named_by_convert_and_the_dry_run(tiny_bert: Path, tmp_path: Path) -> None:
    """One answer_start off by one: data.py --convert kept it without a word and the dry run
    counted 2 of 3 questions silently; only training warned, by id. Both now name the file, the
    line and the field before any training."""
    from tests.support.project import run_main

    rows = [("a", "Denver", 0), ("b", "the game", 12), ("c", "won", 7)]
    lines = [json.dumps({"id": i, "title": "t", "context": "Denver won the game.", "question": f"{i}?",
                         "answers": {"text": [t], "answer_start": [s]}}) for i, t, s in rows]  # fmt: skip
    source = tmp_path / "off.jsonl"
    source.write_text("\n".join(lines) + "\n")
    named = f"{source}: line 2 question id b: answers[0].answer_start 12 points at 'he game.', not 'the game'"
    code, out, err = run_main(["data.py", "--convert", str(source), "--out", str(tmp_path / "off.json")])
    assert code == 0 and named in err and json.loads(out)["misplaced_answers"] == 1, err
    config = write_yaml(tiny_config(tiny_bert, tmp_path, train_file=str(source)), tmp_path / "c.yaml")
    code, out, err = run_main(["train.py", "--config", str(config), "--dry-run"])
    assert code == 0 and any(named in w for w in json.loads(out.splitlines()[-1])["warnings"]), out[-2000:]
