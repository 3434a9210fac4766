"""A checkpoint's model answering questions with evaluation's windowing, batching, arithmetic and
extraction, so that scoring its answers gives the EM/F1 the run reported. The model runs in
PyTorch, or in ONNX Runtime from a directory export.py wrote (serve.onnx_model).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from extractive_qa.data import squad_files
from extractive_qa.data.batching import assemble_logits, evaluation_batches, forward_params, model_inputs
from extractive_qa.data.features import Features, build_features
from extractive_qa.errors import DataError
from extractive_qa.qa import mixed_precision
from extractive_qa.qa.answers import Answers
from extractive_qa.qa.outputs import NBest
from extractive_qa.serve.model_dir import ModelDir

Logits = tuple[np.ndarray, np.ndarray]


def torch_device(device: str | None) -> Any:
    """--device as torch's: cpu or cuda (default: cuda when torch can use one)."""
    import torch

    try:
        chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        raise DataError(f"--device {device!r}: not a device; use cpu or cuda.") from None
    if chosen.type not in ("cpu", "cuda"):
        raise DataError(f"--device {device!r}: predict.py runs on cpu or cuda.")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise DataError(
            "--device cuda: this torch has no usable CUDA GPU (a CPU build, or no GPU visible); "
            "use --device cpu."
        )
    return chosen


class Predictor:
    """A checkpoint's model with evaluation's windowing, batching, arithmetic and extraction. The
    model runs in PyTorch (`runtime="torch"`) or, from a directory export.py wrote, in ONNX
    Runtime (`onnx`: fp32, `onnx-int8`: int8 weights); windowing and extraction are the same."""

    def __init__(
        self,
        checkpoint: str,
        device: str | None = None,
        batch_size: int | None = None,
        precision: str | None = None,
        runtime: str = "torch",
        null_threshold: str | None = None,
    ):
        # Every check of the folder, and of --null-threshold against it: serve.model_dir.
        folder = ModelDir(checkpoint, runtime, null_threshold)
        self.hf, self.runtime, self.settings = folder.hf, runtime, folder.settings
        self.null_threshold, self.tokenizer = folder.null_threshold, folder.tokenizer
        self.spec = self.settings.window_spec
        self.batch_size = batch_size or self.settings.eval_batch_size
        if runtime != "torch":
            self.forward = self._onnx_model(folder, device, precision)
        else:
            self.forward = self._torch_model(folder, device, precision)

    def _onnx_model(
        self, folder: ModelDir, device: str | None, precision: str | None
    ) -> Callable[[dict], Logits]:
        from extractive_qa.serve import onnx_model

        if device not in (None, "cpu"):
            raise DataError(f"--runtime {self.runtime} runs on the CPU (ONNX Runtime's CPU provider).")
        if precision not in (None, "auto", "fp32"):
            raise DataError(
                f"--precision {precision}: the ONNX models compute in fp32 ({onnx_model.ONNX_FILE}) or "
                f"with int8 weights ({onnx_model.INT8_FILE}); use --runtime torch for {precision}."
            )
        onnx_model.require_onnx(f"--runtime {self.runtime}")
        self.device, self.precision = "cpu", "fp32"
        return onnx_model.OnnxLogits(folder.onnx_file())

    def _torch_model(
        self, folder: ModelDir, device: str | None, precision: str | None
    ) -> Callable[[dict], Logits]:
        import torch

        self.device = torch_device(device)
        # The precision evaluation ran with, so the logits -- and EM/F1 -- are the trial's; `auto`
        # picks for this device as a run does.
        self.precision, _ = mixed_precision.resolve_precision(
            precision or self.settings.precision, self.device.type
        )
        if self.precision == "fp16" and self.device.type != "cuda":
            print("predict: fp16 autocast needs CUDA; computing in fp32 on the CPU.", file=sys.stderr)
            self.precision = "fp32"
        if self.device.type == "cuda":
            mixed_precision.configure_cuda_math(self.settings.tf32)
        model = folder.torch_model()
        if self.precision in mixed_precision.AUTOCAST_DTYPES:
            mixed_precision.fp32_logits(model)
        self.model = model.to(self.device).eval()
        accepted = forward_params(self.model)

        def forward(batch: dict) -> Logits:
            inputs = model_inputs(batch, accepted)
            with torch.inference_mode(), mixed_precision.autocast(self.device.type, self.precision):
                out = self.model(**{k: v.to(self.device) for k, v in inputs.items()})
            return out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()

        return forward

    def batches(self, features: Features) -> Iterator[dict]:
        """The windows in evaluation's batches (sorted by length, padded as it padded)."""
        sampler, collate = evaluation_batches(features, self.batch_size, self.settings.pad_to_multiple_of)
        for indices in sampler.batches(0):
            yield collate(indices.tolist())

    def logits(self, features: Features) -> tuple[np.ndarray, np.ndarray]:
        """Start/end logits of every window, batched exactly like the trial's evaluation."""
        parts = []
        for batch in self.batches(features):
            start, end = self.forward(batch)
            parts.append((batch["feature_index"].numpy(), start, end))
        return assemble_logits(parts, features)

    def answer(self, examples: Sequence[squad_files.Example]) -> Answers:
        return self.answer_with_nbest(examples, nbest=False)[0]

    def answer_with_nbest(
        self, examples: Sequence[squad_files.Example], nbest: bool = True
    ) -> tuple[Answers, NBest | None]:
        """The answers, and (`nbest`) each question's n-best spans from the same logits."""
        features = self.features(examples)
        start, end = self.logits(features)
        answers = self.settings.extract_answers(examples, features, start, end, self.null_threshold)
        return answers, self.settings.nbest(examples, features, start, end) if nbest else None

    def features(self, examples: Sequence[squad_files.Example]) -> Features:
        return build_features(examples, self.tokenizer, self.spec, labels=False, offsets=True)
