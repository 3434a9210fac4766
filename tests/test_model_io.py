"""The model's arithmetic: which precision `auto` picks on which hardware, fp32 logits under bf16
autocast, and the CUDA math settings (TF32 as configured, cuDNN attention off)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from extractive_qa.config import run_plan
from extractive_qa.qa import mixed_precision
from extractive_qa.trial import model_io

pytestmark = pytest.mark.cluster_stack  # autocast, CPU bf16 probes and transformers' loading report

PROBES = [probe for _, probe, _ in mixed_precision.CPU_BF16_UNITS]


def _cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, has: set[str], probes: bool = True) -> None:
    """Pretend this CPU has the bf16 units `has` (probe names), through torch's probes or, as on
    torch 2.3, which has none, through /proc/cpuinfo's flags."""
    flags = {flag for _, probe, flag in mixed_precision.CPU_BF16_UNITS if probe in has}
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse avx2 " + " ".join(sorted(flags)) + "\n")
    monkeypatch.setattr(mixed_precision, "CPUINFO", cpuinfo)
    for probe in PROBES:
        if probes:
            monkeypatch.setattr(torch.cpu, probe, lambda on=probe in has: on, raising=False)
        elif hasattr(torch.cpu, probe):
            monkeypatch.delattr(torch.cpu, probe)


@pytest.mark.parametrize("probes", [True, False], ids=["torch-probes", "cpuinfo-flags"])
def test_auto_picks_bf16_only_where_the_cpu_has_bf16_matrix_units(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, probes: bool
) -> None:
    _cpu(monkeypatch, tmp_path, set(), probes)
    assert mixed_precision.resolve_precision("auto", "cpu") == (
        "fp32",
        "auto: this CPU has no bf16 matrix units (AMX, AVX512-BF16)",
    )
    _cpu(monkeypatch, tmp_path, {"_is_avx512_bf16_supported"}, probes)
    assert mixed_precision.resolve_precision("auto", "cpu") == ("bf16", "auto: this CPU has AVX512-BF16")
    _cpu(monkeypatch, tmp_path, set(PROBES), probes)
    both = "auto: this CPU has AMX tiles and AVX512-BF16"
    assert mixed_precision.resolve_precision("auto", "cpu") == ("bf16", both)
    # CUDA keeps the GPU recipe; an explicit choice is never changed.
    assert mixed_precision.resolve_precision("auto", "cuda")[0] == "fp32"
    assert mixed_precision.resolve_precision("bf16", "cpu") == ("bf16", "set explicitly")
    _cpu(monkeypatch, tmp_path, set(), probes)
    assert mixed_precision.resolve_precision("bf16", "cpu") == ("bf16", "set explicitly")
    assert mixed_precision.resolve_precision("fp32", "cpu") == ("fp32", "set explicitly")


def test_the_default_precision_is_auto() -> None:
    conf = {"data": {"train_file": "a", "validation_file": "b"}}
    assert run_plan.run_plan(conf, {"train_length": {"epochs": 1}}, slots=1).hparams.precision == "auto"


def test_the_embedded_configs_precision(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """On a CPU with bf16 units local.yaml trains in bf16 (auto) and local_v2.yaml in fp32: its
    F1 at the tuned no-answer threshold did not pass the rule bf16 must pass (docs/squad2.md)."""
    from extractive_qa.config import experiment

    _cpu(monkeypatch, tmp_path, {"_is_amx_tile_supported"})
    root = Path(__file__).resolve().parents[1]
    picked = {}
    for name in ("local.yaml", "local_v2.yaml"):
        hp = experiment.local_hparams(experiment.load_yaml(root / name))
        picked[name] = mixed_precision.resolve_precision(hp.get("precision", "auto"), "cpu")[0]
    assert picked == {"local.yaml": "bf16", "local_v2.yaml": "fp32"}


def test_bf16_autocast_keeps_the_logits_and_the_loss_in_fp32(tiny_bert: Path) -> None:
    """Under bf16 autocast the encoder's matmuls run in bf16 but the QA head does not: logits and
    loss are fp32 (without fp32_logits they are bf16), parameters and saved names unchanged."""
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert).eval()
    ids = torch.randint(5, 1000, (2, 24))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    labels = {"start_positions": torch.tensor([3, 4]), "end_positions": torch.tensor([5, 9])}
    with torch.no_grad(), mixed_precision.autocast("cpu", "bf16"):
        plain = model(**inputs, **labels)
    keys = sorted(model.state_dict())
    mixed_precision.fp32_logits(model)
    mixed_precision.fp32_logits(model)  # once is enough: a second call changes nothing
    with torch.no_grad(), mixed_precision.autocast("cpu", "bf16"):
        kept = model(**inputs, **labels)
    with torch.no_grad():
        full = model(**inputs, **labels)
    assert plain.start_logits.dtype == torch.bfloat16
    assert kept.start_logits.dtype == kept.end_logits.dtype == kept.loss.dtype == torch.float32
    assert sorted(model.state_dict()) == keys
    # bf16 matmuls, fp32 head: close to fp32, closer than bf16 logits are
    assert (kept.start_logits - full.start_logits).abs().max() < 0.05
    assert (kept.start_logits - full.start_logits).abs().max() <= (
        plain.start_logits.float() - full.start_logits
    ).abs().max()


def test_cuda_math_settings() -> None:
    """TF32 follows hyperparameters.tf32; cuDNN attention stays off (per-width plans, docs/gpu.md)."""

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cuda.cudnn_sdp_enabled())
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        mixed_precision.configure_cuda_math(tf32=True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        mixed_precision.configure_cuda_math(tf32=False)
        assert not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.backends.cuda.enable_cudnn_sdp(saved[1])
    conf = {"data": {"train_file": "a", "validation_file": "b"}}
    assert run_plan.run_plan(conf, {"train_length": {"epochs": 1}}, slots=1).hparams.tf32 is True


def test_loading_an_encoder_says_one_line_and_warns_only_of_real_gaps(
    tiny_bert: Path, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    """An encoder checkpoint (pooler, no QA head): one summary line instead of transformers'
    load report; an encoder weight absent from the checkpoint is a warning naming it."""
    from safetensors.torch import load_file, save_file
    from transformers import BertModel

    encoder = tmp_path / "encoder"
    BertModel.from_pretrained(tiny_bert).save_pretrained(encoder)
    _, summary, warnings = model_io.load_qa_model(str(encoder))
    assert summary == "new QA head initialised, pretraining heads unused (pooler)" and warnings == []
    assert "LOAD REPORT" not in capfd.readouterr().err
    weights = load_file(encoder / "model.safetensors")
    gone = next(k for k in weights if "encoder.layer.1.output.dense.weight" in k)
    del weights[gone]
    save_file(weights, encoder / "model.safetensors", metadata={"format": "pt"})
    _, _, warnings = model_io.load_qa_model(str(encoder))
    assert len(warnings) == 1 and "start random" in warnings[0]
    assert "encoder.layer.1.output.dense.weight" in warnings[0]
