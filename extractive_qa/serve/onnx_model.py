"""A checkpoint's QA model as ONNX: export with dynamic batch and sequence axes (torch's exporter),
dynamic int8 quantization (ONNX Runtime's quantizer), and an ONNX Runtime runner that returns the
start/end logits the PyTorch model would, so predict.py answers with the same windowing and
extraction on either runtime. Files are written in place: export.py stages them in a temporary
directory and moves each one whole.

Needs the `export` extra (requirements-export.txt: onnx, onnxscript, onnxruntime); nothing in the
trial imports this module.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from extractive_qa.errors import DataError
from extractive_qa.io import model_files, reading

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAMES = ("start_logits", "end_logits")
ONNX_FILE = "model.onnx"
INT8_FILE = "model-int8.onnx"
RUNTIME_FILES = {"onnx": ONNX_FILE, "onnx-int8": INT8_FILE}
OPSET = 18
# fp32 ONNX Runtime vs PyTorch, largest absolute start/end logit difference on real windows:
# the kernels differ in summation order only (the measured differences: docs/results.md).
FP32_TOLERANCE = 1e-3
INSTALL_EXPORT = "pip install -r requirements-export.txt"

Inputs = dict[str, np.ndarray]
Logits = tuple[np.ndarray, np.ndarray]


def require_onnx(what: str) -> None:
    """A clear error, before any work, when the export extra is not installed."""
    missing = []
    for module in ("onnx", "onnxruntime", "onnxscript"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise DataError(f"{what} needs {', '.join(missing)} ({INSTALL_EXPORT}).")


def model_input_names(model: Any) -> list[str]:
    """The inputs this model's forward takes, in ONNX input order (DistilBERT: no token types)."""
    import inspect

    accepted = inspect.signature(model.forward).parameters
    return [name for name in INPUT_NAMES if name in accepted]


def _logits_only(model: Any, names: list[str]) -> Any:
    """A module whose forward(*inputs) returns the graph's two outputs, (start, end) logits."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.model(**dict(zip(names, inputs, strict=True)))
            return out.start_logits, out.end_logits

    return LogitsOnly().eval()


def model_to_export(hf: Path) -> Any:
    """The checkpoint's model as the ONNX graph is traced from: fp32, eval mode, and attention as
    explicit matrix products (`eager`) where the model has it -- ONNX Runtime runs that graph
    faster than the exporter's decomposition of SDPA (docs/results.md, Inference)."""
    try:
        model = model_files.load_qa_model(hf, attn_implementation="eager")
    except (ValueError, ImportError):  # a model without the eager implementation
        model = model_files.load_qa_model(hf)
    return model.float().eval()


def export_onnx(model: Any, sample: Inputs, out: Path) -> None:
    """Write `model` (eval mode, fp32) to `out` as one self-contained ONNX file, batch and
    sequence dynamic. `sample` is a real batch of windows (at least 2 x 2: the exporter would fix
    an axis of size 1)."""
    import torch

    names = [name for name in model_input_names(model) if name in sample]  # RoBERTa: no token types fed
    wrapper = _logits_only(model, names)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    args = tuple(torch.from_numpy(sample[name]) for name in names)
    try:
        _export(
            wrapper, args, str(out), dynamo=True, opset_version=OPSET, external_data=False,
            input_names=names, output_names=list(OUTPUT_NAMES),
            dynamic_shapes=(tuple({0: batch, 1: sequence} for _ in names),), verbose=False,
        )  # fmt: skip
    except Exception as err:  # the exporter raises many kinds; all mean "this model does not export"
        while err.__cause__ is not None:  # the exporter wraps the reason in a generic step message
            err = err.__cause__
        reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise DataError(f"torch.onnx.export cannot export {type(model).__name__} ({reason}).") from None
    finally:
        model.eval()  # the exporter leaves modules in training mode


def _export(*args: Any, **kwargs: Any) -> None:
    """torch.onnx.export without its progress chatter (stdout's last line is the caller's JSON)
    and its notes on optional operators and axis names."""
    import torch

    with _quiet("torch.onnx"):
        torch.onnx.export(*args, **kwargs)


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def quantize_int8(source: Path, out: Path) -> None:
    """Dynamic int8 quantization of the weights of `source`'s matrix products (activations stay
    fp32 and are quantized per batch at run time): ONNX Runtime's quantize_dynamic."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet(""):  # its advice to pre-process first is for models with shape inference gaps
        quantize_dynamic(source, out, weight_type=QuantType.QInt8)


class OnnxLogits:
    """ONNX Runtime on the CPU: inputs as the Collator builds them -> fp32 logits."""

    def __init__(self, path: Path, threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        try:
            model = reading.read_bytes(path, reading.WEIGHTS)  # the bytes ONNX Runtime then parses
            self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        except reading.UnreadableFile:
            raise
        except Exception as err:  # a damaged or foreign file: ONNX Runtime's own error kinds
            reason = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            raise DataError(f"{path}: ONNX Runtime cannot load it ({reason}); export it again.") from None
        self.names = [i.name for i in self.session.get_inputs()]
        outputs = [o.name for o in self.session.get_outputs()]
        # export_onnx's names: a model with other inputs or outputs would fail inside ONNX Runtime
        # at the first batch (or be fed the wrong tensors) -- named here instead.
        if not set(self.names) <= set(INPUT_NAMES) or "input_ids" not in self.names:
            raise DataError(
                f"{path}: its inputs are {self.names}, not export.py's ({', '.join(INPUT_NAMES)}); "
                "export it again with export.py."
            )
        if not set(OUTPUT_NAMES) <= set(outputs):
            raise DataError(
                f"{path}: its outputs are {outputs}, not export.py's ({', '.join(OUTPUT_NAMES)}); "
                "export it again with export.py."
            )

    def __call__(self, inputs: dict[str, Any]) -> Logits:
        feed = {name: np.asarray(inputs[name], dtype=np.int64) for name in self.names}
        start, end = self.session.run(list(OUTPUT_NAMES), feed)
        return start.astype(np.float32, copy=False), end.astype(np.float32, copy=False)


def max_logit_difference(
    batches: Sequence[dict[str, Any]],
    expected: Sequence[Logits],
    candidate: Callable[[dict[str, Any]], Logits],
) -> float:
    """The largest absolute start/end logit difference between `candidate`'s logits on `batches`
    and `expected` (the reference's on the same batches, computed once for every candidate) over
    the attended positions (padding positions carry no answer and are never read); infinite where
    either side gives a NaN or an infinity (max() would keep the last finite value past a NaN, so
    a check against a tolerance could never fail)."""
    worst = 0.0
    for batch, (ref_start, ref_end) in zip(batches, expected, strict=True):
        start, end = candidate(batch)
        attended = np.asarray(batch["attention_mask"], dtype=bool)
        for a, b in ((ref_start, start), (ref_end, end)):
            difference = float(np.abs(a - b)[attended].max())
            if not np.isfinite(difference):
                return float("inf")
            worst = max(worst, difference)
    return worst
