"""Finite training: a run whose gradients turn NaN stops at that step with one line naming the
likely setting and exits non-zero; no checkpoint holding a NaN or an infinity is written; a
pretrained model holding one is refused before training (extractive_qa/trial/finite_guard.py,
model_files.non_finite). The cluster's side -- det.InvalidHP, so a search moves on -- is in
tests/test_cluster.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from extractive_qa.config.settings import Hyperparameters
from extractive_qa.errors import TrainingDiverged
from extractive_qa.trial.finite_guard import FiniteGuard
from tests.support.project import run_train, tiny_config, write_yaml


def checkpoints_in(directory: Path) -> list[Path]:
    return [p.parent for p in directory.rglob("metadata.json")]


@pytest.mark.parametrize(
    ("setting", "named"),
    # 0 in fp32: 0/0 at step 1. (A no_answer_loss_weight large enough to overflow is refused by
    # its maximum before training: tests/test_config.py.)
    [("adam_epsilon=1e-50", "hyperparameters.adam_epsilon: 1e-50")],
)
def test_a_diverging_run_stops_at_that_step_and_writes_no_checkpoint(
    setting: str, named: str, tiny_bert: Path, tmp_path: Path
) -> None:
    """Without the guard the run finished, wrote a checkpoint of NaN weights and exited 0."""
    config = write_yaml(tiny_config(tiny_bert, tmp_path), tmp_path / "exp.yaml")
    code, result, err = run_train(
        ["--config", str(config), "--checkpoint-dir", str(tmp_path / "ck"), "--batches", "4",
         "--set", f"hyperparameters.{setting}"]
    )  # fmt: skip
    assert code == 2 and result is None, err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert (
        re.search(r"training stopped: at batch [12] the gradient norm is (nan|inf)", line) and named in line
    ), line
    assert "Traceback" not in err
    assert checkpoints_in(tmp_path / "ck") == []


def test_a_state_holding_a_non_finite_value_is_named_and_stops_the_run() -> None:
    """What the workload's end and the chief's save check: a NaN weight or optimizer moment stops
    the run before anything of it is written, naming the tensor."""
    hp = Hyperparameters()
    guard = FiniteGuard(hp, 3e-5, TrainingDiverged, loss_scaled=False)
    moments = {"exp_avg_sq": torch.ones(2), "step": torch.tensor(3.0)}
    good = {"models_state_dict": [{"w": torch.ones(2), "ids": torch.arange(2)}],
            "optimizers_state_dict": [{"state": {0: moments}}]}  # fmt: skip
    guard.state(good, "no checkpoint was written")
    nan_weight = {**good, "models_state_dict": [{"w": torch.tensor([1.0, float("nan")])}]}
    with pytest.raises(
        TrainingDiverged, match="model weight w holds NaN or infinite values, so no checkpoint"
    ):
        guard.state(nan_weight, "no checkpoint was written")
    inf_moment = {
        **good,
        "optimizers_state_dict": [{"state": {0: {"exp_avg_sq": torch.tensor([float("inf")])}}}],
    }
    with pytest.raises(TrainingDiverged, match="optimizer state exp_avg_sq of parameter 0 holds NaN"):
        guard.state(inf_moment, "no checkpoint was written")


def test_a_gradient_norm_is_judged_except_where_the_loss_scaler_owns_it() -> None:
    hp = Hyperparameters(max_grad_norm=0.0)
    guard = FiniteGuard(hp, 3e-5, TrainingDiverged, loss_scaled=False)
    guard.gradient_norm(torch.tensor(5.0), torch.tensor(1.0), 0)
    with pytest.raises(TrainingDiverged, match="at batch 8 the gradient norm is inf.*max_grad_norm: 0"):
        guard.gradient_norm(torch.tensor(float("inf")), torch.tensor(2.0), 7)
    # what a stop every rank takes ends in is the driver's value; the chief's save alone stops locally
    ended = []
    on_cluster = FiniteGuard(hp, 3e-5, lambda message: ended.append(message) or KeyError(message), False)
    with pytest.raises(KeyError, match="at batch 3 the gradient norm is nan"):
        on_cluster.gradient_norm(torch.tensor(float("nan")), torch.tensor(2.0), 2)
    assert len(ended) == 1 and isinstance(on_cluster.stop("saved", every_rank=False), TrainingDiverged)
    # fp16: the scaler skips a step with non-finite gradients and lowers its scale.
    FiniteGuard(hp, 3e-5, TrainingDiverged, loss_scaled=True).gradient_norm(
        torch.tensor(float("nan")), torch.tensor(1.0), 0
    )


def test_a_pretrained_model_holding_nan_is_refused_before_training(tiny_bert: Path, tmp_path: Path) -> None:
    """The one weights reader refuses it (model_files.read_tensors), so the trial never trains
    from it, as predict.py and export.py never answer from it."""
    import shutil

    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    state = load_file(model / "model.safetensors")
    state["qa_outputs.bias"][0] = float("nan")
    save_file(state, model / "model.safetensors")
    config = write_yaml(tiny_config(model, tmp_path), tmp_path / "exp.yaml")
    code, _, err = run_train(
        ["--config", str(config), "--checkpoint-dir", str(tmp_path / "ck"), "--batches", "1"]
    )
    assert code == 2 and "tensor 'qa_outputs.bias' holds NaN or infinite values" in err, err
    assert "Traceback" not in err
