"""A checkpoint's model folder for answering, checked as a whole: every check of what the folder
holds lives here, in the order a reader meets them, so that a folder that cannot answer is
refused -- naming the file and what to do -- before any weights are read.

The settings (qa_settings.json) come first; then, before anything large loads, the files the
chosen runtime needs (tokenizer.json; model.safetensors for PyTorch, or export.py's ONNX file);
then the window length against the model's positions; the tokenizer against the vocabulary the
run trained with; the weights through model_weights' checked reader; the tokenizer against the
model's embeddings. hf_dir finds the folder (a checkpoint, its hf/, an export, a UUID, a URL).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from extractive_qa.config.model_family import model_position_limit
from extractive_qa.data.features import load_tokenizer, vocabulary_sha256
from extractive_qa.errors import DataError
from extractive_qa.qa import qa_settings
from extractive_qa.serve import model_weights
from extractive_qa.serve.hf_dir import find_hf_dir
from extractive_qa.serve.onnx_model import RUNTIME_FILES

RUNTIMES = ("torch", *RUNTIME_FILES)


class ModelDir:
    """The folder `checkpoint` names, its settings read and its files checked for `runtime`."""

    def __init__(self, checkpoint: str, runtime: str = "torch") -> None:
        self.checkpoint, self.runtime = checkpoint, runtime
        self.hf = find_hf_dir(checkpoint)
        self.settings = qa_settings.QASettings.load(self.hf)
        self.shown = f"--checkpoint {checkpoint}"

    def check_files(self) -> None:
        """What the runtime reads is there, and the windows fit the model (no large read yet)."""
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
        spec, limit = self.settings.window_spec, model_position_limit(str(hf))
        if limit is not None and spec.max_seq_length > limit:
            raise DataError(
                f"{hf / qa_settings.QA_SETTINGS}: max_seq_length {spec.max_seq_length} is above "
                f"the model's {limit} positions; the file is damaged or edited: re-export the checkpoint."
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
        if not (hf / model_weights.WEIGHTS).exists():
            raise DataError(
                f"{self.shown}: {hf} has no {model_weights.WEIGHTS} (train.py and export.py write the "
                "weights as one safetensors file); copy the checkpoint again."
            )

    def tokenizer(self) -> Any:
        """The folder's tokenizer, refused when its vocabulary is not the one the run trained with."""
        tokenizer = load_tokenizer(str(self.hf))
        saved = self.settings.vocabulary_sha256
        if saved is not None and vocabulary_sha256(tokenizer) != saved:
            raise DataError(
                f"{self.shown}: {self.hf / 'tokenizer.json'} is not the tokenizer this model was "
                f"trained with (its vocabulary differs from the one {qa_settings.QA_SETTINGS} "
                "records); copy the checkpoint's hf/ again."
            )
        return tokenizer

    def torch_model(self, tokenizer: Any) -> Any:
        """The PyTorch model from the checked weights, refused when `tokenizer` is not its own."""
        try:
            model = model_weights.load_model(self.hf)
        except DataError:
            raise
        except Exception as err:  # bytes that passed the header check but not safetensors' reader
            reason = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            raise DataError(
                f"{self.shown}: cannot load the model in {self.hf} ({reason}); the weights may be "
                "damaged or cut short: copy the checkpoint again."
            ) from None
        vocabulary, embeddings = len(tokenizer), model.get_input_embeddings().num_embeddings
        if not embeddings // 2 <= vocabulary <= embeddings:  # models may pad embeddings, not halve them
            raise DataError(
                f"{self.shown}: its tokenizer has {vocabulary} tokens, its model {embeddings} "
                f"embeddings; the tokenizer files in {self.hf} are not this model's."
            )
        return model

    def onnx_file(self) -> Path:
        return self.hf / RUNTIME_FILES[self.runtime]
