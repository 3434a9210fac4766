"""The trial's Determined callbacks: per-rank random state in checkpoints, the searcher's stop,
the run log, the metric series and the Hugging Face export beside every checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from determined import pytorch

from extractive_qa import det_internals
from extractive_qa.io.files import shared_mode, write_text_atomic
from extractive_qa.qa import qa_settings
from extractive_qa.resume.identity import IDENTITY_RECORD
from extractive_qa.trial import model_io, optimization

logger = logging.getLogger("squad")


@dataclasses.dataclass
class TrialExtras:
    """Everything that differs by where the trial runs, handed to it by its driver once it is
    built (launch/): the seed of its data order, what a divergence ends in, callbacks after the
    trial's own (a local run: progress, signal handling, retention, metric series; a cluster
    trial: the searcher's stop) and hooks the trial calls before each batch."""

    seed: int  # the training data order's: the master's trial seed, or reproducibility's seed
    end_diverged: Callable[[str], Exception]  # finite_guard.EndDiverged
    callbacks: dict[str, pytorch.PyTorchCallback] = dataclasses.field(default_factory=dict)
    before_batch: list[Callable[[int], None]] = dataclasses.field(default_factory=list)


class RankRandomState(pytorch.PyTorchCallback):
    """Every rank's random state in the checkpoint; on a restart each rank takes back its own.

    Determined saves the chief's torch / NumPy / Python random state and restores it on every
    rank (pytorch/_pytorch_trial.py:1093-1096 and 1004-1008). The ranks draw different amounts --
    a dropout mask is as large as that rank's padded batch -- so after a restart the other ranks
    went on with the chief's stream and the run no longer matched an uninterrupted one. The states
    are gathered wherever a checkpoint can follow (the end of a training workload or a
    validation; nothing draws between there and the save) and restored after Determined's own
    (callbacks load after it, :1026-1030).

    The gather goes over a gloo group of torch's, which times out with the run's other collectives
    (data.collective_timeout_s), not over Determined's allgather: that one waits on a ZMQ socket
    without a timeout, so a machine dropping off the network during a workload's end stalled
    every other rank for good.
    """

    def __init__(self, context: pytorch.PyTorchTrialContext, timeout_s: float | None = None) -> None:
        import datetime

        import torch.distributed as dist

        self.context = context
        self.ranks: list[dict[str, Any]] | None = None
        self.group = None
        if context.distributed.size > 1 and dist.is_available() and dist.is_initialized():
            timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
            self.group = dist.new_group(backend="gloo", timeout=timeout)  # every rank, at init

    def _capture(self) -> dict[str, Any]:
        state = {"torch": torch.random.get_rng_state(), "numpy": np.random.get_state()}
        state["random"] = random.getstate()
        if self.context.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.context.device)
        return state

    def gather(self) -> None:
        if self.group is None:  # one process
            self.ranks = [self._capture()]
            return
        import torch.distributed as dist

        ranks: list[Any] = [None] * self.context.distributed.size
        dist.all_gather_object(ranks, self._capture(), group=self.group)
        self.ranks = ranks

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self.gather()

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.gather()

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks} if self.ranks is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ranks = state_dict.get("ranks")
        size, rank = self.context.distributed.size, self.context.distributed.rank
        if not ranks or len(ranks) != size:
            if ranks and rank == 0:
                logger.warning(
                    "checkpoint holds random states for %d ranks, this run has %d: every rank "
                    "continues from the chief's (Determined's default)", len(ranks), size,
                )  # fmt: skip
            return
        mine = ranks[rank]
        torch.random.set_rng_state(mine["torch"])
        np.random.set_state(mine["numpy"])
        random.setstate(mine["random"])
        if "cuda" in mine and self.context.device.type == "cuda":
            torch.cuda.set_rng_state(mine["cuda"], self.context.device)


class SearcherStop(pytorch.PyTorchCallback):
    """End the trial cleanly when the searcher stops it: checkpoint, then return from fit().

    The chief asks the master at every training report (each scheduling_unit batches) and tells
    the other ranks, so all of them request the stop at the same batch; the controller then takes
    its exit checkpoint (pytorch/_pytorch_trial.py:499-503). See det_internals.SearcherStopWatch
    for why the master's decision has to be read rather than received.
    """

    def __init__(self, context: pytorch.PyTorchTrialContext, info: Any, run_log: RunLog) -> None:
        self.context = context
        self.run_log = run_log
        self.watch = det_internals.SearcherStopWatch(info) if context.distributed.rank == 0 else None

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        stopped = self.watch.stopped() if self.watch is not None else False
        if self.context.distributed.broadcast(stopped):
            logger.info("the searcher stopped this trial: checkpointing and exiting")
            self.run_log.stopped_by_searcher = True
            self.context.set_stop_requested(True)


class RunLog(pytorch.PyTorchCallback):
    """Remembers what train.py reports at the end: steps, last metrics, checkpoint. (Its
    throughput is the training windows' own, perf_metrics.run_rates.)"""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.validation: dict[str, Any] = {}
        self.checkpoint: str | None = None
        self.steps_completed = 0  # batches trained so far (a resumed run starts above zero)
        self.stopped_by_searcher = False
        self.last_train_loss: float | None = None
        self.validation_steps: int | None = None  # the batch count the latest validation ran at

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        # Before the first batch (step-zero validation, or a resumed run whose final validation or
        # checkpoint is still pending) the count is where the run starts, not a batch index.
        self.steps_completed = first_batch_idx

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self.steps_completed = self.context.current_train_batch() + 1
        if batch_metrics:
            self.last_train_loss = float(batch_metrics[-1]["loss"])

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.validation = dict(metrics)
        self.validation_steps = self.steps_completed

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        self.checkpoint = str(checkpoint_dir)


class RecipeOptions(pytorch.PyTorchCallback):
    """A resume takes the optimizer's options and peak rates from this run's recipe, and from the
    checkpoint only tensors and step counts (optimization.take_recipe_options): called before
    Determined loads the optimizer and schedule (pytorch/_pytorch_trial.py:913-914, 957-974)."""

    def __init__(self, optimizer: Any, schedule: Any) -> None:
        self.optimizer, self.schedule = optimizer, schedule

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        optimization.take_recipe_options(checkpoint, self.optimizer, self.schedule)


class HFExport(pytorch.PyTorchCallback):
    """Every checkpoint also holds hf/: save_pretrained model + tokenizer + QA settings + model card."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        settings: Callable[[], qa_settings.QASettings],
        card: Callable[[], str],
        predictions: Callable[[], Callable[[Path], Any] | None] = lambda: None,
    ) -> None:
        # Getters: the settings carry the latest validation's tuned threshold, the card its
        # scores, and the latest validation's outputs (data.save_predictions) change with each.
        self.model, self.tokenizer, self.settings, self.card = model, tokenizer, settings, card
        self.predictions = predictions

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        # save_pretrained model + tokenizer + QA settings + the model card (README.md): loadable
        # anywhere, and what predict.py needs to window and extract as evaluation did.
        hf = Path(checkpoint_dir) / "hf"
        model_io.unwrap(self.model).save_pretrained(hf, safe_serialization=True)
        self.tokenizer.save_pretrained(hf)
        self.settings().save(hf)
        write_text_atomic(hf / "README.md", self.card())
        for item in hf.iterdir():  # safetensors writes its file 0600: every file gets the umask's mode
            if item.is_file() and not item.is_symlink():
                shared_mode(item)
        write = self.predictions()
        if write is not None:
            write(Path(checkpoint_dir) / "predictions")


class CheckpointRecord(pytorch.PyTorchCallback):
    """experiment.json in every checkpoint: the settings that identify its run
    (resume.identity.run_identity) and all of its settings, resolved (run_settings: what a printed
    command reproduces the run from, and which validation file its scores are on), the digest of
    the training questions it read (a resume refuses other content at the same path), the
    training length the run was planned for, and the latest validation (what a resume of a
    finished run reports)."""

    def __init__(
        self,
        identity: dict[str, Any],
        settings: dict[str, Any],
        train_length: dict[str, int],
        train_sha256: str,
        run_log: RunLog,
    ) -> None:
        self.identity, self.settings = identity, settings
        self.train_length, self.train_sha256 = train_length, train_sha256
        self.run_log = run_log

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        log = self.run_log
        record = {
            "identity": self.identity,
            "settings": self.settings,
            "train_length": self.train_length,
            "train_sha256": self.train_sha256,
            "validation": {k: float(v) for k, v in log.validation.items() if k not in ("batches", "epochs")},
            "validation_steps": log.validation_steps,
        }
        write_text_atomic(Path(checkpoint_dir) / IDENTITY_RECORD, json.dumps(record, indent=1))
