"""The Determined PyTorchTrial: BERT (an AutoModelForQuestionAnswering) fine-tuned on SQuAD.

Everything configurable comes from the experiment config through run_plan.run_plan(); the data
comes from data.py; batches, optimizer, evaluation and callbacks from extractive_qa/.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import numpy as np
import torch
from determined import pytorch

import data
from extractive_qa import det_internals
from extractive_qa.config import run_plan
from extractive_qa.data.batching import model_inputs
from extractive_qa.data.features import vocabulary_sha256
from extractive_qa.errors import ConfigError
from extractive_qa.qa import mixed_precision, model_card, qa_settings
from extractive_qa.resume.identity import run_identity, run_settings
from extractive_qa.trial import dropout_masks, model_setup, perf_metrics, span_loss
from extractive_qa.trial.callbacks import (
    CheckpointRecord,
    HFExport,
    RankRandomState,
    RecipeOptions,
    RunLog,
    TrialExtras,
)
from extractive_qa.trial.evaluation import SquadEvaluator, score_validation
from extractive_qa.trial.finite_guard import FiniteGuard, FiniteState
from extractive_qa.trial.optimization import gradient_clipping, wrapped_optimization
from extractive_qa.trial.optimizer_recipes import learning_rate_warning, radam_warning

logger = logging.getLogger("squad")


class SquadTrial(pytorch.PyTorchTrial):
    extras: TrialExtras  # from the run's driver (add_extras), before fit

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.run_log = RunLog(context)
        conf = context.get_experiment_config()
        self.experiment_name = conf.get("name")
        self.plan = run_plan.run_plan(conf, context.get_hparams(), context.distributed.size)
        self.rank_random_state = RankRandomState(context, self.plan.collective_timeout_s)
        # Windowing, evaluation batching, precision and extraction: what evaluation uses, what
        # every checkpoint's hf/ saves, and what predict.py loads -- one object.
        eval_batch = self.plan.data.eval_batch_size_per_slot(context.get_per_slot_batch_size())
        # `auto` is settled here, where the device is known; the checkpoint saves the result.
        self.precision, self.precision_why = mixed_precision.resolve_precision(
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
        rank, size, agg = context.distributed.rank, context.distributed.size, self.plan.aggregation_frequency
        scorer = SquadEvaluator(rank, self.val_features, len(self.val_set.examples), self.score_logits)
        self.evaluator = context.wrap_reducer(scorer, for_training=False)
        samples_per_step = self.plan.hparams.global_batch_size * agg
        throughput = perf_metrics.TrainingThroughput(context.device, size, samples_per_step, agg)
        self.perf = context.wrap_reducer(throughput, for_validation=False)

    def add_extras(self, extras: TrialExtras) -> None:
        """What differs by where the trial runs, from its driver before fit (callbacks.TrialExtras):
        the data order's seed, what a divergence ends in, callbacks, hooks before each batch."""
        self.extras = extras
        self.finite = FiniteGuard(self.plan.hparams, self.plan.learning_rate, extras.end_diverged,
                                  loss_scaled=self.scaler is not None)  # fmt: skip

    def load_data(self) -> None:
        """SQuAD and its windowed features (data.py); the chief of each machine downloads and
        builds the caches, the other ranks wait on their locks."""
        loaded = data.load_run_data(self.plan.data, self.qa.window_spec, self.context.distributed.rank)
        self.tokenizer, self.spec = loaded.tokenizer, self.qa.window_spec
        self.train_set, self.val_set = loaded.train_set, loaded.val_set
        self.train_features, self.val_features = loaded.train_features, loaded.val_features
        rank, size, where = self.context.distributed.rank, self.context.distributed.size, loaded.cache_dir
        logger.info("rank %d of %d: features train %s / validation %s in %s; %s", rank, size,
                    loaded.train_cache, loaded.val_cache, where.resolve(), self.plan.summary())  # fmt: skip

    def build_model(self) -> torch.nn.Module:
        """The pretrained model, wrapped for Determined (DDP), compiled and compressed if asked
        (model_setup); returns the unwrapped model (the optimizer takes its parameters)."""
        prepared = model_setup.prepare_model(self.context, self.plan, self.precision, self.precision_why)
        self.model, self.scaler, self.accepted = prepared.wrapped, prepared.scaler, prepared.accepted
        return prepared.model

    def build_optimization(self, model: torch.nn.Module) -> None:
        """Optimizer and linear warm-up / decay schedule, stepped once per optimizer step; the chief
        warns when the settings fall short (optimizer_recipes)."""
        total, hp = self.total_optimizer_steps(), self.plan.hparams
        warmup, self.answerable_first_steps = int(hp.warmup_ratio * total), int(hp.answerable_first * total)
        self.optimizer, self.lr_scheduler, self.schedule = wrapped_optimization(
            self.context, self.plan, model, total, warmup
        )
        warnings = (radam_warning(hp, total, warmup), learning_rate_warning(self.plan.learning_rate))
        for warning in filter(None, warnings if self.context.distributed.rank == 0 else ()):
            logger.warning(warning)

    # Length bookkeeping, counted as the dry run counts it (extractive_qa/dry_run.py).
    def batches_per_epoch(self) -> int:
        per_slot_batch, ranks = self.context.get_per_slot_batch_size(), self.context.distributed.size
        return run_plan.batches_per_epoch(len(self.train_features), per_slot_batch, ranks)

    def total_optimizer_steps(self) -> int:
        batches = run_plan.total_batches(self.plan.length, self.batches_per_epoch())
        return run_plan.optimizer_steps(batches, self.plan.aggregation_frequency)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        context, plan = self.context, self.plan
        return data.training_loader(
            self.train_features, context.get_per_slot_batch_size(), plan.hparams, self.extras.seed,
            context.distributed.size, plan.data.num_workers,
        )  # fmt: skip

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        qa = self.qa
        return data.validation_loader(
            self.val_features, qa.eval_batch_size, qa.pad_to_multiple_of, self.plan.data.num_workers
        )

    def autocast(self) -> torch.autocast:
        return mixed_precision.autocast(self.context.device.type, self.precision)

    def train_batch(self, batch: dict[str, torch.Tensor], epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        for hook in self.extras.before_batch:
            hook(batch_idx)
        self.perf.batch_started()
        hp = self.plan.hparams
        masks = dropout_masks.masks(hp.dropout_masks, self.context.device.type, hp.torch_compile)
        with det_internals.no_sync_unless_stepping(self.model, batch_idx, self.plan.aggregation_frequency):
            with masks, self.autocast():
                loss = self.span_loss(batch, batch_idx)
            self.context.backward(self.scaler.scale(loss) if self.scaler else loss)
        norm_check = functools.partial(self.finite.gradient_norm, loss=loss.detach(), batch_idx=batch_idx)
        clip = gradient_clipping(self.optimizer, self.scaler, self.plan.hparams.max_grad_norm, norm_check)
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
            "finite_state": FiniteState(self.finite, self.model, self.optimizer),  # first: before any write
            "recipe_options": RecipeOptions(self.optimizer, self.schedule),
            "hf_export": HFExport(
                self.model, self.tokenizer, lambda: self.qa, self.model_card, lambda: self.latest_outputs
            ),
            "run_log": self.run_log,
            "rank_random_state": self.rank_random_state,
            "checkpoint_record": CheckpointRecord(
                run_identity(self.plan, self.experiment_name),
                run_settings(self.plan),
                {self.plan.length.unit: self.plan.length.value},
                self.train_set.sha256,
                self.run_log,
            ),
        }
        return {**callbacks, **self.extras.callbacks}

    def get_batch_length(self, batch: dict[str, torch.Tensor]) -> int:
        return len(batch["input_ids"])
