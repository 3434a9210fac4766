"""The Determined PyTorchTrial: BERT (any AutoModelForQuestionAnswering) fine-tuned on SQuAD.

Everything configurable comes from the experiment config through config.run_plan(); the data
work (windows, cache, answer extraction) lives in data.py and scoring in squad_metric.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from pathlib import Path
from typing import Any

import determined as det
import numpy as np
import torch
from determined import pytorch

import config
import data
import det_internals
import modeling
import perf_metrics
import squad_metric
from modeling import FeatureDataset, model_inputs

logger = logging.getLogger("squad")


# --------------------------------------------------------------------------------------------
# Distributed evaluation: every rank scores its windows; the chief extracts and scores.
# --------------------------------------------------------------------------------------------


class SquadEvaluator(pytorch.MetricReducer):
    def __init__(self, trial: SquadTrial) -> None:
        self.trial = trial
        self.reset()

    def reset(self) -> None:  # at the start of each validation
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.started = time.perf_counter()

    def update(self, index: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> None:
        self.parts.append((index.cpu().numpy(), start.float().cpu().numpy(), end.float().cpu().numpy()))

    def per_slot_reduce(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return self.parts

    def cross_slot_reduce(self, per_slot: list[list[tuple]]) -> dict[str, Any]:
        if not self.trial.context.distributed.rank == 0:
            return {}  # only the chief reports; the other ranks skip the extraction
        parts = [p for slot in per_slot for p in slot]
        start, end = modeling.assemble_logits(parts, self.trial.val_features)
        scores = self.trial.score_logits(start, end)
        questions = len(self.trial.val_set.examples)
        return {**scores, **perf_metrics.validation_rates(time.perf_counter() - self.started, questions)}


# --------------------------------------------------------------------------------------------
# Optimizers and schedule.
# --------------------------------------------------------------------------------------------


def build_optimizer(
    model: torch.nn.Module, hp: config.Hyperparameters, lr: float, device: torch.device
) -> Any:
    """hp's optimizer at peak learning rate `lr` (RunPlan.learning_rate: the scaling rule applied)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        # No weight decay for biases and LayerNorm weights (the BERT recipe).
        (
            no_decay if name.endswith("bias") or "LayerNorm" in name or "norm" in name.lower() else decay
        ).append(param)
    groups = [
        {"params": decay, "weight_decay": hp.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    eps, betas = hp.adam_epsilon, (hp.adam_beta1, hp.adam_beta2)
    if hp.optimizer == "adamw":
        fused = device.type == "cuda"
        return torch.optim.AdamW(
            groups, lr=lr, betas=betas, eps=eps, fused=fused, foreach=None if fused else True
        )
    if hp.optimizer == "radam":
        return torch.optim.RAdam(
            groups, lr=lr, betas=betas, eps=eps, decoupled_weight_decay=True, foreach=True
        )
    import torch_optimizer

    return torch_optimizer.Lamb(groups, lr=lr, betas=betas, eps=eps)


def linear_warmup_decay(total_steps: int, warmup_steps: int) -> Any:
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def radam_rectifier(step: int, beta2: float) -> float:
    """RAdam's factor on its adaptive step at optimizer step `step` (from 1), as torch.optim.RAdam
    computes it. While rho_t <= 5 (the first 5 steps) torch takes an un-normalized momentum step
    instead, gradient-sized and so negligible next to an Adam step: counted as 0."""
    rho_inf = 2 / (1 - beta2) - 1
    decay = beta2**step
    rho_t = rho_inf - 2 * step * decay / (1 - decay)
    if rho_t <= 5:
        return 0.0
    return math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))


def radam_half_lr_step(beta2: float) -> int | None:
    """The first optimizer step at which RAdam's rectifier lets at least half the lr through; None
    when it never does (beta2 below ~0.71: rho_inf <= 5, torch never takes the adaptive step)."""
    if 2 / (1 - beta2) - 1 <= 5:
        return None
    step = 1
    while radam_rectifier(step, beta2) < 0.5:  # rises to 1 within ~10 / (1 - beta2) steps
        step += 1
    return step


def radam_step_share(total_steps: int, warmup_steps: int, beta2: float) -> float:
    """How far RAdam moves the weights over a run relative to AdamW at the same lr and schedule:
    the schedule-weighted mean of its rectifier (a built-in warm-up, thousands of steps long at
    the default beta2 0.999)."""
    schedule = linear_warmup_decay(total_steps, warmup_steps)
    weights = [schedule(step) for step in range(total_steps)]
    rectified = sum(w * radam_rectifier(step + 1, beta2) for step, w in enumerate(weights))
    return rectified / max(sum(weights), 1e-12)


# bench/lr_scaling.py (docs/scaling.md): RAdam trained level with AdamW where this share was 0.78 and
# above, 3.5 F1 behind at 0.63 and 11-28 behind at 0.23-0.35 (paired seeds, the embedded default).
RADAM_MIN_SHARE = 0.75
# the rectifier past half the lr after 16 steps instead of 556 (about a 10 % warm-up of a few hundred
# steps): the form multi_machine.yaml ships, with no linear warm-up on top
RADAM_SHORT_BETA2 = 0.95


def radam_warning(hp: config.Hyperparameters, total_steps: int, warmup_steps: int) -> str | None:
    """What to tell a user whose RAdam run is too short for its rectifier (None when it is not).
    bench/lr_scaling.py measures these forms against AdamW (docs/scaling.md)."""
    if hp.optimizer != "radam":
        return None
    share = radam_step_share(total_steps, warmup_steps, hp.adam_beta2)
    if share >= RADAM_MIN_SHARE:
        return None
    half = radam_half_lr_step(hp.adam_beta2)
    msg = (
        f"hyperparameters.optimizer radam with adam_beta2 {hp.adam_beta2:g} over this run's "
        f"{total_steps} optimizer steps: its rectifier keeps the step under half the learning rate "
        + (f"for the first {half - 1} steps" if half else "on every step (rho_inf <= 5)")
        + ", so the run moves the weights "
        f"{share:.2f}x as far as AdamW at the same learning rate and schedule"
        + (f", on top of warmup_ratio {hp.warmup_ratio:g}'s own warm-up" if warmup_steps else "")
        + ". "
    )
    short = radam_step_share(total_steps, warmup_steps, RADAM_SHORT_BETA2)
    if half is None:  # no length helps: the adaptive step never comes
        return msg + f"Set adam_beta2: {RADAM_SHORT_BETA2:g} ({short:.2f}x) or use optimizer: adamw."
    if hp.adam_beta2 > RADAM_SHORT_BETA2 and short >= RADAM_MIN_SHARE:
        return msg + (
            f"Set adam_beta2: {RADAM_SHORT_BETA2:g} ({short:.2f}x), train longer, or use optimizer: adamw."
        )
    return msg + "Train longer or use optimizer: adamw."


# --------------------------------------------------------------------------------------------
# The trial.
# --------------------------------------------------------------------------------------------


class SquadTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.run_log = RunLog(self)
        # What the caller adds before fit() (train.py: progress display, metric series).
        self.extra_callbacks: dict[str, pytorch.PyTorchCallback] = {}
        conf = context.get_experiment_config()
        self.plan = config.run_plan(conf, context.get_hparams(), context.distributed.size)
        # Windowing, evaluation batching, precision and extraction: what evaluation uses, what
        # every checkpoint's hf/ saves, and what predict.py loads -- one object.
        eval_batch = self.plan.data.eval_batch_size_per_slot(context.get_per_slot_batch_size())
        self.qa = modeling.QASettings.from_run(self.plan.data, self.plan.hparams, eval_batch)
        if self.plan.hparams.precision == "fp16" and context.device.type != "cuda":
            raise config.ConfigError(
                "hyperparameters.precision: fp16 needs a CUDA GPU (use bf16 or fp32 on CPU)."
            )
        self.load_data()
        model = self.build_model()
        self.build_optimization(model)
        self.evaluator = context.wrap_reducer(SquadEvaluator(self), for_training=False)
        agg = self.plan.aggregation_frequency
        self.perf = context.wrap_reducer(
            perf_metrics.TrainingThroughput(
                context.device, context.distributed.size, self.plan.hparams.global_batch_size * agg, agg
            ),
            for_validation=False,
        )

    def load_data(self) -> None:
        """SQuAD and its windowed features; the chief of each machine downloads and builds the
        caches, the other ranks wait on their locks."""
        settings, context = self.plan.data, self.context
        model_name = settings.pretrained_model
        self.tokenizer = data.load_tokenizer(model_name)
        self.spec = self.qa.window_spec
        cache_dir = Path(settings.cache_dir or data.default_download_dir() / "features")
        self.train_set = data.load_squad(settings.train_file, training=True)
        self.val_set = data.load_squad(settings.validation_file, training=False)
        for name, squad in (("train_file", self.train_set), ("validation_file", self.val_set)):
            if squad.version == "2.0" and settings.squad_version != "2.0":
                raise config.ConfigError(
                    f"data.{name} ({squad.path}) is SQuAD v2.0 but data.squad_version is 1.1; "
                    "set data.squad_version: 2.0."
                )
        if self.train_set.skipped and context.distributed.rank == 0:
            logger.warning(
                "skipped %d training questions whose answer is not at its answer_start: %s",
                len(self.train_set.skipped),
                self.train_set.skipped[:10],
            )
        self.train_features, train_cache = data.prepare_features(
            self.train_set, self.tokenizer, model_name, self.spec, "train", cache_dir
        )
        self.val_features, val_cache = data.prepare_features(
            self.val_set, self.tokenizer, model_name, self.spec, "validation", cache_dir
        )
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
        """The pretrained model, wrapped for Determined (DDP), compiled and compressed if asked;
        returns the unwrapped model (the optimizer takes its parameters)."""
        from transformers import AutoModelForQuestionAnswering

        hp, context, model_name = self.plan.hparams, self.context, self.plan.data.pretrained_model
        if context.device.type == "cuda":
            modeling.configure_cuda_math(hp.tf32)
        try:
            model = AutoModelForQuestionAnswering.from_pretrained(
                data.resolve_pretrained(model_name), attn_implementation=hp.attn_implementation
            )
        except (OSError, ValueError) as err:
            raise config.ConfigError(
                f"data.pretrained_model {model_name!r}: cannot load ({str(err).splitlines()[0]})"
            ) from None
        self.scaler = None
        if hp.precision == "fp16":
            self.scaler = context.wrap_scaler(torch.amp.GradScaler("cuda"))
        self.accepted = modeling.forward_params(model)
        self.model = context.wrap_model(model)
        if hp.torch_compile:
            self.model = torch.compile(self.model)
        if self.plan.gradient_compression and isinstance(
            self.model, torch.nn.parallel.DistributedDataParallel
        ):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            self.model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return model

    def build_optimization(self, model: torch.nn.Module) -> None:
        """Optimizer and linear warm-up / decay schedule, stepped once per optimizer step."""
        context = self.context
        self.optimizer = context.wrap_optimizer(
            build_optimizer(model, self.plan.hparams, self.plan.learning_rate, context.device),
            average_aggregated_gradients=self.plan.average_aggregated_gradients,
        )
        total = self.total_optimizer_steps()
        warmup = int(self.plan.hparams.warmup_ratio * total)
        self.total_steps, self.warmup_steps = total, warmup
        warning = radam_warning(self.plan.hparams, total, warmup)
        if warning and context.distributed.rank == 0:
            logger.warning(warning)
        self.lr_scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.LambdaLR(self.optimizer, linear_warmup_decay(total, warmup)),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP,
        )

    # Length bookkeeping: one epoch = the batches one rank sees, as Determined counts them.
    def batches_per_epoch(self) -> int:
        per_slot = math.ceil(len(self.train_features) / self.context.get_per_slot_batch_size())
        ranks = self.context.distributed.size
        return per_slot // ranks + int(per_slot % ranks > 0)

    def total_optimizer_steps(self) -> int:
        length = self.plan.length
        batches = length.value if length.unit == "batches" else length.value * self.batches_per_epoch()
        return max(1, batches // self.plan.aggregation_frequency)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        try:
            seed = self.context.get_trial_seed()  # on a cluster
        except det.errors.InternalException:
            seed = self.plan.seed  # local: reproducibility.experiment_seed
        hp = self.plan.hparams
        sampler, collate = modeling.training_batches(
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
        sampler, collate = modeling.evaluation_batches(
            self.val_features, self.qa.eval_batch_size, self.qa.pad_to_multiple_of
        )
        return pytorch.DataLoader(
            FeatureDataset(len(self.val_features)),
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=self.plan.data.num_workers,
        )

    def autocast(self) -> torch.autocast:
        return modeling.autocast(self.context.device.type, self.plan.hparams.precision)

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
        self.perf.batch_started()
        with self.accumulating(batch_idx):
            with self.autocast():
                loss = self.model(**model_inputs(batch, self.accepted)).loss
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

    def evaluate_batch(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, Any]:
        with self.autocast():
            out = self.model(**model_inputs(batch, self.accepted))
        self.evaluator.update(batch["feature_index"], out.start_logits, out.end_logits)
        return {"eval_windows": float(len(batch["feature_index"]))}

    def evaluation_reducer(self) -> dict[str, pytorch.Reducer]:
        return {"eval_windows": pytorch.Reducer.SUM}

    def score_logits(self, start: np.ndarray, end: np.ndarray) -> dict[str, Any]:
        answers = self.qa.extract_answers(self.val_set.examples, self.val_features, start, end)
        self.last_predictions = answers.text
        return squad_metric.score(self.val_set.examples, answers.text, self.qa.squad_version)

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        callbacks: dict[str, pytorch.PyTorchCallback] = {
            "hf_export": HFExport(self),
            "run_log": self.run_log,
            "rank_random_state": RankRandomState(self.context),
        }
        info = det_internals.cluster_trial()
        if info is not None:
            callbacks["searcher_stop"] = SearcherStop(self.context, info, self.run_log)
        return {**callbacks, **self.extra_callbacks}

    def get_batch_length(self, batch: dict[str, torch.Tensor]) -> int:
        return len(batch["input_ids"])


class RankRandomState(pytorch.PyTorchCallback):
    """Every rank's random state in the checkpoint; on a restart each rank takes back its own.

    Determined saves the chief's torch / NumPy / Python random state and restores it on every
    rank (pytorch/_pytorch_trial.py:1093-1096 and 1004-1008). The ranks draw different amounts --
    a dropout mask is as large as that rank's padded batch -- so after a restart the other ranks
    went on with the chief's stream and the run no longer matched an uninterrupted one. The states
    are gathered wherever a checkpoint can follow (the end of a training workload or a
    validation; nothing draws between there and the save) and restored after Determined's own
    (callbacks load after it, :1026-1030).
    """

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.ranks: list[dict[str, Any]] | None = None

    def _capture(self) -> dict[str, Any]:
        state = {"torch": torch.random.get_rng_state(), "numpy": np.random.get_state()}
        state["random"] = random.getstate()
        if self.context.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.context.device)
        return state

    def _gather(self) -> None:
        self.ranks = self.context.distributed.allgather(self._capture())

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self._gather()

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self._gather()

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

    def __init__(self, trial: SquadTrial) -> None:
        self.trial = trial
        self.validation: dict[str, Any] = {}
        self.checkpoint: str | None = None
        self.steps_completed = 0  # batches trained so far (a resumed run starts above zero)
        self.stopped_by_searcher = False
        self.last_train_loss: float | None = None

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        # Before the first batch (step-zero validation, or a resumed run whose final validation or
        # checkpoint is still pending) the count is where the run starts, not a batch index.
        self.steps_completed = first_batch_idx

    def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
        self.steps_completed = self.trial.context.current_train_batch() + 1
        if batch_metrics:
            self.last_train_loss = float(batch_metrics[-1]["loss"])

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.validation = dict(metrics)

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        self.checkpoint = str(checkpoint_dir)


class MetricSeries(pytorch.PyTorchCallback):
    """What Determined's master stores per report (steps, end time, metrics), kept locally when
    asked for (train.py --metrics-out), so scaling.py computes throughput the same way from a
    local run or a cluster's. Runs after RunLog, whose step count it uses."""

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


class HFExport(pytorch.PyTorchCallback):
    """Every checkpoint also holds hf/: save_pretrained model + tokenizer + QA settings."""

    def __init__(self, trial: SquadTrial) -> None:
        self.trial = trial

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        trial = self.trial
        modeling.export_hf(trial.model, trial.tokenizer, trial.qa, Path(checkpoint_dir))
