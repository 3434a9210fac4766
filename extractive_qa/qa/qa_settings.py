"""The extraction contract saved beside every checkpoint (hf/qa_settings.json): the windowing,
span search and arithmetic evaluation ran with, so predict.py answers as validation did."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from extractive_qa.config.settings import PRECISIONS, DataSettings, Hyperparameters, WindowSpec, check_setting
from extractive_qa.data import squad_files
from extractive_qa.data.features import Features
from extractive_qa.errors import ConfigError, DataError
from extractive_qa.io import reading
from extractive_qa.io.files import write_text_atomic
from extractive_qa.qa import outputs
from extractive_qa.qa.answers import Answers, extract_answers

QA_SETTINGS = "qa_settings.json"


@dataclasses.dataclass(frozen=True)
class QASettings:
    """Written next to hf/ in every checkpoint; read by predict.py."""

    squad_version: str
    max_seq_length: int
    doc_stride: int
    max_query_length: int
    n_best_size: int
    max_answer_length: int
    null_score_diff_threshold: float
    pretrained_model: str
    eval_batch_size: int  # predict.py batches like evaluation did, so its EM/F1 match exactly
    pad_to_multiple_of: int
    # The arithmetic evaluation ran with. Defaults: what exports written before these fields
    # existed ran with (fp32 on CPU; TF32 is on by default on CUDA).
    precision: str = "fp32"
    tf32: bool = True
    # v2.0: the no-answer threshold that reached best_f1 on the latest validation (the official
    # script's best_f1_thresh); predict.py --null-threshold tuned applies it. Tuned on the
    # validation set itself: scores on that set at this threshold are optimistic.
    tuned_null_threshold: float | None = None
    # The digest of the tokenizer's vocabulary the run trained with (features.vocabulary_sha256):
    # predict.py refuses a tokenizer.json of another vocabulary, even one of the same size.
    vocabulary_sha256: str | None = None

    @classmethod
    def from_run(cls, settings: DataSettings, hp: Hyperparameters, eval_batch_size: int) -> QASettings:
        """From a run's typed data settings and hyperparameters (run_plan.run_plan's output)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {
            **dataclasses.asdict(hp),
            **dataclasses.asdict(settings),
            "eval_batch_size": eval_batch_size,
        }
        return cls(**{k: v for k, v in values.items() if k in fields})

    @property
    def window_spec(self) -> WindowSpec:
        return WindowSpec(self.max_seq_length, self.doc_stride, self.max_query_length)

    @property
    def span_search(self) -> dict[str, Any]:
        """How candidate spans are found: the same for the answers and for the n-best lists."""
        return {
            "n_best": self.n_best_size,
            "max_answer_length": self.max_answer_length,
            "version_2": self.squad_version == "2.0",
        }

    def extract_answers(
        self,
        examples: Sequence[squad_files.Example],
        features: Features,
        start: np.ndarray,
        end: np.ndarray,
        null_threshold: float | None = None,
    ) -> Answers:
        """Answers from window logits with these settings (the trial's evaluation and predict.py);
        `null_threshold` overrides null_score_diff_threshold."""
        threshold = self.null_score_diff_threshold if null_threshold is None else null_threshold
        return extract_answers(
            examples, features, start, end, **self.span_search, null_score_diff_threshold=threshold
        )

    def nbest(
        self, examples: Sequence[squad_files.Example], features: Features, start: np.ndarray, end: np.ndarray
    ) -> outputs.NBest:
        """Each question's n-best spans (and the null on v2.0) with probabilities summing to 1."""
        return outputs.nbest_predictions(examples, features, start, end, **self.span_search)

    def save(self, hf_dir: Path) -> None:
        write_text_atomic(hf_dir / QA_SETTINGS, json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def load(cls, hf_dir: Path) -> QASettings:
        path = hf_dir / QA_SETTINGS
        try:
            raw = reading.read_json_object(path, reading.RECORD)
        except reading.UnreadableFile as err:
            raise DataError(f"cannot read QA settings: {err}") from None
        fields = dataclasses.fields(cls)
        required = {f.name for f in fields if f.default is dataclasses.MISSING}
        missing = sorted(required - set(raw))
        if missing:
            raise DataError(f"{path}: missing {', '.join(missing)}; re-export the checkpoint.")
        values = {f.name: raw[f.name] for f in fields if f.name in raw}
        for f in fields:
            if f.name in values and not _matches(values[f.name], f.type):
                raise DataError(
                    f"{path}: {f.name} is {values[f.name]!r}, expected {f.type}; the file is damaged "
                    "or edited: re-export the checkpoint."
                )
        if values.get("precision", "fp32") not in PRECISIONS:
            raise DataError(
                f"{path}: precision is {values['precision']!r}, not one of {', '.join(PRECISIONS)}; "
                "the file is damaged or edited: re-export the checkpoint."
            )
        try:  # the ranges a config's values are held to (n_best_size >= 1, ...), and the windows
            for name, value in values.items():
                values[name] = check_setting(name, value, f"{path}: {name}")
            if values["eval_batch_size"] < 1:
                raise ConfigError(f"{path}: eval_batch_size must be >= 1, got {values['eval_batch_size']}.")
            settings = cls(**values)
            settings.window_spec.check()
        except (ConfigError, DataError) as err:
            raise DataError(f"{err} The file is damaged or edited: re-export the checkpoint.") from None
        return settings


def _matches(value: Any, annotation: str) -> bool:
    """A qa_settings.json value against its field's annotation (str, int, float, bool, X | None)."""
    kinds = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}
    options = [part.strip() for part in str(annotation).split("|")]
    if value is None:
        return "None" in options
    for option in options:
        if option in kinds and isinstance(value, kinds[option]):
            if option != "bool" and isinstance(value, bool):
                continue
            return not (option in ("int", "float") and isinstance(value, (int, float)) and value != value)
    return False
