"""A checkpoint's model folder for answering: where it is, and every check of what it holds.

Where: a checkpoint directory train.py or a cluster wrote, its hf/ export, a directory export.py
wrote, a Determined checkpoint UUID (downloaded through the Determined SDK when a master is
reachable) or a checkpoint's s3:// or gs:// URL (`find_hf_dir`).

What it holds is checked as a whole, in the order a reader meets it, so that a folder that cannot
answer is refused -- naming the file and what to do -- before any weights are read: the settings
(qa_settings.json) first, and --null-threshold against them; then, before anything large loads,
the files the chosen runtime needs (tokenizer.json; model.safetensors for PyTorch, or export.py's
ONNX file); then config.json and the tokenizer files, each read once: the window length against
the model's positions, the tokenizer against the vocabulary the run trained with; the weights
through model_files' checked reader; the tokenizer against the model's embeddings.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from extractive_qa.data.features import TOKENIZER_FILES, directory_tokenizer, vocabulary_sha256
from extractive_qa.errors import DataError
from extractive_qa.io import model_files, reading
from extractive_qa.qa import qa_settings
from extractive_qa.serve.onnx_model import RUNTIME_FILES
from extractive_qa.storage import private_copy, source, where

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def find_hf_dir(checkpoint: str) -> Path:
    """The hf/ export inside a checkpoint: a directory where it lies; a master's UUID or a
    bucket's URL from this user's private cache (fetched once, checked against the source's
    listing before each reuse; a bucket's hf/ alone, a master's whole checkpoint)."""
    src = where.source_for(checkpoint, "--checkpoint")
    if src.in_place is not None and not src.in_place.is_dir():
        raise DataError(f"--checkpoint {checkpoint}: {reading.not_a_checkpoint(src.in_place)}")

    def this_projects(entries: list[source.Entry]) -> None:
        """Refused from the listing, before anything is fetched."""
        names = {e.name for e in entries}
        if "metadata.json" not in names:
            raise DataError(
                f"--checkpoint {checkpoint}: not a checkpoint (no metadata.json, which Determined writes "
                "into every checkpoint); give the prefix of one checkpoint, …/UUID."
            )
        if not {"hf/config.json", f"hf/{qa_settings.QA_SETTINGS}"} <= names:
            raise DataError(
                f"--checkpoint {checkpoint}: not a checkpoint of this project (no hf/config.json and "
                f"hf/{qa_settings.QA_SETTINGS}); give one train.py wrote."
            )

    part = "hf" if src.partial else None  # what serving reads: hf/, without the optimizer state
    path = private_copy.cached(src, "--checkpoint", source.checkpoint_limit, part=part, check=this_projects)
    return _hf_dir_of(path, checkpoint)


def _hf_dir_of(path: Path, checkpoint: str) -> Path:
    """path/hf, or path itself (an hf/ or export.py's directory), if it holds this project's
    config.json and qa_settings.json."""
    for candidate in (path / "hf", path):
        if (candidate / "config.json").is_file() and (candidate / qa_settings.QA_SETTINGS).is_file():
            return candidate
    raise DataError(
        f"--checkpoint {checkpoint}: not a checkpoint of this project (no hf/config.json and "
        "hf/qa_settings.json); pass a directory train.py wrote."
    )


RUNTIMES = ("torch", *RUNTIME_FILES)


class ModelDir:
    """The folder `checkpoint` names, its settings read, --null-threshold (`null_threshold`)
    checked against them, its files checked for `runtime` and its tokenizer loaded."""

    def __init__(self, checkpoint: str, runtime: str = "torch", null_threshold: str | None = None) -> None:
        self.checkpoint, self.runtime = checkpoint, runtime
        self.hf = find_hf_dir(checkpoint)
        self.settings = qa_settings.QASettings.load(self.hf)
        self.shown = f"--checkpoint {checkpoint}"
        self.null_threshold = self._null_threshold(null_threshold)  # before any large read
        self._check_files()

    def _null_threshold(self, choice: str | None) -> float | None:
        """--null-threshold: `tuned` (the checkpoint's best_f1 threshold), a number, or (None) the
        run's data.null_score_diff_threshold."""
        if choice is None:
            return None
        if self.settings.squad_version != "2.0":
            raise DataError(
                "--null-threshold: this checkpoint answers SQuAD v1.1 (no unanswerable questions); "
                "the no-answer threshold applies to v2.0 models only."
            )
        if choice == "tuned":
            if self.settings.tuned_null_threshold is None:
                raise DataError(
                    "--null-threshold tuned: this checkpoint holds no tuned threshold (it was saved "
                    "before any SQuAD v2.0 validation); give a number instead."
                )
            return float(self.settings.tuned_null_threshold)
        try:
            value = float(choice)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value):
            raise DataError(f"--null-threshold: expected `tuned` or a number, got {choice!r}.")
        return value

    def _check_files(self) -> None:
        """What the runtime reads is there, the windows fit the model, and the tokenizer is the
        one the run trained with (no large read yet)."""
        hf = self.hf
        if not (hf / "tokenizer.json").is_file():  # without it transformers builds a stand-in
            raise DataError(
                f"{self.shown}: {hf / 'tokenizer.json'} is missing (every export writes it); the "
                "checkpoint is incomplete: copy it again."
            )
        if self.runtime == "torch":
            self._check_torch_weights()
        elif not (hf / RUNTIME_FILES[self.runtime]).is_file():
            raise DataError(
                f"--runtime {self.runtime}: {hf} has no {RUNTIME_FILES[self.runtime]}; write it with "
                "`python3 export.py --checkpoint CHECKPOINT --out DIR` and pass --checkpoint DIR."
            )
        # The small files read once: the tokenizer loads from a copy of these bytes, and the
        # PyTorch model is built from config.json's.
        self.small_files = reading.read_present(hf, TOKENIZER_FILES, reading.MODEL_FILE)
        self.config_json = reading.json_object(self.small_files[model_files.CONFIG], hf / model_files.CONFIG)
        spec, limit = self.settings.window_spec, model_files.position_limit(self.config_json)
        if limit is not None and spec.max_seq_length > limit:
            raise DataError(
                f"{hf / qa_settings.QA_SETTINGS}: max_seq_length {spec.max_seq_length} is above "
                f"the model's {limit} positions; the file is damaged or edited: re-export the checkpoint."
            )
        self.tokenizer = directory_tokenizer(hf, self.small_files)
        saved = self.settings.vocabulary_sha256
        if saved is not None and vocabulary_sha256(self.tokenizer) != saved:
            raise DataError(
                f"{self.shown}: {hf / 'tokenizer.json'} is not the tokenizer this model was "
                f"trained with (its vocabulary differs from the one {qa_settings.QA_SETTINGS} "
                "records); copy the checkpoint's hf/ again."
            )

    def _check_torch_weights(self) -> None:
        hf, safetensors, pickled = self.hf, any(self.hf.glob("*.safetensors")), any(self.hf.glob("*.bin"))
        if (hf / "model.onnx").is_file() and not safetensors and not pickled:
            raise DataError(
                f"{self.shown}: an ONNX export (no PyTorch weights); answer with --runtime onnx or "
                "--runtime onnx-int8."
            )
        if not safetensors and pickled:
            raise DataError(
                f"{self.shown}: {hf} holds pickled weights (pytorch_model.bin) only; predict.py loads "
                "safetensors, which run no code. Re-save the model with "
                "save_pretrained(..., safe_serialization=True)."
            )
        if not (hf / model_files.WEIGHTS).exists():
            raise DataError(
                f"{self.shown}: {hf} has no {model_files.WEIGHTS} (train.py and export.py write the "
                "weights as one safetensors file); copy the checkpoint again."
            )

    def torch_model(self) -> Any:
        """The PyTorch model from the checked weights, refused when the tokenizer is not its own."""
        try:
            model = model_files.load_qa_model(self.hf, self.config_json)
        except DataError:
            raise
        except Exception as err:  # bytes that passed the header check but not safetensors' reader
            reason = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            raise DataError(
                f"{self.shown}: cannot load the model in {self.hf} ({reason}); the weights may be "
                "damaged or cut short: copy the checkpoint again."
            ) from None
        vocabulary, embeddings = len(self.tokenizer), model.get_input_embeddings().num_embeddings
        if not embeddings // 2 <= vocabulary <= embeddings:  # models may pad embeddings, not halve them
            raise DataError(
                f"{self.shown}: its tokenizer has {vocabulary} tokens, its model {embeddings} "
                f"embeddings; the tokenizer files in {self.hf} are not this model's."
            )
        return model

    def onnx_file(self) -> Path:
        return self.hf / RUNTIME_FILES[self.runtime]
