"""predict.py: answers from a checkpoint as the run's evaluation gave them, in fp32 and bf16, its
refusals, and a cluster checkpoint given by its UUID."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from extractive_qa.data import squad_files
from tests.support.cli_result import last_json
from tests.support.project import DEV_V1, ROOT, completed, run_cli, run_train, tiny_config, write_yaml


def _predict(*args: str) -> subprocess.CompletedProcess:
    return completed(["predict.py", *args])


def test_single_question_over_a_context_longer_than_one_window(trained) -> None:
    ckpt, _ = trained
    context = " ".join(["The stadium hosted many games over the years."] * 40) + " Denver won the title."
    out = _predict("--checkpoint", str(ckpt), "--question", "Who won the title?", "--context", context)
    assert out.returncode == 0, out.stderr
    result = last_json(out.stdout)
    assert set(result) == {"answer", "score", "start", "end"}
    assert context[result["start"] : result["end"]] == result["answer"] and result["answer"]
    assert 0 < result["score"] <= 1
    # a v1.1 checkpoint always answers: said once, with what the score is
    notes = [line for line in out.stderr.splitlines() if "always answers" in line]
    assert len(notes) == 1 and "`score` is the answer's probability among the candidate spans" in notes[0]


def test_predict_runs_without_determined(trained) -> None:
    """Answering needs torch + transformers only: importing Determined fails in this process."""
    ckpt, _ = trained
    argv = ["--checkpoint", str(ckpt), "--question", "Who won?", "--context", "Denver won the title."]
    program = (
        "import sys; sys.modules['determined'] = None; "  # any `import determined` now raises
        f"import predict; sys.exit(predict.main({argv!r}))"
    )
    cmd = [sys.executable, "-c", program]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert last_json(out.stdout)["answer"]


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("checkpoints/determined/UUID", "UUID stands for a checkpoint's directory name"),
        ("no-such-checkpoint", "no such directory ({cwd}/no-such-checkpoint)"),
        ("README.md", "{cwd}/README.md is a file, not a checkpoint directory"),
    ],
    ids=["placeholder", "missing", "a-file"],
)
def test_a_checkpoint_that_is_not_there_says_where_it_looked_and_what_to_run(given: str, said: str) -> None:
    """Before training, or with the README's UUID pasted as is: what was looked for, where, and
    the command that lists (or makes) a checkpoint."""
    out = _predict("--checkpoint", given, "--question", "q", "--context", "c")
    assert out.returncode == 2 and said.format(cwd=ROOT) in out.stderr, out.stderr
    assert "train.py --checkpoints" in out.stderr


def test_qa_settings_missing_a_key_is_a_clear_error(trained, tmp_path: Path) -> None:
    ckpt, _ = trained
    hf = tmp_path / "hf"
    shutil.copytree(ckpt / "hf", hf)
    settings = json.loads((hf / "qa_settings.json").read_text())
    del settings["doc_stride"]
    (hf / "qa_settings.json").write_text(json.dumps(settings))
    out = _predict("--checkpoint", str(hf), "--question", "q", "--context", "c")
    assert out.returncode == 2 and "missing doc_stride" in out.stderr, out.stderr


def test_batch_predictions_score_equal_to_the_trials_validation(trained, tmp_path: Path) -> None:
    ckpt, result = trained
    preds = tmp_path / "p.json"
    run_cli(["predict.py", "--checkpoint", str(ckpt / "hf"), "--squad", str(DEV_V1), "--out", str(preds)])
    metrics = run_cli(["-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(preds)])
    assert metrics["exact_match"] == result["exact_match"] and metrics["f1"] == result["f1"]


def test_bf16_predictions_score_equal_to_the_trials_validation(tiny_bert: Path, tmp_path: Path) -> None:
    """A bf16 run evaluates under bf16 autocast; predict.py computes the same way (from
    qa_settings.json), so its EM/F1 are the trial's. In fp32 they were not (F1 5.55 vs 5.79)."""
    from extractive_qa.serve.predictor import Predictor

    conf = tiny_config(tiny_bert, tmp_path)
    conf["hyperparameters"].update(precision="bf16", learning_rate=3e-3)
    path = write_yaml(conf, tmp_path / "exp.yaml")
    code, result, err = run_train(
        ["--config", str(path), "--checkpoint-dir", str(tmp_path / "ckpt"), "--batches", "20"]
    )
    assert code == 0, err
    hf = Path(result["checkpoint"]) / "hf"
    assert json.loads((hf / "qa_settings.json").read_text())["precision"] == "bf16"
    preds = tmp_path / "p.json"
    run_cli(["predict.py", "--checkpoint", str(hf), "--squad", str(DEV_V1), "--out", str(preds)])
    metrics = run_cli(["-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(preds)])
    assert metrics["exact_match"] == result["exact_match"] and metrics["f1"] == result["f1"]
    # The precision is what makes the difference: fp32 logits of the same weights differ.
    examples = squad_files.load_squad(DEV_V1, training=False).examples[:20]
    logits = {}
    for precision in ("bf16", "fp32"):
        predictor = Predictor(str(hf), "cpu", precision=precision)
        logits[precision] = predictor.logits(predictor.features(examples))[0]
    assert not (logits["bf16"] == logits["fp32"]).all()


def test_qa_settings_from_before_precision_was_saved_load_as_fp32(trained, tmp_path: Path) -> None:
    from extractive_qa.serve.predictor import Predictor

    ckpt, _ = trained
    hf = tmp_path / "hf"
    shutil.copytree(ckpt / "hf", hf)
    settings = json.loads((hf / "qa_settings.json").read_text())
    del settings["precision"], settings["tf32"]
    (hf / "qa_settings.json").write_text(json.dumps(settings))
    predictor = Predictor(str(hf), "cpu")
    assert (predictor.precision, predictor.settings.tf32) == ("fp32", True)
    out = _predict("--checkpoint", str(hf), "--question", "Who won?", "--context", "Denver won the title.")
    assert out.returncode == 0 and last_json(out.stdout)["answer"], out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--checkpoint", "/nope", "--question", "q", "--context", "c"], "no such directory"),
        (["--question", "q", "--context", "c"], "not a checkpoint of this project"),
        (["--question", " ", "--context", "c"], "must both be non-empty"),
        (["--squad", "/nope.json", "--out", "OUT/x.json"], "no such file"),
        (
            ["--checkpoint", "0b1c2d3e-0000-4000-8000-000000000000", "--question", "q", "--context", "c"],
            "DET_MASTER",
        ),
    ],
)
def test_predict_errors(args: list[str], message: str, trained, tmp_path: Path) -> None:
    ckpt, _ = trained
    if "--checkpoint" not in args:
        foreign = tmp_path if "--question" in args and args[1] == "q" else ckpt
        args = ["--checkpoint", str(foreign), *args]
    out = _predict(*(a.replace("OUT", str(tmp_path)) for a in args))
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_checkpoint_uuid_downloads_once_into_a_private_copy_and_a_short_one_is_refused(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """predict.py --checkpoint UUID with DET_MASTER set: Determined's SDK downloads the checkpoint
    (shared_fs, from an emulated master) into this user's private directory, and a later call
    answers from that copy (the storage's own is gone by then); a download short of what the
    master records is refused and leaves nothing behind."""
    import uuid

    from tests.support.det_master import Checkpoint, Master

    ckpt, _ = trained
    storage, private = tmp_path / "shared_fs", tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))  # where private_root() lives
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the SDK's login cache: this test's own
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    whole, short = str(uuid.uuid4()), str(uuid.uuid4())
    master = Master()
    master.checkpoint_storage = {"type": "shared_fs", "host_path": str(storage)}
    monkeypatch.setenv("DET_MASTER", master.url)
    try:
        for name in (whole, short):
            copy = shutil.copytree(ckpt, storage / name)
            resources = {
                str(p.relative_to(copy)): str(p.stat().st_size) for p in copy.rglob("*") if p.is_file()
            }
            if name == short:  # the master records more bytes than arrive
                resources["hf/model.safetensors"] = str(int(resources["hf/model.safetensors"]) + 1)
            master.checkpoints.append(Checkpoint(name, 6, {}, resources))
        question = ["--question", "Who won?", "--context", "Denver won the game."]
        first = _predict("--checkpoint", whole, *question)
        assert first.returncode == 0 and f"--checkpoint {whole}: downloaded" in first.stderr, first.stderr
        shutil.rmtree(storage / whole)
        again = _predict("--checkpoint", whole, *question)
        assert again.returncode == 0 and "the copy downloaded before" in again.stderr, again.stderr
        assert last_json(again.stdout) == last_json(first.stdout)
        refused = _predict("--checkpoint", short, *question)
        assert refused.returncode == 2 and "incomplete (hf/model.safetensors has" in refused.stderr
    finally:
        master.close()
    assert not master.errors, master.errors
    cache = private / f"extractive-qa-{os.getuid()}" / "checkpoints"
    kept = sorted(p.name for p in cache.iterdir())  # the whole one and its listing; nothing of the short one
    assert len(kept) == 2 and kept[0].endswith(f"-{whole}") and kept[1] == f"{kept[0]}.json", kept


def _tar(members: list[tuple[str, bytes | str]]) -> bytes:
    """A gzipped tar of (name, bytes) files and (name, target) symbolic links."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, body in members:
            info = tarfile.TarInfo(name)
            if isinstance(body, str):
                info.type, info.linkname = tarfile.SYMTYPE, body
                tar.addfile(info)
            else:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def test_a_download_through_the_master_never_writes_outside_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the storage cannot be reached from here, Determined's SDK unpacks the master's tar of
    the checkpoint. A member that climbs out (../), an absolute one, or a file under a link that
    points out never lands outside it: the command fails naming the checkpoint, and keeps nothing."""
    import uuid

    from tests.support.det_master import Checkpoint, Master

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    master = Master()
    master.checkpoint_storage = {"type": "shared_fs", "host_path": str(tmp_path / "not-mounted-here")}
    monkeypatch.setenv("DET_MASTER", master.url)
    outside = tmp_path / "outside"
    outside.mkdir()
    attacks = {
        "climbs": [("metadata.json", b"{}"), ("../../../../../outside/climbed", b"x")],
        "absolute": [("metadata.json", b"{}"), (str(outside / "absolute"), b"x")],
        "link": [("metadata.json", b"{}"), ("hf", str(outside)), ("hf/linked", b"x")],
    }
    try:
        for members in attacks.values():
            name = str(uuid.uuid4())
            master.checkpoints.append(Checkpoint(name, 6, {}, {}))
            master.proxied[name] = _tar(members)
            out = _predict("--checkpoint", name, "--question", "Who won?", "--context", "Denver won.")
            # refused, or (tarfile's filter strips an absolute name's "/") not a checkpoint
            assert out.returncode == 2 and f"error: --checkpoint {name}: " in out.stderr, (
                members,
                out.stderr,
            )
    finally:
        master.close()
    assert not [p for p in tmp_path.rglob("*") if p.name in ("climbed", "absolute", "linked")]
    assert list((private / f"extractive-qa-{os.getuid()}" / "checkpoints").iterdir()) == []
