"""Outputs and disk: no output lands on an input or in the upload, every output is checked
writable before any work, checkpoint storage is private and has room, a write that fails (a full
disk) names the file and leaves nothing partial, and a device or pipe is written through, never
replaced.

One idea: where a command's bytes land and what stays intact around them -- the refusals before
the work and the writes after it are the two halves of one promise.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from tests.support.project import ROOT, cli, run_main, run_train, trained_config

# --------------------------------------------------------------------------------------------
# Checkpoint storage: outside the upload, private, with room for one more.
# --------------------------------------------------------------------------------------------


def test_a_checkpoint_dir_inside_the_upload_is_refused_before_training(tmp_path: Path) -> None:
    import shutil

    inside = ROOT / "my-checkpoints"
    try:
        code, _, err = run_train(["--batches", "1", "--checkpoint-dir", str(inside)])
        assert code == 2 and "copied into themselves" in err and "Traceback" not in err, err
        assert not inside.exists()
    finally:  # without the check the run would fill the project with recursive copies
        shutil.rmtree(inside, ignore_errors=True)


def test_tensorboard_files_go_beside_the_checkpoints_not_into_the_project(trained) -> None:
    """A local run's TensorBoard event files land under --checkpoint-dir/tensorboard/, one folder
    per run; torch's default (`runs/` under the working directory, the project) filled the
    project with a folder per run."""
    checkpoint, _ = trained
    runs = list((checkpoint.parents[1] / "tensorboard").iterdir())
    assert len(runs) == 1 and list(runs[0].glob("events.out.tfevents.*")), runs


def test_outputs_that_cannot_be_written_are_refused_before_training(tmp_path: Path) -> None:

    code, _, err = run_train(
        ["--batches", "1", "--metrics-out", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c")]
    )
    assert code == 2 and "--metrics-out" in err and "is a directory" in err, err
    code, _, err = run_train(
        [
            "--batches",
            "1",
            "--metrics-out",
            str(tmp_path / "no" / "m.json"),
            "--checkpoint-dir",
            str(tmp_path / "c"),
        ]
    )
    assert code == 2 and "does not exist" in err, err
    (tmp_path / "file").write_text("x")
    code, _, err = run_train(["--batches", "1", "--checkpoint-dir", str(tmp_path / "file")])
    assert code == 2 and "--checkpoint-dir" in err and "is a file" in err, err


def test_partial_checkpoints_are_named_and_the_storage_is_not_world_writable(tmp_path: Path, caplog) -> None:
    from extractive_qa.launch.storage import prepare_local_storage

    base = tmp_path / "c" / "determined"
    base.mkdir(parents=True, mode=0o777)
    base.chmod(0o777)
    (base / "0a1b-cut-short").mkdir()
    with caplog.at_level("WARNING", logger="squad"):
        prepare_local_storage(tmp_path / "c")
    assert "0a1b-cut-short" in caplog.text and "partial checkpoint" in caplog.text
    assert base.stat().st_mode & 0o022 == 0


def test_stale_feature_cache_temp_dirs_are_removed_under_the_lock(tokenizer, tmp_path: Path) -> None:
    from extractive_qa.config.model_family import EMBEDDED_MODEL
    from extractive_qa.config.settings import WindowSpec
    from extractive_qa.data.feature_cache import features_fingerprint, prepare_features
    from extractive_qa.data.squad_files import load_squad
    from tests.support.project import DEV_V1

    squad = load_squad(DEV_V1, training=False)
    spec = WindowSpec(128, 32, 32)
    name = f"validation-{features_fingerprint(squad, EMBEDDED_MODEL, tokenizer, spec, 'validation')}"
    stale = tmp_path / f".{name}.crashed"
    stale.mkdir(parents=True)
    (stale / "input_ids.npy").write_bytes(b"\0" * 1000)
    prepare_features(squad, tokenizer, EMBEDDED_MODEL, spec, "validation", tmp_path)
    assert not stale.exists() and (tmp_path / name).is_dir()


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(trained, tmp_path: Path) -> None:
    import shutil

    from tests.support.project import DEV_V1

    checkpoint, _ = trained
    data = tmp_path / "dev.json"
    shutil.copy(DEV_V1, data)
    before = data.read_bytes()
    for out in (["--out", str(data)], ["--out-dir", str(tmp_path)]):
        if out[0] == "--out-dir":
            data = data.rename(tmp_path / "predictions.json")  # what --out-dir would write
        code, _, err = run_main(["predict.py", "--checkpoint", str(checkpoint), "--squad", str(data), *out])
        assert code == 2 and "is the input given as --squad" in err and "Traceback" not in err, err
        assert data.read_bytes() == before
    config = trained_config(checkpoint)
    kept = config.read_bytes()
    code, _, err = run_train(["--config", str(config), "--metrics-out", str(config), "--batches", "1",
                              "--checkpoint-dir", str(tmp_path / "c")])  # fmt: skip
    assert code == 2 and "--metrics-out" in err and "--config" in err
    assert config.read_bytes() == kept


def test_too_little_space_for_a_checkpoint_is_named_before_training(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import collections
    import shutil

    checkpoint, _ = trained
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 10**5, 10**5))
    code, _, err = run_train(["--config", str(trained_config(checkpoint)), "--batches", "2",
                              "--checkpoint-dir", str(tmp_path / "c")])  # fmt: skip
    assert code == 2 and "GB free" in err and "--checkpoint-dir" in err, err[-2000:]
    assert not list((tmp_path / "c" / "determined").glob("*-*-*"))  # nothing trained or written


def test_a_link_in_the_upload_into_the_checkpoints_is_refused_before_training(tmp_path: Path) -> None:
    """Determined copies the upload into every checkpoint following directory links: a link to
    the checkpoint directory would copy the checkpoint into itself after training."""
    import shutil

    project = tmp_path / "project"
    project.mkdir()
    needed = ("train.py", "model_def.py", "data.py", "local.yaml", ".detignore", "extractive_qa")
    needed += ("squad_data",)
    for path in (ROOT / name for name in needed):
        (shutil.copytree if path.is_dir() else shutil.copy)(path, project / path.name)
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    (project / "results").symlink_to(checkpoints, target_is_directory=True)
    code, _, err = cli(str(project / "train.py"), "--checkpoint-dir", str(checkpoints), "--batches", "1")
    assert code == 2 and "results" in err and "copy it into itself" in err, err[-2000:]
    assert "Traceback" not in err
    assert not (checkpoints / "determined").exists()


def test_a_full_disk_at_the_output_is_one_line_naming_the_file(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import errno
    import os

    import predict
    from tests.support.project import DEV_V1

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "preds.json"
    code = predict.main(["--checkpoint", str(trained[0]), "--squad", str(DEV_V1), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot write {out}: No space left on device" in err, err[-2000:]
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []  # no partial file


def test_a_checkpoint_write_that_fails_says_where_why_and_what_the_run_reached(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.save's zip writer fails on a full disk with "unexpected pos" and no reason; the
    run ends with one line naming the directory, the space left and the scores it reached."""
    import torch

    def full_disk(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4096 vs 4000")

    monkeypatch.setattr(torch, "save", full_disk)
    code, _, err = run_train(["--config", str(trained_config(trained[0])), "--batches", "2",
                              "--checkpoint-dir", str(tmp_path / "c")])  # fmt: skip
    assert code == 2 and "writing a checkpoint after 2 batches failed" in err, err[-2000:]
    assert "GB free" in err and "f1" in err and "--resume auto" in err and "Traceback" not in err


# --------------------------------------------------------------------------------------------
# No output on an input: one check for every writer, links resolved to the end.
# --------------------------------------------------------------------------------------------


def test_no_writer_replaces_a_file_of_the_checkpoint_it_reads(trained, tmp_path: Path) -> None:
    """predict.py --out inside the checkpoint it answers with, train.py --metrics-out onto the
    checkpoint it resumes: refused before any work, the checkpoint byte for byte as it was."""
    import hashlib
    import shutil

    checkpoint = tmp_path / "ck"
    shutil.copytree(trained[0], checkpoint)

    def digest() -> str:
        files = sorted(p for p in checkpoint.rglob("*") if p.is_file())
        return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()

    before = digest()
    question = ["--question", "Who won?", "--context", "Denver won."]
    squad = ["--squad", str(ROOT / "squad_data" / "dev-v1.1-excerpt.json")]
    for target in ("hf/model.safetensors", "hf/qa_settings.json"):
        out = ["--out", str(checkpoint / target)]
        code, _, err = run_main(["predict.py", "--checkpoint", str(checkpoint), *squad, *out])
        assert code == 2 and "which this command reads (--checkpoint)" in err, err
    code, _, err = run_main(["predict.py", "--checkpoint", str(checkpoint / "hf"), *question])
    assert code == 0, err  # the checkpoint still answers
    code, _, err = run_train(["--config", str(trained_config(trained[0])), "--resume", str(checkpoint),
                              "--batches", "8", "--checkpoint-dir", str(tmp_path / "c"),
                              "--metrics-out", str(checkpoint / "metadata.json")])  # fmt: skip
    assert code == 2 and "--metrics-out" in err and "--resume" in err, err[-2000:]
    assert digest() == before


def test_outputs_never_land_in_the_upload_nor_over_another_directory(trained, tmp_path: Path) -> None:
    """export.py --out . would replace the project's README and upload the models with every
    experiment; --out DIR holding a user's files would mix ours in; data.py --convert --out
    squad_data/local-train-v1.1.json would replace the embedded default's data. Each refused before
    any work, naming the flag."""
    pytest.importorskip("onnxruntime")
    readme = (ROOT / "README.md").read_bytes()
    code, _, err = run_main(["export.py", "--checkpoint", str(trained[0]), "--out", str(ROOT)])
    assert code == 2 and "already holds files" in err, err
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")
    code, _, err = run_main(["export.py", "--checkpoint", str(trained[0]), "--out", str(theirs)])
    assert code == 2 and "config.json" in err and (theirs / "config.json").read_text() == "{}", err
    code, _, err = run_main(["export.py", "--checkpoint", str(trained[0]), "--out", str(ROOT / "served")])
    assert code == 2 and "inside the project directory" in err and not (ROOT / "served").exists(), err
    dev = str(ROOT / "squad_data" / "dev-v1.1-excerpt.json")
    train = ROOT / "squad_data" / "local-train-v1.1.json"
    kept = train.read_bytes()
    code, _, err = run_main(["data.py", "--convert", dev, "--out", str(train)])
    assert code == 2 and "inside the project directory" in err and train.read_bytes() == kept, err
    assert (ROOT / "README.md").read_bytes() == readme


def test_an_output_in_the_upload_is_refused_for_being_there_whatever_its_name(
    trained, tmp_path: Path
) -> None:
    """predict.py --out preds.json passed (.detignore named it) where preds2.json was refused, and
    data.py --convert wrote a new train.jsonl into the upload, to travel with every experiment.
    Now both names are refused alike, and the directories .detignore leaves out take outputs."""
    dev = str(ROOT / "squad_data" / "dev-v1.1-excerpt.json")
    for name in ("preds.json", "preds2.json"):
        asked = ["predict.py", "--checkpoint", str(trained[0]), "--squad", dev, "--out", str(ROOT / name)]
        code, _, err = run_main(asked)
        assert code == 2 and "inside the project directory" in err and not (ROOT / name).exists(), err
    code, _, err = run_main(["data.py", "--convert", dev, "--out", str(ROOT / "train.jsonl")])
    assert code == 2 and "inside the project directory" in err and not (ROOT / "train.jsonl").exists(), err
    converted = ROOT / "squad_data" / f"converted-{tmp_path.name}.jsonl"
    try:
        assert run_main(["data.py", "--convert", dev, "--out", str(converted)])[0] == 0
    finally:
        converted.unlink(missing_ok=True)


def test_a_link_in_hf_is_refused_by_the_export_not_copied(trained, tmp_path: Path) -> None:
    """A link planted in hf/ to another file (a 0600 secret), under a name the export copies
    (vocab.txt), is not followed into the export; under any other name it is not read at all."""
    import shutil

    pytest.importorskip("onnxruntime")
    checkpoint = tmp_path / "ck"
    shutil.copytree(trained[0], checkpoint)
    secret = tmp_path / "secret"
    secret.write_text("key")
    secret.chmod(0o600)
    (checkpoint / "hf" / "notes.txt").symlink_to(secret)
    (checkpoint / "hf" / "vocab.txt").symlink_to(secret)
    code, _, err = run_main(["export.py", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out")])
    assert code == 2 and "vocab.txt" in err and "not a plain file" in err, err
    assert not (tmp_path / "out" / "vocab.txt").exists()
    (checkpoint / "hf" / "vocab.txt").unlink()
    code, _, err = run_main(["export.py", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out"),
                             "--no-int8", "--check-questions", "4"])  # fmt: skip
    assert code == 0 and not (tmp_path / "out" / "notes.txt").exists(), err[-2000:]


@pytest.mark.cluster_stack
def test_copies_keep_a_narrower_mode_and_checkpoint_files_share_one(trained, tmp_path: Path) -> None:
    import stat

    from extractive_qa.io.files import copy_plain_file

    private = tmp_path / "private"
    private.write_text("x")
    private.chmod(0o600)
    copy_plain_file(private, tmp_path / "copy")
    assert stat.S_IMODE((tmp_path / "copy").stat().st_mode) == 0o600
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (trained[0] / "hf").iterdir()}
    assert len(set(modes.values())) == 1, modes  # model.safetensors as readable as the rest


def test_a_link_two_hops_from_the_upload_into_the_checkpoints_is_refused(tmp_path: Path) -> None:
    """project/lnk -> /x/hop and /x/hop/ck -> the checkpoints: Determined's copy follows both."""
    from extractive_qa.errors import ConfigError
    from extractive_qa.launch.storage import check_upload_links

    project, hop, checkpoints = tmp_path / "project", tmp_path / "hop", tmp_path / "ckpt"
    for folder in (project, hop, checkpoints):
        folder.mkdir()
    (project / "lnk").symlink_to(hop, target_is_directory=True)
    check_upload_links(project, checkpoints)  # one hop to a harmless folder: fine
    (hop / "ck").symlink_to(checkpoints, target_is_directory=True)
    with pytest.raises(ConfigError, match="lnk: a link that leads to .*ckpt"):
        check_upload_links(project, checkpoints)
    (hop / "ck").unlink()
    (hop / "up").symlink_to(tmp_path, target_is_directory=True)  # and back over the project
    with pytest.raises(ConfigError, match="the project itself"):
        check_upload_links(project, checkpoints)


def test_a_forged_feature_cache_is_rebuilt_not_trained_on(tokenizer, tmp_path: Path, caplog) -> None:
    """A cache entry rewritten whole -- arrays and their SHA-256 records together -- with token ids
    beyond the vocabulary passes the integrity records; the arrays' own check rebuilds it."""
    import hashlib
    import json

    import numpy as np

    from extractive_qa.config.model_family import EMBEDDED_MODEL
    from extractive_qa.config.settings import WindowSpec
    from extractive_qa.data.feature_cache import prepare_features
    from extractive_qa.data.squad_files import load_squad
    from tests.support.project import DEV_V1

    squad = load_squad(DEV_V1, training=False)
    spec = WindowSpec(128, 32, 32)
    built, _ = prepare_features(squad, tokenizer, EMBEDDED_MODEL, spec, "validation", tmp_path)
    original = np.array(built.input_ids)  # the entry's file is about to change under the memory map
    entry = next(p for p in tmp_path.iterdir() if p.name.startswith("validation-") and p.is_dir())
    forged = original.copy()
    forged[0, 1] = len(tokenizer) + 5
    np.save(entry / "input_ids.npy", forged, allow_pickle=False)
    meta = json.loads((entry / "meta.json").read_text())
    meta["arrays"]["input_ids"]["sha256"] = hashlib.sha256((entry / "input_ids.npy").read_bytes()).hexdigest()
    (entry / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level("WARNING", logger="squad"):
        features, state = prepare_features(squad, tokenizer, EMBEDDED_MODEL, spec, "validation", tmp_path)
    assert state == "rebuilt" and "outside the tokenizer" in caplog.text
    assert np.array_equal(features.input_ids, original)


def test_no_output_lands_inside_another_checkpoint_or_through_a_link(trained, tmp_path: Path) -> None:
    """predict.py --out onto another checkpoint's hf/qa_settings.json, train.py --metrics-out onto
    another checkpoint's metadata.json, and an output that is a link: each refused before any
    work, the other checkpoint unchanged (files.check_outputs: checkpoint_holding, the link rule)."""
    import shutil

    checkpoint, _ = trained
    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    settings, metadata = other / "hf" / "qa_settings.json", other / "metadata.json"
    before = settings.read_bytes(), metadata.read_bytes()
    code, _, err = run_main(["predict.py", "--checkpoint", str(checkpoint), "--squad",
                             "squad_data/dev-v1.1-excerpt.json", "--out", str(settings)])  # fmt: skip
    assert code == 2 and "a checkpoint or export this command did not make" in err, err
    config = str(trained_config(checkpoint))
    code, _, err = run_train(["--config", config, "--batches", "1", "--checkpoint-dir", str(tmp_path / "c"),
                              "--metrics-out", str(metadata)])  # fmt: skip
    assert code == 2 and "a checkpoint or export this command did not make" in err, err
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    link = str(tmp_path / "link.json")
    code, _, err = run_main(["predict.py", "--checkpoint", str(checkpoint), "--squad",
                             "squad_data/dev-v1.1-excerpt.json", "--out", link])  # fmt: skip
    assert code == 2 and "is a symbolic link" in err and not (tmp_path / "elsewhere.json").exists()
    assert (settings.read_bytes(), metadata.read_bytes()) == before


def test_scaling_local_out_follows_the_writers_rules(tmp_path: Path) -> None:
    """scaling.py local --out had no check: it replaced a user's report.md (then, as a name it
    writes, still did where nothing else lay beside it), followed a report.json link onto another
    file, and with --out = the project wrote configs/ into the upload. A directory an earlier
    `local` filled carries its marker and is taken again."""
    from extractive_qa.scaling_report import check_report_outputs
    from extractive_qa.scaling_runs import LOCAL_MARKER

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    local = ["scaling.py", "local", "--config", "local.yaml", "--slots", "1", "--batches", "1"]
    code, _, err = run_main([*local, "--out", str(mine)])
    assert code == 2 and "did not write (report.md)" in err, err
    (mine / LOCAL_MARKER).write_text("{}")  # as an earlier `local` leaves it
    check_report_outputs("local", mine, ROOT / "local.yaml")
    (mine / LOCAL_MARKER).unlink()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "report.json").symlink_to(tmp_path / "precious.json")
    code, _, err = run_main([*local, "--out", str(linked)])
    assert code == 2 and "is a symbolic link" in err, err
    code, _, err = run_main([*local, "--out", str(ROOT)])
    assert code == 2 and "project directory" in err, err
    assert (mine / "report.md").read_text() == "my notes" and not (ROOT / "configs").exists()


def test_files_the_checkpoint_copy_cannot_copy_are_named_before_training(tmp_path: Path, caplog) -> None:
    """A dangling link or a pipe in the project made Determined's copy of it into the first
    checkpoint raise shutil.Error after training (the state lost). Refused before training; and
    should one break during training, the checkpoint keeps its state and names the file."""
    import os

    from extractive_qa import det_internals
    from extractive_qa.errors import ConfigError
    from extractive_qa.launch.storage import check_upload_links

    project, checkpoints = tmp_path / "project", tmp_path / "ckpt"
    project.mkdir()
    checkpoints.mkdir()
    (project / "model_def.py").write_text("# the trial\n")
    check_upload_links(project, checkpoints)
    (project / "mydata").symlink_to("/nonexistent/unmounted")
    with pytest.raises(ConfigError, match="mydata: a link to /nonexistent/unmounted, which does not exist"):
        check_upload_links(project, checkpoints)
    (project / "mydata").unlink()
    os.mkfifo(project / "pipe")
    with pytest.raises(ConfigError, match="pipe: a pipe, socket or device"):
        check_upload_links(project, checkpoints)
    (project / "pipe").unlink()
    (project / "mydata").symlink_to("/nonexistent/unmounted")  # broken after the check
    from determined import util

    here = Path.cwd()
    os.chdir(project)
    try:
        with det_internals.code_copy_that_keeps_the_state(), caplog.at_level("WARNING", logger="squad"):
            util.write_user_code(tmp_path / "checkpoint", False)
    finally:
        os.chdir(here)
    assert (tmp_path / "checkpoint" / "code" / "model_def.py").is_file()
    assert "mydata" in caplog.text and "the trained state is saved" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="making a character device needs root")
def test_an_output_onto_a_device_or_a_pipe_writes_through_and_a_replaced_file_keeps_its_mode(
    tmp_path: Path,
) -> None:
    """data.py --convert onto a character device (a /dev/null made here: renaming over the real
    one as root would replace it) and onto a FIFO a reader waits on: the device stays a device, the
    reader gets the file; an existing 0600 file is replaced with its mode kept."""
    dev_v1 = str(ROOT / "squad_data" / "dev-v1.1-excerpt.json")
    null = tmp_path / "null.jsonl"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    code, _, err = run_main(["data.py", "--convert", dev_v1, "--out", str(null)])
    assert code == 0 and stat.S_ISCHR(null.stat().st_mode), err
    fifo, received = tmp_path / "pipe.jsonl", []
    os.mkfifo(fifo)
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    code, _, err = run_main(["data.py", "--convert", dev_v1, "--out", str(fifo)])
    reader.join(timeout=60)
    assert code == 0 and stat.S_ISFIFO(fifo.stat().st_mode), err
    kept = tmp_path / "kept.jsonl"
    kept.write_text("old")
    kept.chmod(0o600)
    code, _, err = run_main(["data.py", "--convert", dev_v1, "--out", str(kept)])
    assert code == 0 and stat.S_IMODE(kept.stat().st_mode) == 0o600, err
    assert received == [kept.read_bytes()] and received[0].count(b"\n") > 100


def test_predict_out_dir_replaces_only_what_it_wrote_there(trained, tmp_path: Path) -> None:
    """A directory holding a user's predictions.json (named like predict.py's output, not written
    by it) was filled over; now only a directory predict.py marked (predict.json) is its own."""
    squad = json.loads((ROOT / "squad_data" / "dev-v1.1-excerpt.json").read_text())
    paragraph = squad["data"][0]["paragraphs"][0]
    paragraph["qas"] = paragraph["qas"][:2]
    squad["data"] = [{**squad["data"][0], "paragraphs": [paragraph]}]
    dev = tmp_path / "two-questions.json"
    dev.write_text(json.dumps(squad))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "predictions.json").write_text('{"mine": "keep"}')
    asked = ["predict.py", "--checkpoint", str(trained[0]), "--squad", str(dev)]
    code, _, err = run_main([*asked, "--out-dir", str(theirs)])
    assert code == 2 and "predictions.json" in err, err
    assert (theirs / "predictions.json").read_text() == '{"mine": "keep"}'
    ours = tmp_path / "ours"
    for _ in range(2):  # an earlier run's directory is its own to fill again
        code, _, err = run_main([*asked, "--out-dir", str(ours)])
        assert code == 0, err
    assert json.loads((ours / "predict.json").read_text())["written_by"] == "predict.py"
