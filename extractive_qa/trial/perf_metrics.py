"""What each training report's window ran at, measured on the wall clock, for the WebUI.

The metrics a PyTorchTrial's train_batch returns are averaged per batch and then across ranks
(determined/pytorch/_pytorch_trial.py:165-180, _combine_and_average_training_metrics), which is
wrong for a rate. A MetricReducer registered for training is instead reset when each training
window starts (_pytorch_trial.py:521, reset_reducers at the top of _train_with_boundaries) and
reduced once at its end, across ranks, into the same report (:178-180, then
report_training_metrics -> group "training"): the WebUI charts these beside `loss` and `lr` and
overlays them across trials and experiments. Validation (before or after) is outside the window.

Training (one prefix, units in the names):
  perf_samples_per_s           samples of all ranks / window seconds (the slowest rank's)
  perf_samples_per_s_per_slot  the same per slot: the scaling efficiency's numerator
  perf_tokens_per_s            real (non-pad) tokens of all ranks / window seconds
  perf_padding_frac            pad tokens / all tokens the model ran over
  perf_step_s                  window seconds / optimizer steps (batches / aggregation)
  perf_data_wait_frac          share of the window outside train_batch (fetching and moving the
                               next batch, Determined's loop), mean over ranks
  perf_samples_per_step        global batch x aggregation: what one optimizer step sees
  perf_peak_mem_gib            peak allocated accelerator memory in the window, max over ranks
                               (CUDA only)
Validation adds perf_val_s and perf_val_questions_per_s (evaluation.SquadEvaluator).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from determined import pytorch


class TrainingThroughput(pytorch.MetricReducer):
    """Per rank: counts and clocks of the current window; across ranks: the window's rates.

    Token counts stay on the device until the window ends, so measuring costs no synchronisation
    per batch on a GPU."""

    def __init__(self, device: torch.device, slots: int, samples_per_step: int, aggregation: int) -> None:
        self.device = device
        self.slots = slots
        self.samples_per_step = samples_per_step
        self.aggregation = aggregation
        # The whole run so far (every window, never reset): train.py's final samples/s is the
        # same measurement the WebUI charts, pooled.
        self.run_seconds = 0.0
        self.run_samples = 0
        self.reset()

    def reset(self) -> None:
        self.start = self.batch_end = time.perf_counter()
        self.batches = self.samples = self.all_tokens = 0
        self.wait_s = 0.0
        self.real_tokens = torch.zeros((), dtype=torch.int64, device=self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def batch_started(self) -> None:
        self.wait_s += time.perf_counter() - self.batch_end

    def batch_ended(self, attention_mask: torch.Tensor) -> None:
        self.batches += 1
        self.samples += attention_mask.shape[0]
        self.all_tokens += attention_mask.numel()
        self.real_tokens += attention_mask.sum()
        self.batch_end = time.perf_counter()

    def per_slot_reduce(self) -> tuple[float, int, int, int, int, float, float | None]:
        peak = None
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
        seconds = time.perf_counter() - self.start
        real = int(self.real_tokens)
        return seconds, self.batches, self.samples, real, self.all_tokens, self.wait_s, peak

    def cross_slot_reduce(self, per_slot: list[tuple]) -> dict[str, float]:
        seconds, batches, samples, real, tokens, wait, peak = zip(*per_slot, strict=True)
        window = max(max(seconds), 1e-9)
        if not sum(samples):
            return {}
        self.run_seconds += window
        self.run_samples += sum(samples)
        waiting = [w / max(s, 1e-9) for w, s in zip(wait, seconds, strict=True)]
        out = {
            "perf_samples_per_s": sum(samples) / window,
            "perf_samples_per_s_per_slot": sum(samples) / window / self.slots,
            "perf_tokens_per_s": sum(real) / window,
            "perf_padding_frac": 1.0 - sum(real) / max(sum(tokens), 1),
            "perf_step_s": window / max(batches[0] / self.aggregation, 1e-9),
            "perf_data_wait_frac": sum(waiting) / len(waiting),
            "perf_samples_per_step": float(self.samples_per_step),
        }
        if peak[0] is not None:
            out["perf_peak_mem_gib"] = max(peak)
        return out


def run_rates(perf: TrainingThroughput) -> dict[str, float]:
    """Training seconds (the windows', so without validation and checkpoints) and samples/s."""
    return {
        "train_seconds": round(perf.run_seconds, 2),
        "samples_per_s": round(perf.run_samples / max(perf.run_seconds, 1e-9), 2),
    }


def validation_rates(seconds: float, questions: int) -> dict[str, Any]:
    return {"perf_val_s": seconds, "perf_val_questions_per_s": questions / max(seconds, 1e-9)}
