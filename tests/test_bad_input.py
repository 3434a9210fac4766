"""Bad and hostile input: every malformed config, path and file ends in a message that names the
field or file and says what to do (exit 2), before any work -- never a traceback, never a
trained or written byte. Table-driven: each probe is a change to local.yaml run through
`train.py --dry-run` (or the real run, for what only the run checks)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from extractive_qa.config import experiment
from tests.support.project import ROOT

BASE = experiment.load_yaml(ROOT / "local.yaml")


# --------------------------------------------------------------------------------------------
# Configs: each probe a change to local.yaml, refused by the dry run or the run.
# --------------------------------------------------------------------------------------------


def asha(**searcher: Any) -> dict[str, Any]:
    conf = experiment.load_yaml(ROOT / "search.yaml")
    conf["searcher"].update(searcher)
    return conf


def changed(path: str, value: Any, conf: dict[str, Any] | None = None) -> dict[str, Any]:
    """local.yaml (or `conf`) with the dotted `path` set to `value` (None: removed)."""
    out = copy.deepcopy(conf if conf is not None else BASE)
    *parents, last = path.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return out


def lr_space(spec: dict[str, Any]) -> dict[str, Any]:
    return changed("hyperparameters.learning_rate", spec)


def hp(name: str, value: Any) -> dict[str, Any]:
    return changed(f"hyperparameters.{name}", {"type": "const", "val": value})


# (probe id) -> (config, a string the error must contain)
PROBES: dict[str, tuple[Any, str]] = {
    "slots-zero": (changed("resources.slots_per_trial", 0), "resources.slots_per_trial"),
    "slots-word": (changed("resources.slots_per_trial", "two"), "resources.slots_per_trial"),
    "slots-negative": (changed("resources.slots_per_trial", -2), "resources.slots_per_trial"),
    "slots-fraction": (changed("resources.slots_per_trial", 1.9), "resources.slots_per_trial"),
    "resources-list": (changed("resources", [1]), "resources"),
    "seed-word": (changed("reproducibility.experiment_seed", "abc"), "reproducibility.experiment_seed"),
    "seed-negative": (changed("reproducibility.experiment_seed", -1), "reproducibility.experiment_seed"),
    "reproducibility-number": (changed("reproducibility", 5), "reproducibility"),
    "scheduling-word": (changed("scheduling_unit", "often"), "scheduling_unit"),
    "scheduling-zero": (changed("scheduling_unit", 0), "scheduling_unit"),
    "length-zero": (hp("train_length", {"batches": 0}), "train_length"),
    "length-negative": (hp("train_length", {"epochs": -1}), "train_length"),
    "length-two-units": (hp("train_length", {"epochs": 1, "batches": 5}), "train_length"),
    "length-word": (hp("train_length", "long"), "train_length"),
    "asha-divisor-one": (asha(divisor=1), "searcher.divisor"),
    "asha-max-time-zero": (asha(max_time=0), "searcher.max_time"),
    "asha-max-trials-zero": (asha(max_trials=0), "searcher.max_trials"),
    "asha-max-rungs-zero": (asha(max_rungs=0), "searcher.max_rungs"),
    "asha-mode": (asha(mode="wild"), "searcher.mode"),
    "asha-time-metric": (asha(time_metric="seconds"), "searcher.time_metric"),
    "searcher-name": (changed("searcher.name", "bogus"), "searcher.name"),
    "searcher-no-name": (changed("searcher.name", None), "searcher.name"),
    "searcher-no-metric": (changed("searcher.metric", None), "searcher.metric"),
    "searcher-list": (changed("searcher", ["single"]), "searcher"),
    "categorical-no-vals": (lr_space({"type": "categorical"}), "learning_rate"),
    "categorical-empty": (
        changed("hyperparameters.learning_rate", {"type": "categorical", "vals": []}),
        "learning_rate",
    ),
    "range-inverted": (
        changed("hyperparameters.learning_rate", {"type": "double", "minval": 1e-3, "maxval": 1e-5}),
        "learning_rate",
    ),
    "range-under-single": (
        changed("hyperparameters.learning_rate", {"type": "double", "minval": 1e-5, "maxval": 1e-3}),
        "searcher",
    ),
    "hp-type-unknown": (lr_space({"type": "uniform", "val": 1}), "learning_rate"),
    "hyperparameters-list": (changed("hyperparameters", [1, 2]), "hyperparameters"),
    "optimizations-number": (changed("optimizations", 5), "optimizations"),
    "aggregation-bool": (changed("optimizations.aggregation_frequency", True), "aggregation_frequency"),
    "aggregation-zero": (changed("optimizations.aggregation_frequency", 0), "aggregation_frequency"),
    "compression-word": (changed("optimizations.gradient_compression", "yes"), "gradient_compression"),
    "average-number": (
        changed("optimizations.average_aggregated_gradients", 3),
        "average_aggregated_gradients",
    ),
    "optimizations-typo": (changed("optimizations.agregation_frequency", 2), "agregation_frequency"),
    "profiling-bool": (changed("profiling", True), "profiling"),
    "profiling-enabled-word": (changed("profiling.enabled", "sure"), "profiling.enabled"),
    "top-level-typo": (changed("min_validaton_period", {"epochs": 1}), "min_validaton_period"),
    "validation-negative": (changed("min_validation_period", {"batches": -5}), "min_validation_period"),
    "validation-unit": (changed("min_validation_period", {"seconds": 5}), "min_validation_period"),
    "checkpoint-period-number": (changed("min_checkpoint_period", 7), "min_checkpoint_period"),
    "checkpoint-policy": (changed("checkpoint_policy", "sometimes"), "checkpoint_policy"),
    "metric-never-reported": (changed("searcher.metric", "accuracy"), "searcher.metric: 'accuracy'"),
    "metric-of-v2-on-v1": (changed("searcher.metric", "best_f1"), "SQuAD 1.1 validation"),
    "env-vars-map": (changed("environment.environment_variables", {"A": 1}), "environment_variables.A"),
    "env-vars-no-equals": (changed("environment.environment_variables", ["A"]), "NAME=VALUE"),
    "initial-validation-word": (changed("perform_initial_validation", "yes"), "perform_initial_validation"),
    "max-restarts-negative": (changed("max_restarts", -1), "max_restarts"),
    "records-negative": (changed("records_per_epoch", -3), "records_per_epoch"),
    "lr-negative": (hp("learning_rate", -1), "learning_rate"),
    "lr-zero": (hp("learning_rate", 0), "learning_rate: must be > 0"),
    "lr-word": (hp("learning_rate", "fast"), "learning_rate"),
    "lr-infinite": (hp("learning_rate", float("inf")), "learning_rate"),
    "batch-zero": (hp("global_batch_size", 0), "global_batch_size"),
    "batch-indivisible": (changed("resources.slots_per_trial", 3), "global_batch_size"),
    "warmup-above-one": (hp("warmup_ratio", 1.5), "warmup_ratio"),
    "weight-decay-negative": (hp("weight_decay", -1), "weight_decay"),
    "optimizer": (hp("optimizer", "sgd"), "optimizer"),
    "lr-scaling": (hp("lr_scaling", "cubic"), "lr_scaling"),
    "batching": (hp("batching", "weird"), "batching"),
    "precision": (hp("precision", "fp8"), "precision"),
    "attention": (hp("attn_implementation", "flashy"), "attn_implementation"),
    "hp-typo": (hp("learnin_rate", 1e-4), "learnin_rate"),
    "data-list": (changed("data", ["x"]), "data"),
    "data-typo": (changed("data.max_seq_len", 128), "max_seq_len"),
    "squad-version": (changed("data.squad_version", "3.0"), "squad_version"),
    "seq-zero": (changed("data.max_seq_length", 0), "max_seq_length"),
    "stride-word": (changed("data.doc_stride", "x"), "doc_stride"),
    "stride-above-window": (changed("data.doc_stride", 256), "doc_stride"),
    "query-above-window": (changed("data.max_query_length", 300), "max_query_length"),
    "seq-above-model-positions": (changed("data.max_seq_length", 100000), "max_seq_length"),
    "nbest-zero": (changed("data.n_best_size", 0), "n_best_size"),
    "eval-batch-zero": (changed("data.eval_batch_size", 0), "eval_batch_size"),
    "workers-negative": (changed("data.num_workers", -1), "num_workers"),
    "train-file-number": (changed("data.train_file", 5), "train_file"),
    "timeout-word": (
        changed("environment", {"environment_variables": ["SQUAD_COLLECTIVE_TIMEOUT_S=soon"]}),
        "SQUAD_COLLECTIVE_TIMEOUT_S",
    ),
    "deep-nesting": ("hyperparameters: " + "[" * 5000 + "]" * 5000, "deep-nesting.yaml"),
    "huge-int": ("scheduling_unit: " + "9" * 5000 + "\n", "huge-int.yaml"),
    "not-a-mapping": ("- just\n- a list\n", "mapping"),
    "broken-yaml": ("name: [unclosed\n", "YAML"),
    "empty-file": ("", "mapping"),
}


def dry_run(config: Path, *extra: str) -> tuple[int, str, str]:
    import train

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = train.main(["--config", str(config), "--dry-run", *extra])
        except SystemExit as stop:  # argparse's own exit for bad flags
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def write_probe(conf: Any, path: Path) -> Path:
    if isinstance(conf, str):
        path.write_text(conf)
    else:  # JSON is YAML (and keeps inf, which the master's JSON would refuse too)
        path.write_text(json.dumps(conf))
    return path


def test_there_are_sixty_probes_or_more() -> None:
    assert len(PROBES) >= 60


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_each_malformed_config_is_a_named_error_in_the_dry_run(probe: str, tmp_path: Path) -> None:
    conf, needle = PROBES[probe]
    path = write_probe(conf, tmp_path / f"{probe}.yaml")
    code, out, err = dry_run(path)
    assert code == 2, f"{probe}: exit {code}, stdout {out[-300:]!r}, stderr {err[-500:]!r}"
    assert "Traceback" not in err and needle in err, f"{probe}: {err[-800:]!r}"
    assert out == ""  # no plan printed for a config that cannot run


def test_every_shipped_yaml_passes() -> None:
    for name in sorted(p.name for p in ROOT.glob("*.yaml")):
        code, _, err = dry_run(ROOT / name)
        assert code == 0, f"{name}: {err}"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("hyperparameter.learning_rate=1", "hyperparameter"),
        ("hyperparameters.learnin_rate=1", "learnin_rate"),
        ("data.max_seq_len=128", "max_seq_len"),
        ("optimizations.agregation_frequency=2", "agregation_frequency"),
        ("no_equals_sign", "--set"),
        ("hyperparameters.global_batch_size=abc", "global_batch_size"),
    ],
)
def test_set_paths_that_do_not_exist_are_refused(override: str, needle: str) -> None:
    code, out, err = dry_run(ROOT / "local.yaml", "--set", override)
    assert code == 2 and needle in err and "Traceback" not in err, err


# --------------------------------------------------------------------------------------------
# Checkpoints, outputs and files: checked before any work.
# --------------------------------------------------------------------------------------------


class _Payload:
    """What a hostile checkpoint carries: unpickling it would create MARKER."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        import os

        return (os.system, (f"touch {self.marker}",))


def _planted_copy(checkpoint: Path, tmp: Path, name: str) -> tuple[Path, Path]:
    import pickle
    import shutil
    import zipfile

    copy_dir = tmp / f"planted-{name}"
    shutil.copytree(checkpoint, copy_dir)
    marker = tmp / f"ran-{name}"
    payload = pickle.dumps({"state": _Payload(marker)})
    if name == "trial_state.pkl":
        (copy_dir / name).write_bytes(payload)
    else:  # inside torch.save's zip archive, beside the real tensors
        original = copy_dir / "state_dict.pth"
        rebuilt = tmp / "state_dict.pth"
        with zipfile.ZipFile(original) as src, zipfile.ZipFile(rebuilt, "w") as dst:
            for item in src.infolist():
                data = payload if item.filename.endswith("data.pkl") else src.read(item)
                dst.writestr(item, data)
        rebuilt.replace(original)
    return copy_dir, marker


@pytest.mark.parametrize("name", ["trial_state.pkl", "state_dict.pth"])
def test_a_planted_checkpoint_is_refused_before_anything_is_unpickled(
    name: str, trained, tmp_path: Path
) -> None:
    from tests.support.project import run_train

    checkpoint, _ = trained
    planted, marker = _planted_copy(checkpoint, tmp_path, name)
    code, _, err = run_train(
        ["--resume", str(planted), "--batches", "8", "--checkpoint-dir", str(tmp_path / "c")]
    )
    assert code == 2, err
    assert name in err and "system" in err and "Traceback" not in err
    assert not marker.exists()  # nothing ran
    assert not list((tmp_path / "c" / "determined").glob("*-*-*"))  # nothing trained or written


def test_a_checkpoint_dir_inside_the_upload_is_refused_before_training(tmp_path: Path) -> None:
    import shutil

    from tests.support.project import run_train

    inside = ROOT / "my-checkpoints"
    try:
        code, _, err = run_train(["--batches", "1", "--checkpoint-dir", str(inside)])
        assert code == 2 and "copied into themselves" in err and "Traceback" not in err, err
        assert not inside.exists()
    finally:  # without the check the run would fill the project with recursive copies
        shutil.rmtree(inside, ignore_errors=True)


def test_outputs_that_cannot_be_written_are_refused_before_training(tmp_path: Path) -> None:
    from tests.support.project import run_train

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
    from extractive_qa.trial.checkpoint_storage import prepare_local_storage

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


def _cli(*args: str) -> tuple[int, str, str]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def test_the_scoring_cli_warns_per_missing_id_and_refuses_foreign_predictions(tmp_path: Path) -> None:
    from extractive_qa.data.squad_files import load_squad
    from tests.support.project import DEV_V1, DEV_V2

    ids = [ex.id for ex in load_squad(DEV_V1, training=False).examples]
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({f"x{i}": "a" for i in range(810)}))
    code, out, err = _cli("-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(foreign))
    assert code == 2 and "none of its 810 ids" in err and out == ""
    half = tmp_path / "half.json"
    v2_ids = [ex.id for ex in load_squad(DEV_V2, training=False).examples]
    half.write_text(json.dumps({i: "" for i in v2_ids[: len(v2_ids) // 2]}))
    code, out, err = _cli("-m", "extractive_qa.qa.squad_metric", str(DEV_V2), str(half))
    assert code == 0 and err.count("Missing prediction for") == len(v2_ids) - len(v2_ids) // 2
    assert "over the answered questions only" in err
    some = tmp_path / "some.json"
    some.write_text(json.dumps({i: "" for i in ids[:10]}))
    code, _, err = _cli("-m", "extractive_qa.qa.squad_metric", str(DEV_V1), str(some))
    assert code == 0 and "counts each missing one as wrong" in err
    odds = tmp_path / "odds.json"  # NaN would make the printed report invalid JSON
    odds.write_text(json.dumps({i: (float("nan") if n == 0 else 0.5) for n, i in enumerate(v2_ids)}))
    metric = ["-m", "extractive_qa.qa.squad_metric"]
    code, out, err = _cli(*metric, str(DEV_V2), str(half), "--na-prob-file", str(odds))
    assert code == 2 and "not finite numbers" in err and out == ""


def test_predict_checks_its_inputs_and_outputs_before_any_work(trained, tmp_path: Path) -> None:
    import shutil

    import torch

    checkpoint, _ = trained
    question = ["--question", "Who won?", "--context", "Denver won."]
    code, _, err = _cli(
        "predict.py",
        "--checkpoint",
        str(checkpoint),
        "--squad",
        "x.json",
        "--out",
        str(tmp_path / "no" / "p.json"),
    )
    assert code == 2 and "--out" in err and "does not exist" in err and "Traceback" not in err
    if not torch.cuda.is_available():
        code, _, err = _cli("predict.py", "--checkpoint", str(checkpoint), *question, "--device", "cuda")
        assert code == 2 and "--device cuda" in err and "Traceback" not in err
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    weights = damaged / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, _, err = _cli("predict.py", "--checkpoint", str(damaged), *question)
    assert code == 2 and "cannot load the model" in err and "Traceback" not in err
    settings = damaged / "hf" / "qa_settings.json"
    shutil.copy(checkpoint / "hf" / "model.safetensors", weights)
    raw = json.loads(settings.read_text())
    settings.write_text(json.dumps({**raw, "max_seq_length": "long"}))
    code, _, err = _cli("predict.py", "--checkpoint", str(damaged), *question)
    assert code == 2 and "max_seq_length" in err and "Traceback" not in err
    settings.write_text(json.dumps({**raw, "precision": "fp8"}))  # a string, but no precision
    code, _, err = _cli("predict.py", "--checkpoint", str(damaged), *question)
    assert code == 2 and "precision is 'fp8'" in err and "Traceback" not in err


def test_the_key_lists_are_the_masters_schemas() -> None:
    """schema's key lists equal Determined 0.38's experiment-config schemas."""
    from extractive_qa.config.schema import SEARCHER_KEYS, SECTION_KEYS, TOP_LEVEL_KEYS

    schemas = ROOT.parent / "shared" / "determined-expconf"
    if not schemas.is_dir():
        pytest.skip("../shared/determined-expconf (the master's schemas) is not beside the repo")

    def properties(name: str) -> set[str]:
        return set(json.loads((schemas / name).read_text())["properties"])

    assert TOP_LEVEL_KEYS == properties("experiment.json")
    for section, keys in SECTION_KEYS.items():
        assert keys == properties(f"{section}.json"), section
    for searcher, keys in SEARCHER_KEYS.items():
        assert keys == properties(f"searcher-{searcher.replace('_', '-')}.json"), searcher


# --------------------------------------------------------------------------------------------
# Hub names where the hub cannot be reached.
# --------------------------------------------------------------------------------------------


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once it is closed: connections are refused


def test_an_unreachable_hub_is_one_clear_error_or_the_cached_copy(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub name the hub cannot serve: the error comes from one probe, names the field, the
    reason and HF_HUB_OFFLINE, and no retry is printed; a model in the Hugging Face cache loads
    from there instead."""
    import shutil

    from extractive_qa.config import model_family
    from tests.support.project import run_train, tiny_config, write_yaml

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at import
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    model_family.hub_unreachable.cache_clear()
    conf = tiny_config(tiny_bert, tmp_path)
    conf["data"]["pretrained_model"] = "some-org/tiny-qa"
    path = write_yaml(conf, tmp_path / "exp.yaml")
    args = ["--config", str(path), "--checkpoint-dir", str(tmp_path / "c"), "--batches", "2"]
    code, _, err = run_train(args)
    assert code == 2 and "data.pretrained_model 'some-org/tiny-qa'" in err, err[-2000:]
    assert "did not answer" in err and "HF_HUB_OFFLINE=1" in err
    assert "Traceback" not in err and "etry" not in err  # no retry messages
    # The same name, downloaded before: the cached snapshot is used without the network.
    snapshot = tmp_path / "hub" / "models--some-org--tiny-qa" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_bert, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    model_family.hub_unreachable.cache_clear()
    code, result, err = run_train(args)
    assert code == 0, err[-2000:]
    assert result["steps_completed"] == 2


# --------------------------------------------------------------------------------------------
# A resume reads only the bytes it checked.
# --------------------------------------------------------------------------------------------


def test_a_file_swapped_after_the_scan_is_never_unpickled(trained, tmp_path: Path, monkeypatch) -> None:
    """The window between the scan and Determined's read: a payload written into the user's
    checkpoint right after the scan must not run -- the resume reads its private copy."""
    import shutil

    from extractive_qa.trial import checkpoints
    from tests.support.project import run_train

    checkpoint, _ = trained
    mine = tmp_path / "mine"
    shutil.copytree(checkpoint, mine)
    hostile, marker = _planted_copy(checkpoint, tmp_path, "trial_state.pkl")
    scan = checkpoints.check_checkpoint

    def scan_then_swap(*args, **kwargs) -> int:
        steps = scan(*args, **kwargs)
        shutil.copy(hostile / "trial_state.pkl", mine / "trial_state.pkl")  # the attacker's move
        return steps

    monkeypatch.setattr(checkpoints, "check_checkpoint", scan_then_swap)
    conf = trained_config(checkpoint)
    code, result, err = run_train(["--config", str(conf), "--resume", str(mine), "--batches", "8",
                                   "--checkpoint-dir", str(tmp_path / "c")])  # fmt: skip
    assert code == 0, err
    assert not marker.exists()  # the swapped file was never read
    assert result["steps_completed"] == 8
    assert not list((tmp_path / "c" / "determined").glob(".resume-*"))  # the private copy is gone


def trained_config(checkpoint: Path) -> Path:
    """The YAML the `trained` fixture's run used (its directory holds it)."""
    return checkpoint.parents[2] / "exp.yaml"


def _state_dict_with_pickle(checkpoint: Path, tmp: Path, pickled: bytes, prefix: bool) -> Path:
    """A copy of the checkpoint whose state_dict.pth carries `pickled`: as the archive's data.pkl,
    or (prefix) before the untouched zip, which zipfile still reads."""
    import shutil
    import zipfile

    copy_dir = tmp / ("prefixed" if prefix else "dotted")
    shutil.copytree(checkpoint, copy_dir)
    state = copy_dir / "state_dict.pth"
    if prefix:
        state.write_bytes(pickled + state.read_bytes())
        assert zipfile.is_zipfile(state)
        return copy_dir
    rebuilt = tmp / "rebuilt.pth"
    with zipfile.ZipFile(state) as src, zipfile.ZipFile(rebuilt, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, pickled if item.filename.endswith("data.pkl") else src.read(item))
    rebuilt.replace(state)
    return copy_dir


# pickle protocol 4: GLOBAL-by-STACK_GLOBAL of ("numpy.dtypes", "__builtins__.get"), then call it.
DOTTED = (
    b"\x80\x04\x8c\x0cnumpy.dtypes\x94\x8c\x10__builtins__.get\x94\x93\x94\x8c\x04eval\x94\x85\x94R\x94."
)


@pytest.mark.parametrize("prefix", [False, True], ids=["dotted-name", "pickle-before-the-zip"])
def test_pickles_that_pass_a_loose_scan_are_refused(prefix: bool, trained, tmp_path: Path) -> None:
    """Two ways past a scan that allows numpy.dtypes by module or reads the zip wherever it
    starts: both are refused before anything is unpickled (exit 2, the file named)."""
    from tests.support.project import run_train

    checkpoint, _ = trained
    planted = _state_dict_with_pickle(checkpoint, tmp_path, DOTTED, prefix)
    conf = trained_config(checkpoint)
    code, _, err = run_train(["--config", str(conf), "--resume", str(planted), "--batches", "8",
                              "--checkpoint-dir", str(tmp_path / "c")])  # fmt: skip
    assert code == 2 and "state_dict.pth" in err and "Traceback" not in err, err[-2000:]
    assert ("first byte" in err) if prefix else ("__builtins__.get" in err)


# --------------------------------------------------------------------------------------------
# An output that is an input; a damaged export.
# --------------------------------------------------------------------------------------------


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(trained, tmp_path: Path) -> None:
    import shutil

    from tests.support.project import DEV_V1, run_train

    checkpoint, _ = trained
    data = tmp_path / "dev.json"
    shutil.copy(DEV_V1, data)
    before = data.read_bytes()
    for out in (["--out", str(data)], ["--out-dir", str(tmp_path)]):
        if out[0] == "--out-dir":
            data = data.rename(tmp_path / "predictions.json")  # what --out-dir would write
        code, _, err = _cli("predict.py", "--checkpoint", str(checkpoint), "--squad", str(data), *out)
        assert code == 2 and "is the input given as --squad" in err and "Traceback" not in err, err
        assert data.read_bytes() == before
    config = trained_config(checkpoint)
    kept = config.read_bytes()
    code, _, err = run_train(["--config", str(config), "--metrics-out", str(config), "--batches", "1",
                              "--checkpoint-dir", str(tmp_path / "c")])  # fmt: skip
    assert code == 2 and "--metrics-out" in err and "--config" in err
    assert config.read_bytes() == kept


@pytest.mark.parametrize("damage", ["no-tokenizer-json", "foreign-tokenizer", "n-best-zero", "windows"])
def test_a_damaged_export_is_refused_not_used(damage: str, trained, tmp_path: Path) -> None:
    """hf/ without its tokenizer.json, with another model's tokenizer, or with QA settings out of
    the ranges a config is held to: predict.py names the file (exit 2) instead of answering."""
    import shutil

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    checkpoint, _ = trained
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    hf = damaged / "hf"
    settings = json.loads((hf / "qa_settings.json").read_text())
    if damage == "no-tokenizer-json":
        (hf / "tokenizer.json").unlink()
    elif damage == "foreign-tokenizer":
        vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
        foreign = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))  # a 5-token BERT tokenizer
        foreign.normalizer = normalizers.BertNormalizer()
        foreign.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        foreign.save(str(hf / "tokenizer.json"))
    elif damage == "n-best-zero":
        (hf / "qa_settings.json").write_text(json.dumps({**settings, "n_best_size": 0}))
    else:  # a stride as long as the window: no window would advance
        too_long = {**settings, "doc_stride": settings["max_seq_length"]}
        (hf / "qa_settings.json").write_text(json.dumps(too_long))
    question = ["--question", "Who won?", "--context", "Denver won."]
    code, _, err = _cli("predict.py", "--checkpoint", str(damaged), *question)
    expected = {"no-tokenizer-json": "tokenizer.json is missing", "foreign-tokenizer": "not this model's",
                "n-best-zero": "n_best_size: must be >= 1", "windows": "doc_stride"}[damage]  # fmt: skip
    assert code == 2 and expected in err and "Traceback" not in err, err[-2000:]


def test_too_little_space_for_a_checkpoint_is_named_before_training(
    trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import collections
    import shutil

    from tests.support.project import run_train

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
    code, _, err = _cli(str(project / "train.py"), "--checkpoint-dir", str(checkpoints), "--batches", "1")
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

    from tests.support.project import run_train

    def full_disk(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4096 vs 4000")

    monkeypatch.setattr(torch, "save", full_disk)
    code, _, err = run_train(["--config", str(trained_config(trained[0])), "--batches", "2",
                              "--checkpoint-dir", str(tmp_path / "c")])  # fmt: skip
    assert code == 2 and "writing a checkpoint after 2 batches failed" in err, err[-2000:]
    assert "GB free" in err and "f1" in err and "--resume auto" in err and "Traceback" not in err


# --------------------------------------------------------------------------------------------
# The environment and small inputs: each a named error or a warning.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "0", "2"])
def test_a_world_size_not_set_by_torchrun_is_named(value: str, tmp_path: Path, monkeypatch) -> None:
    from tests.support.project import run_train

    monkeypatch.setenv("WORLD_SIZE", value)
    for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = run_train(["--batches", "1", "--checkpoint-dir", str(tmp_path / "c")])
    assert code == 2 and f"WORLD_SIZE={value}" in err.replace("'", "") and "torchrun" in err, err[-1500:]


def test_a_local_series_with_more_processes_than_cores_is_refused(tmp_path: Path) -> None:
    import os

    import scaling

    too_many = str((os.cpu_count() or 1) + 1)
    args = ["local", "--config", str(ROOT / "local.yaml"), "--slots", too_many, "--batches", "2",
            "--out", str(tmp_path)]  # fmt: skip
    assert scaling.main(args) == 2
    assert not (tmp_path / "runs").exists()  # refused before the first run
    a_file = tmp_path / "report.md"
    a_file.write_text("kept")
    args = [*args[:4], "1", "--batches", "2", "--out", str(a_file)]  # --slots 1, --out a file
    assert scaling.main(args) == 2 and a_file.read_text() == "kept"


def test_contradictory_records_and_foreign_devices_are_named(trained, tmp_path: Path) -> None:
    from extractive_qa.data import squad_files
    from extractive_qa.errors import DataError
    from tests.support.project import DEV_V2

    raw = json.loads(DEV_V2.read_text())
    qa = next(q for p in raw["data"][0]["paragraphs"] for q in p["qas"] if q.get("is_impossible"))
    qa["answers"] = [{"text": "x", "answer_start": 0}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(DataError, match="is_impossible is true but it has 1 answer"):
        squad_files.load_squad(bad, training=False)
    question = ["--question", "Who won?", "--context", "Denver won."]
    code, _, err = _cli("predict.py", "--checkpoint", str(trained[0]), *question, "--device", "meta")
    assert code == 2 and "--device 'meta'" in err and "Traceback" not in err
    answer_v2 = ["--squad", str(DEV_V2), "--out", str(tmp_path / "p.json")]
    code, _, err = _cli("predict.py", "--checkpoint", str(trained[0]), *answer_v2)
    assert code == 0 and "trained on v1.1" in err
