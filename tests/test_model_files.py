"""A model directory goes through the one reader (extractive_qa/io/model_files.py): transformers builds
the model from a config and tensors the reader read, and is never handed the directory itself --
neither the pretrained model a run trains from nor the checkpoint predict.py and export.py load."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from extractive_qa.config.model_family import qa_model_class
from extractive_qa.io import model_files, reading
from extractive_qa.trial import model_io
from tests.support.project import run_main, run_train, tiny_config, write_yaml

pytestmark = pytest.mark.cluster_stack  # how from_pretrained matches given tensors is transformers'
ONE_LAYER = {"model_type": "bert", "num_hidden_layers": 1}  # a config.json for a file of a few tensors


def _spy_on_transformers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths transformers is asked to load a model or a config from: every from_pretrained of
    a model, and every config it reads, pass through these two class methods."""
    import transformers

    asked: list[str] = []
    for owner, name in ((transformers.PreTrainedModel, "from_pretrained"),
                        (transformers.PretrainedConfig, "get_config_dict")):  # fmt: skip
        real = owner.__dict__[name].__func__

        def spy(cls: type, source: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            asked.append(str(source))
            return _real(cls, source, *args, **kwargs)

        monkeypatch.setattr(owner, name, classmethod(spy))
    return asked


def test_transformers_is_never_handed_a_model_directory(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Train from a local directory, resume it, answer from the checkpoint and export it (where
    ONNX is installed): no path transformers is asked to load from lies in the model or a
    checkpoint."""
    model = shutil.copytree(tiny_bert, tmp_path / "model")
    asked = _spy_on_transformers(monkeypatch)
    config = write_yaml(tiny_config(model, tmp_path), tmp_path / "exp.yaml")
    train = ["--config", str(config), "--checkpoint-dir", str(tmp_path / "ck")]
    code, result, err = run_train([*train, "--batches", "2"])
    assert code == 0, err[-2000:]
    code, result, err = run_train([*train, "--batches", "4", "--resume", result["checkpoint"]])
    assert code == 0, err[-2000:]
    checkpoint = result["checkpoint"]
    question = ["--question", "Who won?", "--context", "Denver won the game."]
    code, _, err = run_main(["predict.py", "--checkpoint", checkpoint, *question])
    assert code == 0, err[-2000:]
    if importlib.util.find_spec("onnxruntime"):
        export = ["--out", str(tmp_path / "export"), "--check-questions", "4", "--no-int8"]
        code, _, err = run_main(["export.py", "--checkpoint", checkpoint, *export])
        assert code == 0, err[-2000:]
    handed = [path for path in asked if path.startswith(str(tmp_path))]
    assert not handed, f"transformers opened these itself: {handed}"
    assert "None" in asked  # the model was built: from objects, not a path


def test_a_pretrained_model_loads_as_from_its_files_with_the_same_head_draw(tiny_bert: Path) -> None:
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(3)
    from_files = AutoModelForQuestionAnswering.from_pretrained(tiny_bert)
    torch.manual_seed(3)
    loaded, _, warnings = model_io.load_qa_model(str(tiny_bert))
    assert warnings == [] and type(loaded) is type(from_files)
    expected = from_files.state_dict()
    assert all(torch.equal(t, expected[k]) for k, t in loaded.state_dict().items())
    same_name = {"_name_or_path": ""}
    assert loaded.config.to_dict() | same_name == from_files.config.to_dict() | same_name


def test_sharded_weights_load_from_every_shard_their_index_names(tiny_bert: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForQuestionAnswering

    whole = AutoModelForQuestionAnswering.from_pretrained(tiny_bert)
    whole.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    loaded, summary, _ = model_io.load_qa_model(str(tmp_path / "sharded"))
    assert summary == "QA head from the checkpoint"
    assert all(torch.equal(t, whole.state_dict()[k]) for k, t in loaded.state_dict().items())
    index = tmp_path / "sharded" / model_files.WEIGHTS_INDEX
    raw = json.loads(index.read_text())
    for weight_map in ({"x": "../elsewhere.safetensors"}, {"x": ".."}, {"x": 1, "y": "a"}, {"x": []}):
        index.write_text(json.dumps({**raw, "weight_map": weight_map}))
        with pytest.raises(reading.UnreadableFile, match="shard files in this directory"):
            model_io.load_qa_model(str(tmp_path / "sharded"))


def test_weights_over_what_the_model_can_hold_are_refused_by_name_before_a_read(
    tiny_bert: Path, tmp_path: Path
) -> None:
    model = shutil.copytree(tiny_bert, tmp_path / "model")
    with open(model / "model.safetensors", "r+b") as f:
        f.truncate(256 * reading.MIB)  # sparse: costs nothing unless read; this model needs < 1 MiB
    over = r"model\.safetensors: is 256\.0 MiB; more than a model weights"
    with pytest.raises(reading.UnreadableFile, match=over):
        model_io.load_qa_model(str(model))


def test_a_config_deeper_than_its_weights_is_refused_before_a_model_is_built(
    tiny_bert: Path, trained, tmp_path: Path
) -> None:
    """num_hidden_layers: 1000000 built a model of a million layers on the meta device (minutes,
    gigabytes) before the weights were compared; now the count of the weights' tensors bounds it,
    for the model a run trains from and for the checkpoint predict.py answers from."""
    checkpoint, _ = trained
    model, hf = (
        shutil.copytree(tiny_bert, tmp_path / "model"),
        shutil.copytree(checkpoint, tmp_path / "ck") / "hf",
    )
    for directory in (model, hf):
        raw = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 1_000_000}))
    deeper = "num_hidden_layers is 1,000,000, more layers than its weights hold tensors"
    config = write_yaml(tiny_config(model, tmp_path), tmp_path / "exp.yaml")
    code, _, err = run_train(
        ["--config", str(config), "--checkpoint-dir", str(tmp_path / "c"), "--batches", "1"]
    )
    assert code == 2 and deeper in err and "model/config.json" in err, err[-2000:]
    code, _, err = run_main(
        ["predict.py", "--checkpoint", str(hf.parent), "--question", "Who?", "--context", "Al."]
    )
    assert code == 2 and deeper in err and "hf/config.json" in err, err[-2000:]


def test_pickled_weights_alone_are_refused_naming_the_file(tiny_bert: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = shutil.copytree(tiny_bert, tmp_path / "model")
    torch.save(load_file(model / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    with pytest.raises(reading.UnreadableFile, match=r"pickled weights \(pytorch_model\.bin\) only"):
        model_io.load_qa_model(str(model))


def test_a_config_of_a_model_transformers_lacks_is_named_when_the_run_is_planned(
    tiny_bert: Path, tmp_path: Path
) -> None:
    model = shutil.copytree(tiny_bert, tmp_path / "model")
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, "model_type": "remote-only", "auto_map": {}}))
    unknown = r"config\.json: model_type 'remote-only' is not a model"
    with pytest.raises(reading.UnreadableFile, match=unknown):
        qa_model_class(str(model))


def test_each_dtype_reads_as_safetensors_writes_it_and_a_file_must_be_tiled_by_its_tensors(
    tmp_path: Path,
) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    written = {
        "f32": torch.randn(3, 5),
        "bf16": torch.randn(7).to(torch.bfloat16),
        "f16": torch.randn(2, 2).half(),
        "f64": torch.randn(1, dtype=torch.float64),
        "i64": torch.arange(4),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(1.5),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "model.safetensors"
    save_file(written, path)

    def read() -> dict[str, torch.Tensor]:
        with model_files.opened_model(tmp_path, "write it again", raw=ONE_LAYER) as (_, w):
            return model_files.read_weights(w, torch.nn.Linear(2, 2), "write it again")

    got = read()  # (over what a model may hold: test_weights_over_what_the_model_can_hold_...)
    assert got.keys() == written.keys()
    assert all(got[k].dtype == t.dtype and torch.equal(got[k], t) for k, t in written.items())
    with open(path, "ab") as f:
        f.write(b"\0" * 8)  # bytes no tensor claims
    with pytest.raises(reading.UnreadableFile, match="holds 8 bytes after its last tensor; write it again"):
        read()


def test_a_tensor_in_two_shards_is_refused_naming_it(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = tmp_path / "model"
    model.mkdir()
    save_file({"a": torch.zeros(2)}, model / "one.safetensors")
    save_file({"a": torch.ones(2)}, model / "two.safetensors")
    weight_map = {"a": "one.safetensors", "b": "two.safetensors"}
    (model / model_files.WEIGHTS_INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(reading.UnreadableFile, match=r"two\.safetensors: holds 'a' again"):
        with model_files.opened_model(model, "save it again", raw=ONE_LAYER) as (_, weights):
            model_files.read_weights(weights, torch.nn.Linear(2, 2), "save it again")


def test_each_file_of_a_model_directory_is_read_once(
    tiny_bert: Path, trained, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answering from a checkpoint and loading the model a run trains from open each file of the
    model directory once: config.json is read once -- the position check, the model and the
    tokenizer's private copy take those bytes -- and each weights file's header and tensors come
    from one open file (before: config.json was read three times, the weights twice)."""
    from extractive_qa.serve.predictor import Predictor

    checkpoint, _ = trained
    opened: list[str] = []
    real = reading.open_regular

    def counted(path: Path | str, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(reading, "open_regular", counted)
    Predictor(str(checkpoint), device="cpu")
    model_io.load_qa_model(str(tiny_bert))
    for directory in (checkpoint / "hf", tiny_bert):
        names = [Path(p).name for p in opened if Path(p).parent == directory]
        assert "config.json" in names and "model.safetensors" in names, opened
        again = sorted({name for name in names if names.count(name) > 1})
        assert not again, f"{directory}: opened more than once: {again}"
