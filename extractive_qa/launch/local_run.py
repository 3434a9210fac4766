"""A run without a master, around Trainer.fit: what it checks and prepares before the trial is
built, what it adds to the trial, and how it fits and reports.

On a cluster the master does these: it checks the config, restores the latest checkpoint, shows
progress in the WebUI, keeps checkpoints by checkpoint_storage's policy, and ends a trial on a
preemption. Locally, in this order: where the run writes is checked, the process group joined
and the seeds set, the checkpoint --resume names rewritten privately and compared with the run
(launch.resume); the trial gets a progress display, Ctrl-C / SIGTERM at a batch boundary
(launch.interruption), the local checkpoint retention and, with --metrics-out, the metric series
as the master would store it; after fit, an interruption or a failed checkpoint write becomes one
line that says what was kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from determined import core, pytorch

from extractive_qa import det_internals
from extractive_qa.config import run_plan
from extractive_qa.config.experiment import RunOptions, Source
from extractive_qa.files import ROOT, check_output_file, check_outputs, write_text_atomic
from extractive_qa.launch import interruption, progress
from extractive_qa.launch.driver import (
    BuiltTrial,
    ResumePoint,
    RunDriver,
    TrialBuilder,
    final_result,
    trial_context,
)
from extractive_qa.launch.process import join_process_group, seed_everything
from extractive_qa.launch.storage import (
    check_free_space,
    check_local_storage,
    check_outside_upload,
    checkpoint_write_failed,
    prepare_local_storage,
    write_failure_error,
)
from extractive_qa.resume import identity
from extractive_qa.resume.restore import (
    Resumed,
    finished_resume,
    latest_checkpoint,
    prepare_resume,
    resume_from,
)
from extractive_qa.resume.rewrite import ExpectedState
from extractive_qa.trial.callbacks import RunLog, TrialExtras

logger = logging.getLogger("squad")

DATA_FILES = ("train_file", "validation_file")  # data.* paths a run reads (URLs never match a file)


@dataclasses.dataclass
class LocalRun(RunDriver):
    args: RunOptions
    source: Source  # the command line's config
    plan: run_plan.RunPlan
    distributed: core.DistributedContext | None = None  # torchrun's process group, as Determined's
    resume_point: ResumePoint = ResumePoint()
    resumed: Resumed | None = None  # the checkpoint --resume named (or `auto` found), rewritten
    identity: dict[str, Any] = dataclasses.field(default_factory=dict)
    stop: interruption.Interruption | None = None
    series: MetricSeries | None = None  # the metric series (--metrics-out)

    @property
    def storage(self) -> Path:
        return self.args.checkpoint_dir / "determined"  # Determined's local storage follows XDG

    @property
    def rank(self) -> int:
        return self.distributed.rank if self.distributed is not None else 0

    def run(self, build: TrialBuilder) -> dict[str, Any] | None:
        """A run prepared (`prepare`): its result if the resumed checkpoint already reached the
        length; else the trial built, given its extras, checked, fitted and reported."""
        if self.plan.length.unit == "batches":  # epochs: once the trial counts them (before_fit)
            already = self.finished(self.plan.length.value)  # --resume of a finished run
            if already is not None:
                return already if self.rank == 0 else None
        with trial_context(self.plan, self.source, self.distributed) as context:
            # TensorBoard's event files beside the checkpoints, a folder per run as torch names them
            run_name = f"{time.strftime('%b%d_%H-%M-%S')}_{socket.gethostname()}"
            det_internals.tensorboard_into(context, self.args.checkpoint_dir / "tensorboard" / run_name)
            trial = build(context)
            trial.add_extras(self.extras(trial, context))
            already = self.before_fit(trial, context)
            if already is not None:
                return already if context.distributed.rank == 0 else None
            self.fit(pytorch.Trainer(trial, context), trial, context)
            if context.distributed.rank != 0:
                return None
            self.report(context.distributed.size)
            return final_result(trial)

    # ----------------------------------------------------------------------------------------
    # Before the trial: where the run writes, the process group, the checkpoint to resume.
    # ----------------------------------------------------------------------------------------

    def check_outputs(self) -> None:
        check_local_storage(self.args.checkpoint_dir, ROOT)
        if self.plan.data.cache_dir:
            check_outside_upload(ROOT / self.plan.data.cache_dir, ROOT, "data.cache_dir")
        if self.args.metrics_out:
            check_output_file(self.args.metrics_out, "--metrics-out")
            data = self.source.exp_conf.get("data") or {}
            inputs: dict[str, Path | None] = {f"data.{k}": ROOT / data[k] for k in DATA_FILES if data.get(k)}
            inputs["--config"] = self.args.config
            inputs["--checkpoint-dir"] = self.args.checkpoint_dir  # the checkpoints a resume reads
            if isinstance(self.args.resume, Path):
                inputs["--resume"] = self.args.resume
            check_outputs({"--metrics-out": self.args.metrics_out}, inputs)

    def join(self) -> None:
        self.distributed = join_process_group(False, self.plan.collective_timeout_s)
        os.chdir(ROOT)  # config paths are relative to the project, as to a trial's upload
        seed_everything(self.plan.seed)
        os.environ["XDG_DATA_HOME"] = str(self.args.checkpoint_dir.resolve())

    def resume(self, expected: ExpectedState, cleanup: contextlib.ExitStack) -> None:
        """The checkpoint --resume means, rewritten into a private copy Determined restores, with
        --resume DIR's settings compared with this run's (auto and latest pick only this run's)."""
        flag = self.args.resume
        self.identity = identity.run_identity(self.plan, self.source.exp_conf.get("name"))
        found = resume_from(flag, self.args.checkpoint_dir, self.identity)
        if found is None:
            return
        same_run = None  # auto and latest pick only this run's checkpoints
        if flag not in ("auto", "latest"):
            same_run = functools.partial(
                identity.check_same_run,
                identity=self.identity,
                allow_changed=self.args.allow_changed,
                shown=found,
                command_line=list(self.args.command_line),
            )
        resumed = prepare_resume(found, expected, "--resume", same_run)
        cleanup.callback(resumed.copy.remove)
        self.resumed = resumed
        self.resume_point = ResumePoint(det_internals.restore_id(resumed.copy.path), resumed.steps)
        logger.info("--resume %s: continuing from %s at batch %d", flag, found, resumed.steps)
        identity.note_length_change(resumed.record, {self.plan.length.unit: self.plan.length.value})

    def note_an_earlier_run(self) -> None:
        """A run started without --resume beside a checkpoint of the same settings (the first
        command typed twice) trains again from the beginning: say so, where the earlier one is,
        and that --resume auto shows its result (or continues it) without training again."""
        if self.rank != 0:
            return
        self.identity = identity.run_identity(self.plan, self.source.exp_conf.get("name"))
        found = latest_checkpoint(self.storage, self.identity, "auto")
        if found is None:
            return
        record = identity.json_record(found)
        scores = record.get("validation") if isinstance(record.get("validation"), dict) else {}
        f1 = scores.get("f1")
        reached = f" (F1 {f1:.2f})" if isinstance(f1, (int, float)) else ""
        logger.warning(
            "a run with these settings already wrote %s%s, %s batches; this one trains again from the "
            "beginning beside it. `python3 train.py --resume auto` (with this command's --config and "
            "--set) shows a finished run's result, or continues it, without training again.",
            found, reached, identity.steps_completed(found),
        )  # fmt: skip

    def finished(self, total: int) -> dict[str, Any] | None:
        """The result of a resume with nothing left to train of `total` batches (None: train on)."""
        if self.resumed is None:
            return None
        return finished_resume(self.args.resume, self.resumed, total)

    # ----------------------------------------------------------------------------------------
    # The trial: what it is built with, and what is checked once it is built.
    # ----------------------------------------------------------------------------------------

    def extras(self, trial: BuiltTrial, context: pytorch.PyTorchTrialContext) -> TrialExtras:
        """What a local run adds to the built trial (its run log, batches per epoch, random-state
        gatherer): Ctrl-C / SIGTERM at a batch boundary, the progress display, checkpoint
        retention and the metric series. The trial gets them from here and never calls back."""
        added = TrialExtras()
        # Ctrl-C / SIGTERM: finish the batch, checkpoint (with every rank's random state).
        self.stop = interruption.Interruption(
            context.distributed, context.device, trial.rank_random_state.gather
        )
        added.before_batch.append(self.stop.before_batch)
        if context.distributed.rank != 0:
            return added
        if self.args.metrics_out:
            self.series = added.callbacks["metric_series"] = MetricSeries(trial.run_log)
        unit = trial.batches_per_epoch() if self.plan.length.unit == "epochs" else 1
        shown = progress.Progress(
            context,
            self.plan.length.value * unit,
            trial.batches_per_epoch(),
            self.plan.hparams.global_batch_size,
        )
        added.callbacks["progress"] = shown
        added.before_batch.append(shown.before_batch)
        added.callbacks["retention"] = retention(self.source.exp_conf, trial.run_log)
        return added

    def before_fit(self, trial: BuiltTrial, context: pytorch.PyTorchTrialContext) -> dict[str, Any] | None:
        """Once the trial is built, before any batch: the resumed checkpoint's data against this
        run's, a length the checkpoint has not reached yet, private storage with room for one
        more checkpoint. A result: the run had already finished (auto, latest)."""
        if self.resumed is not None:
            identity.check_same_data(
                self.resumed.record, trial.train_set.sha256, self.args.allow_changed, self.resumed.shown
            )
            done = self.finished(run_plan.total_batches(self.plan.length, trial.batches_per_epoch()))
            if done is not None:
                return done
        if context.distributed.rank == 0:
            prepare_local_storage(self.args.checkpoint_dir)
            check_free_space(self.args.checkpoint_dir, sum(p.numel() for p in trial.model.parameters()))
        return None

    # ----------------------------------------------------------------------------------------
    # Fit, and what the user is told.
    # ----------------------------------------------------------------------------------------

    def fit(self, trainer: pytorch.Trainer, trial: BuiltTrial, context: pytorch.PyTorchTrialContext) -> None:
        """Trainer.fit from the checkpoint's step; a stop or a failed checkpoint write becomes an
        Interrupted / ConfigError that says what was kept and how to continue."""
        rank = context.distributed.rank
        before = {p.name for p in self.storage.iterdir()} if self.storage.is_dir() else set()
        if self.resumed is not None:
            self.resumed.copy.verify()  # the directory Determined reads next is still the one written
        with (
            det_internals.resume_at(self.resume_point.steps_completed),
            det_internals.code_copy_that_keeps_the_state(),
            self.stop or contextlib.nullcontext(),
        ):
            try:
                trainer.fit(**self.plan.fit_kwargs(self.resume_point.storage_id, False))
            except interruption.StoppedNow:  # a second Ctrl-C
                raise interruption.Interrupted(130, None, trial.run_log.checkpoint, rank) from None
            except (OSError, RuntimeError) as err:
                if not checkpoint_write_failed(err):
                    raise
                done, scores = trial.run_log.steps_completed, trial.run_log.validation
                raise write_failure_error(err, self.args.checkpoint_dir, before, done, scores) from None
        if self.stop is not None and self.stop.stopped_at is not None:
            raise interruption.Interrupted(
                self.stop.exit_code(), self.stop.stopped_at, trial.run_log.checkpoint, rank
            )

    def report(self, slots: int) -> None:
        """--metrics-out: the run's reports as the master stores them, for scaling.py."""
        if not self.args.metrics_out:
            return
        record = {
            "name": self.source.exp_conf.get("name"),
            "state": "COMPLETED",
            "slots": slots,
            "global_batch_size": self.plan.hparams.global_batch_size,
            "aggregation_frequency": self.plan.aggregation_frequency,
            "optimizer": self.plan.hparams.optimizer,
            **(self.series.series if self.series is not None else {}),
        }
        write_text_atomic(self.args.metrics_out, json.dumps(record, indent=1))


def prepare(
    args: RunOptions,
    source: Source,
    plan: run_plan.RunPlan,
    expected: ExpectedState | None,
    cleanup: contextlib.ExitStack,
) -> LocalRun:
    """Everything a local run does before Determined builds the trial, in order. `expected`: what
    the checkpoint --resume names must fit (train.py builds it where --resume is given)."""
    local = LocalRun(args, source, plan)
    local.check_outputs()
    local.join()
    if args.resume:
        if expected is None:
            raise ValueError("--resume needs the state its checkpoint must fit")
        local.resume(expected, cleanup)
    else:
        local.note_an_earlier_run()
    return local


# --------------------------------------------------------------------------------------------
# The callbacks only a local run has (a master does their work on a cluster).
# --------------------------------------------------------------------------------------------


def retention(exp_conf: dict[str, Any], run_log: RunLog) -> LocalRetention:
    """checkpoint_storage's save_trial_latest / save_trial_best for a local run's checkpoints."""
    storage = exp_conf.get("checkpoint_storage") or {}
    searcher = exp_conf.get("searcher") or {}
    return LocalRetention(
        run_log,
        latest=int(storage.get("save_trial_latest", 1)),
        best=int(storage.get("save_trial_best", 1)),
        metric=searcher.get("metric", "f1"),
        smaller_is_better=bool(searcher.get("smaller_is_better", False)),
    )


class LocalRetention(pytorch.PyTorchCallback):
    """A local run keeps what a master would: the newest `save_trial_latest` checkpoints it wrote
    and its `save_trial_best` best-validated ones (checkpoint_storage; Determined's defaults 1
    and 1). On a cluster the master's garbage collection does this; locally nothing does, and each
    checkpoint holds the weights three times over (model, AdamW's two moments) plus hf/.
    Checkpoints this run did not write are never touched."""

    def __init__(self, run_log: RunLog, latest: int, best: int, metric: str, smaller_is_better: bool) -> None:
        self.run_log, self.latest, self.best = run_log, max(1, latest), best
        self.metric, self.sign = metric, (1 if smaller_is_better else -1)
        self.written: list[tuple[Path, float | None]] = []  # oldest first, with the metric validated at it

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        if self.run_log.checkpoint is None:
            return
        path = Path(self.run_log.checkpoint)
        value = self.run_log.validation.get(self.metric)
        validated_here = self.run_log.validation_steps == self.run_log.steps_completed
        self.written.append((path, float(value) if value is not None and validated_here else None))
        keep = {p for p, _ in self.written[-self.latest :]}
        scored = sorted((self.sign * v, i) for i, (_, v) in enumerate(self.written) if v is not None)
        keep |= {self.written[i][0] for _, i in scored[: self.best]}
        for old, _ in self.written:
            if old not in keep and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
                logger.info("removed checkpoint %s (checkpoint_storage keeps the latest %d, best %d)",
                            old, self.latest, self.best)  # fmt: skip
        self.written = [(p, v) for p, v in self.written if p in keep]


class MetricSeries(pytorch.PyTorchCallback):
    """What Determined's master stores per report (steps, end time, metrics), kept locally when
    asked for (train.py --metrics-out), so scaling.py computes throughput the same way from a
    local run or a cluster's. Runs after the trial's run log, whose step count it uses."""

    def __init__(self, run_log: RunLog) -> None:
        self.run_log = run_log
        self.series: dict[str, list[dict[str, Any]]] = {"training": [], "validation": []}

    def _report(self, group: str, metrics: dict[str, Any]) -> None:
        values = {}
        for key, value in metrics.items():
            with contextlib.suppress(TypeError, ValueError):
                values[key] = float(value)
        self.series[group].append(
            {"steps_completed": self.run_log.steps_completed, "end_time": time.time(), "metrics": values}
        )

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self._report("training", avg_metrics)

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self._report("validation", metrics)
