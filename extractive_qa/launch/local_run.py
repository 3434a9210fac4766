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
from extractive_qa.errors import TrainingDiverged
from extractive_qa.io.files import ROOT, check_output_file, check_outputs, write_text_atomic
from extractive_qa.launch import interruption, progress
from extractive_qa.launch.checkpoint_list import size_on_disk
from extractive_qa.launch.process import join_process_group, seed_everything
from extractive_qa.launch.storage import (
    check_free_space,
    check_local_storage,
    check_outside_upload,
    checkpoint_write_failed,
    prepare_local_storage,
    write_failure_error,
)
from extractive_qa.launch.trial_run import BuiltTrial, RunDriver, TrialBuilder, final_result, trial_context
from extractive_qa.resume.identity import (
    check_same_data,
    check_same_run,
    json_record,
    note_length_change,
    run_identity,
    run_settings,
    steps_completed,
)
from extractive_qa.resume.restore import (
    Resumed,
    finished_resume,
    prepare_resume,
    resume_from,
    same_run_checkpoints,
)
from extractive_qa.trial import optimization
from extractive_qa.trial.callbacks import RunLog, TrialExtras

logger = logging.getLogger("squad")

DATA_FILES = ("train_file", "validation_file")  # data.* paths a run reads (URLs never match a file)


@dataclasses.dataclass(frozen=True)
class LocalRun(RunDriver):
    args: RunOptions
    source: Source  # the command line's config
    plan: run_plan.RunPlan
    cleanup: contextlib.ExitStack  # what the run leaves behind: a resume's private copy

    @property
    def storage(self) -> Path:
        return self.args.checkpoint_dir / "determined"  # Determined's local storage follows XDG

    @property
    def flag(self) -> str | Path | None:
        """What the run resumes: --resume's value; without it `auto` (a command typed again
        continues its run), unless --restart."""
        return self.args.resume or (None if self.args.restart else "auto")

    def run(self, build: TrialBuilder) -> dict[str, Any] | None:
        """The whole run, in order: where it writes, the process group and seeds, the checkpoint
        to resume (rewritten privately) -- its result if it had already reached the length --,
        then the trial built, given its extras, checked, fitted and reported."""
        self.check_outputs()
        distributed = self.join()
        rank = distributed.rank if distributed is not None else 0
        identity = run_identity(self.plan, self.source.exp_conf.get("name"))
        resumed = self.resume(identity) if self.flag else None
        if self.args.restart and rank == 0:
            self.note_an_earlier_run(identity)
        if resumed is not None and self.plan.length.unit == "batches":  # epochs: once the trial counts
            done = finished_resume(self.flag, resumed, self.plan.length.value)
            if done is not None:
                return done if rank == 0 else None
        with trial_context(self.plan, self.source, distributed) as context:
            # TensorBoard's event files beside the checkpoints, a folder per run as torch names them
            run_name = f"{time.strftime('%b%d_%H-%M-%S')}_{socket.gethostname()}"
            det_internals.tensorboard_into(context, self.args.checkpoint_dir / "tensorboard" / run_name)
            trial = build(context)
            gather = trial.rank_random_state.gather  # every rank's random state, into the checkpoint
            stop = interruption.Interruption(context.distributed, context.device, gather)
            extras = self.extras(trial, context, stop, resumed)
            trial.add_extras(extras)
            done = self.before_fit(trial, context, resumed)
            if done is not None:
                return done if context.distributed.rank == 0 else None
            self.fit(pytorch.Trainer(trial, context), trial, resumed, stop, context.distributed.rank)
            if context.distributed.rank != 0:
                return None
            self.report(context.distributed.size, extras.callbacks.get("metric_series"))
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

    def join(self) -> core.DistributedContext | None:
        """torchrun's process group (None alone), the run's seeds, the project as working directory."""
        distributed = join_process_group(False, self.plan.collective_timeout_s)
        os.chdir(ROOT)  # config paths are relative to the project, as to a trial's upload
        seed_everything(self.plan.seed)
        os.environ["XDG_DATA_HOME"] = str(self.args.checkpoint_dir.resolve())
        return distributed

    def resume(self, identity: dict[str, Any]) -> Resumed | None:
        """The checkpoint --resume means, rewritten into a private copy Determined restores, with
        --resume DIR's settings compared with this run's (auto and latest pick only this run's)."""
        flag = self.flag
        assert flag is not None
        found = resume_from(flag, self.args.checkpoint_dir, identity)
        if found is None:
            return None
        same_run = None  # auto and latest pick only this run's checkpoints
        if flag not in ("auto", "latest"):
            same_run = functools.partial(
                check_same_run,
                identity=identity,
                allow_changed=self.args.allow_changed,
                shown=found,
                command_line=list(self.args.command_line),
                settings=run_settings(self.plan),
            )
        expected = optimization.expected_state(self.plan)  # what it must fit (the model on the meta device)
        resumed = prepare_resume(found, expected, "--resume", same_run)
        self.cleanup.callback(resumed.copy.remove)
        if self.args.resume is None:  # the command typed again
            logger.info("continuing this run's checkpoint %s at batch %d, as --resume auto does (--restart "
                        "trains from the beginning)", found, resumed.steps)  # fmt: skip
        else:
            logger.info("--resume %s: continuing from %s at batch %d", flag, found, resumed.steps)
        note_length_change(resumed.record, {self.plan.length.unit: self.plan.length.value})
        return resumed

    def note_an_earlier_run(self, identity: dict[str, Any]) -> None:
        """--restart beside checkpoints of the same settings trains again from the beginning: say
        which are kept and how large, so that none is kept unknowingly."""
        earlier = same_run_checkpoints(self.storage, identity)
        if not earlier:
            return
        size = sum(size_on_disk(path) for path in earlier) / 1e6
        named = ", ".join(str(p) for p in earlier[:3]) + (" ..." if len(earlier) > 3 else "")
        logger.warning(
            "--restart: training from the beginning; %d earlier checkpoint(s) of these settings stay "
            "beside it, %s MB (%s). Remove them (rm -r) where you no longer need them.",
            len(earlier), f"{size:,.0f}", named,
        )  # fmt: skip

    # ----------------------------------------------------------------------------------------
    # The trial: what it is built with, and what is checked once it is built.
    # ----------------------------------------------------------------------------------------

    def extras(
        self,
        trial: BuiltTrial,
        context: pytorch.PyTorchTrialContext,
        stop: interruption.Interruption,
        resumed: Resumed | None,
    ) -> TrialExtras:
        """What a local run differs in: its seed orders the data, a divergence is one line and exit
        2, Ctrl-C / SIGTERM stop at a batch boundary, and on the chief the progress display,
        checkpoint retention and the metric series. The trial gets them from here and never
        calls back."""
        added = TrialExtras(seed=self.plan.seed, end_diverged=TrainingDiverged)
        added.before_batch.append(stop.before_batch)  # finish the batch, checkpoint, stop
        if context.distributed.rank != 0:
            return added
        if self.args.metrics_out:
            added.callbacks["metric_series"] = MetricSeries(trial.run_log)
        unit = trial.batches_per_epoch() if self.plan.length.unit == "epochs" else 1
        shown = progress.Progress(
            context,
            self.plan.length.value * unit,
            trial.batches_per_epoch(),
            self.plan.hparams.global_batch_size,
        )
        added.callbacks["progress"] = shown
        added.before_batch.append(shown.before_batch)
        # The checkpoint this run continues from its own storage is the run's too: retention keeps
        # the newest of them, not every stop's.
        continued = (
            resumed.shown if resumed is not None and Path(resumed.shown).parent == self.storage else None
        )
        added.callbacks["retention"] = retention(self.source.exp_conf, trial.run_log, continued)
        return added

    def before_fit(
        self, trial: BuiltTrial, context: pytorch.PyTorchTrialContext, resumed: Resumed | None
    ) -> dict[str, Any] | None:
        """Once the trial is built, before any batch: the resumed checkpoint's data against this
        run's, a length the checkpoint has not reached yet, private storage with room for one
        more checkpoint. A result: the run had already finished (auto, latest)."""
        if resumed is not None:
            check_same_data(resumed.record, trial.train_set.sha256, self.args.allow_changed, resumed.shown)
            total = run_plan.total_batches(self.plan.length, trial.batches_per_epoch())
            done = finished_resume(self.flag, resumed, total)
            if done is not None:
                return done
        if context.distributed.rank == 0:
            prepare_local_storage(self.args.checkpoint_dir)
            check_free_space(self.args.checkpoint_dir, sum(p.numel() for p in trial.model.parameters()))
        return None

    # ----------------------------------------------------------------------------------------
    # Fit, and what the user is told.
    # ----------------------------------------------------------------------------------------

    def fit(
        self,
        trainer: pytorch.Trainer,
        trial: BuiltTrial,
        resumed: Resumed | None,
        stop: interruption.Interruption,
        rank: int,
    ) -> None:
        """Trainer.fit from the resumed copy's step (or the start); a stop or a failed checkpoint
        write becomes an Interrupted / ConfigError that says what was kept and how to continue."""
        before = {p.name for p in self.storage.iterdir()} if self.storage.is_dir() else set()
        storage_id, steps = None, 0
        if resumed is not None:
            resumed.copy.verify()  # the directory Determined reads next is still the one written
            storage_id, steps = det_internals.restore_id(resumed.copy.path), resumed.steps
        with det_internals.resume_at(steps), det_internals.code_copy_that_keeps_the_state(), stop:
            try:
                trainer.fit(**self.plan.fit_kwargs(storage_id, False))
            except interruption.StoppedNow:  # a second Ctrl-C
                raise interruption.Interrupted(130, None, trial.run_log.checkpoint, rank) from None
            except (OSError, RuntimeError) as err:
                if not checkpoint_write_failed(err):
                    raise
                done, scores = trial.run_log.steps_completed, trial.run_log.validation
                raise write_failure_error(err, self.args.checkpoint_dir, before, done, scores) from None
        if stop.stopped_at is not None:
            raise interruption.Interrupted(stop.exit_code(), stop.stopped_at, trial.run_log.checkpoint, rank)

    def report(self, slots: int, series: Any) -> None:
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
            **(series.series if isinstance(series, MetricSeries) else {}),
        }
        write_text_atomic(self.args.metrics_out, json.dumps(record, indent=1))


# --------------------------------------------------------------------------------------------
# The callbacks only a local run has (a master does their work on a cluster).
# --------------------------------------------------------------------------------------------


def retention(exp_conf: dict[str, Any], run_log: RunLog, continued: Path | None = None) -> LocalRetention:
    """checkpoint_storage's save_trial_latest / save_trial_best for a local run's checkpoints
    (`continued`: the checkpoint of this run it continues, counted as written before them)."""
    storage = exp_conf.get("checkpoint_storage") or {}
    searcher = exp_conf.get("searcher") or {}
    kept = LocalRetention(
        run_log,
        latest=int(storage.get("save_trial_latest", 1)),
        best=int(storage.get("save_trial_best", 1)),
        metric=searcher.get("metric", "f1"),
        smaller_is_better=bool(searcher.get("smaller_is_better", False)),
    )
    if continued is not None:
        record = json_record(continued)
        scores = record.get("validation") if isinstance(record.get("validation"), dict) else {}
        validated_there = record.get("validation_steps") == steps_completed(continued)
        value = scores.get(kept.metric) if validated_there else None
        kept.written.append((continued, float(value) if isinstance(value, (int, float)) else None))
    return kept


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
