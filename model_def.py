"""The Determined PyTorchTrial: BERT (any AutoModelForQuestionAnswering) fine-tuned on SQuAD.

Everything configurable comes from the experiment config through run_plan.run_plan(); the data
comes from data.py; batches, optimizer, evaluation and callbacks from extractive_qa/.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

import determined as det
import numpy as np
import torch
from determined import pytorch

import data
from extractive_qa import det_internals
from extractive_qa.config import run_plan
from extractive_qa.data.batching import (
    FeatureDataset,
    evaluation_batches,
    model_inputs,
    training_batches,
)
from extractive_qa.data.features import vocabulary_sha256
from extractive_qa.errors import ConfigError
from extractive_qa.qa import arithmetic, model_card, qa_settings
from extractive_qa.resume.identity import run_identity
from extractive_qa.trial import dropout_masks, model_setup, perf_metrics, span_loss
from extractive_qa.trial.callbacks import (
    CheckpointRecord,
    HFExport,
    RankRandomState,
    RunLog,
    SearcherStop,
    TrialExtras,
)
from extractive_qa.trial.evaluation import SquadEvaluator, score_validation
from extractive_qa.trial.optimization import (
    build_optimizer,
    learning_rate_warning,
    linear_warmup_decay,
    radam_warning,
)

logger = logging.getLogger("squad")


class SquadTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.run_log = RunLog(context)
        self.rank_random_state = RankRandomState(context)
        conf = context.get_experiment_config()
        self.experiment_name = conf.get("name")
        self.plan = run_plan.run_plan(conf, context.get_hparams(), context.distributed.size)
        # Windowing, evaluation batching, precision and extraction: what evaluation uses, what
        # every checkpoint's hf/ saves, and what predict.py loads -- one object.
        eval_batch = self.plan.data.eval_batch_size_per_slot(context.get_per_slot_batch_size())
        # `auto` is settled here, where the device is known; the checkpoint saves the result.
        self.precision, self.precision_why = arithmetic.resolve_precision(
            self.plan.hparams.precision, context.device.type
        )
        self.qa = dataclasses.replace(
            qa_settings.QASettings.from_run(self.plan.data, self.plan.hparams, eval_batch),
            precision=self.precision,
        )
        if self.precision == "fp16" and context.device.type != "cuda":
            raise ConfigError("hyperparameters.precision: fp16 needs a CUDA GPU (use bf16 or fp32 on CPU).")
        self.load_data()
        self.qa = dataclasses.replace(self.qa, vocabulary_sha256=vocabulary_sha256(self.tokenizer))
        self.latest_outputs: Any = None  # writes the latest validation's outputs (save_predictions)
        model = self.build_model()
        self.build_optimization(model)
        self.evaluator = context.wrap_reducer(
            SquadEvaluator(
                context.distributed.rank, self.val_features, len(self.val_set.examples), self.score_logits
            ),
            for_training=False,
        )
        agg = self.plan.aggregation_frequency
        self.perf = context.wrap_reducer(
            perf_metrics.TrainingThroughput(
                context.device, context.distributed.size, self.plan.hparams.global_batch_size * agg, agg
            ),
            for_validation=False,
        )
        self.extras = TrialExtras()

    def add_extras(self, extras: TrialExtras) -> None:
        """What the run adds before fit (a local run: progress display, Ctrl-C, checkpoint
        retention, metric series; a cluster trial: nothing): callbacks after the trial's own and
        hooks before each batch."""
        self.extras = extras

    def load_data(self) -> None:
        """SQuAD and its windowed features (data.py); the chief of each machine downloads and
        builds the caches, the other ranks wait on their locks."""
        loaded = data.load_run_data(self.plan.data, self.qa.window_spec, self.context.distributed.rank)
        self.tokenizer, self.spec = loaded.tokenizer, self.qa.window_spec
        self.train_set, self.val_set = loaded.train_set, loaded.val_set
        self.train_features, self.val_features = loaded.train_features, loaded.val_features
        train_cache, val_cache, cache_dir = loaded.train_cache, loaded.val_cache, loaded.cache_dir
        context = self.context
        logger.info(
            "rank %d of %d: features train %s / validation %s in %s; aggregation_frequency=%d "
            "optimizer=%s gradient_compression=%s global_batch_size=%d learning_rate=%.6g "
            "(lr_scaling %s from %g at %s samples per step) batching=%s",
            context.distributed.rank, context.distributed.size, train_cache, val_cache,
            cache_dir.resolve(), self.plan.aggregation_frequency, self.plan.hparams.optimizer,
            self.plan.gradient_compression, self.plan.hparams.global_batch_size, self.plan.learning_rate,
            self.plan.hparams.lr_scaling, self.plan.hparams.learning_rate,
            self.plan.hparams.reference_batch_size, self.plan.hparams.batching,
        )  # fmt: skip

    def build_model(self) -> torch.nn.Module:
        """The pretrained model, wrapped for Determined (DDP), compiled and compressed if asked
        (model_setup); returns the unwrapped model (the optimizer takes its parameters)."""
        prepared = model_setup.prepare_model(self.context, self.plan, self.precision, self.precision_why)
        self.model, self.scaler, self.accepted = prepared.wrapped, prepared.scaler, prepared.accepted
        return prepared.model

    def build_optimization(self, model: torch.nn.Module) -> None:
        """Optimizer and linear warm-up / decay schedule, stepped once per optimizer step."""
        context = self.context
        self.optimizer = context.wrap_optimizer(
            build_optimizer(model, self.plan.hparams, self.plan.learning_rate, context.device),
            average_aggregated_gradients=self.plan.average_aggregated_gradients,
        )
        total = self.total_optimizer_steps()
        warmup = int(self.plan.hparams.warmup_ratio * total)
        self.answerable_first_steps = int(self.plan.hparams.answerable_first * total)
        rate = learning_rate_warning(self.plan.learning_rate)
        for warning in filter(None, (radam_warning(self.plan.hparams, total, warmup), rate)):
            if context.distributed.rank == 0:
                logger.warning(warning)
        self.lr_scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.LambdaLR(self.optimizer, linear_warmup_decay(total, warmup)),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP,
        )

    # Length bookkeeping, counted as the dry run counts it (extractive_qa/dry_run.py).
    def batches_per_epoch(self) -> int:
        per_slot_batch, ranks = self.context.get_per_slot_batch_size(), self.context.distributed.size
        return run_plan.batches_per_epoch(len(self.train_features), per_slot_batch, ranks)

    def total_optimizer_steps(self) -> int:
        batches = run_plan.total_batches(self.plan.length, self.batches_per_epoch())
        return run_plan.optimizer_steps(batches, self.plan.aggregation_frequency)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        try:
            seed = self.context.get_trial_seed()  # on a cluster
        except det.errors.InternalException:
            seed = self.plan.seed  # local: reproducibility.experiment_seed
        hp = self.plan.hparams
        sampler, collate = training_batches(
            self.train_features,
            self.context.get_per_slot_batch_size(),
            batching=hp.batching,
            multiple=hp.pad_to_multiple_of,
            seed=seed,
            ranks=self.context.distributed.size,
        )
        return pytorch.DataLoader(
            FeatureDataset(len(self.train_features)),
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=self.plan.data.num_workers,
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        sampler, collate = evaluation_batches(
            self.val_features, self.qa.eval_batch_size, self.qa.pad_to_multiple_of
        )
        return pytorch.DataLoader(
            FeatureDataset(len(self.val_features)),
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=self.plan.data.num_workers,
        )

    def autocast(self) -> torch.autocast:
        return arithmetic.autocast(self.context.device.type, self.precision)

    def accumulating(self, batch_idx: int) -> contextlib.AbstractContextManager:
        """DDP's no_sync() for batches that only accumulate gradients (aggregation_frequency > 1).

        DDP decides in *forward* whether the coming backward all-reduces. Determined 0.38 enters
        no_sync() around backward only, so without this every batch still all-reduces
        (bench/aggregation.py measured it); with it, only the optimizer-step batches do.
        """
        ddp = getattr(self.model, "_orig_mod", self.model)  # under torch.compile (not unwrap: DDP wanted)
        last_of_step = (batch_idx + 1) % self.plan.aggregation_frequency == 0
        if last_of_step or not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext()
        return ddp.no_sync()

    def train_batch(self, batch: dict[str, torch.Tensor], epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        for hook in self.extras.before_batch:
            hook(batch_idx)
        self.perf.batch_started()
        hp = self.plan.hparams
        masks = dropout_masks.masks(hp.dropout_masks, self.context.device.type, hp.torch_compile)
        with self.accumulating(batch_idx):
            with masks, self.autocast():
                loss = self.span_loss(batch, batch_idx)
            self.context.backward(self.scaler.scale(loss) if self.scaler else loss)
        max_norm = self.plan.hparams.max_grad_norm

        def clip(params: Any) -> None:
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            if max_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, max_norm)

        lr = self.optimizer.param_groups[0]["lr"]  # the rate this step is taken with
        self.context.step_optimizer(self.optimizer, clip_grads=clip, scaler=self.scaler)
        if self.scaler and (batch_idx + 1) % self.plan.aggregation_frequency == 0:
            self.scaler.update()
        self.perf.batch_ended(batch["attention_mask"])
        return {"loss": loss.detach().float(), "lr": lr}

    def span_loss(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The model's own loss, or with no-answer windows weighted (span_loss.py)."""
        hp = self.plan.hparams
        step = batch_idx // self.plan.aggregation_frequency
        weight = span_loss.no_answer_weight(step, self.answerable_first_steps, hp.no_answer_loss_weight)
        inputs = model_inputs(batch, self.accepted)
        if weight == 1.0:
            return self.model(**inputs).loss
        starts, ends = inputs.pop("start_positions"), inputs.pop("end_positions")
        out = self.model(**inputs)
        cls_index = self.train_features.cls_index
        return span_loss.weighted_span_loss(out.start_logits, out.end_logits, starts, ends, cls_index, weight)

    def evaluate_batch(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, Any]:
        with self.autocast():
            out = self.model(**model_inputs(batch, self.accepted))
        self.evaluator.update(batch["feature_index"], out.start_logits, out.end_logits)
        return {"eval_windows": float(len(batch["feature_index"]))}

    def evaluation_reducer(self) -> dict[str, pytorch.Reducer]:
        return {"eval_windows": pytorch.Reducer.SUM}

    def score_logits(self, start: np.ndarray, end: np.ndarray) -> dict[str, Any]:
        """EM/F1 of the validation set (the chief); v2.0 adds best_* and keeps the tuned threshold."""
        metrics, self.qa, writer = score_validation(
            self.qa, self.val_set.examples, self.val_features, start, end, self.plan.data.save_predictions
        )
        self.latest_outputs = writer or self.latest_outputs
        return metrics

    def model_card(self) -> str:
        """hf/README.md of the checkpoint being written: the run's settings, data and latest scores."""
        log = self.run_log
        facts = model_card.facts_from_run(
            self.plan, self.experiment_name, self.train_set, self.val_set, self.precision,
            log.steps_completed, log.validation, log.validation_steps,
        )  # fmt: skip
        return model_card.render(facts)

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        callbacks: dict[str, pytorch.PyTorchCallback] = {
            "hf_export": HFExport(
                self.model, self.tokenizer, lambda: self.qa, self.model_card, lambda: self.latest_outputs
            ),
            "run_log": self.run_log,
            "rank_random_state": self.rank_random_state,
            "checkpoint_record": CheckpointRecord(
                run_identity(self.plan, self.experiment_name),
                {self.plan.length.unit: self.plan.length.value},
                self.train_set.sha256,
                self.run_log,
            ),
        }
        info = det_internals.cluster_trial()
        if info is not None:
            callbacks["searcher_stop"] = SearcherStop(self.context, info, self.run_log)
        return {**callbacks, **self.extras.callbacks}

    def get_batch_length(self, batch: dict[str, torch.Tensor]) -> int:
        return len(batch["input_ids"])
