"""GPU only: training speed per attention backend and matmul mode, on first-seen and repeated widths.

    python3 -m bench.attention_backends [--batch-size 64] [--batches 12]

Why mixed_precision.configure_cuda_math turns cuDNN attention off and TF32 on. Dynamic padding gives
every batch one of up to max_seq_length / pad_to_multiple_of widths. Each variant trains random
BERT-base (bench/common.py's Loop: the trial's train_batch) over the same length-grouped
batches twice: pass 1 meets each width for the first time, pass 2 repeats them. A backend that
plans per shape (cuDNN's fused attention, preferred for bf16/fp16) shows it as pass 1 << pass 2.
Ends with a profile of the first-seen pass for bf16 + cuDNN attention.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import common as tp  # model, config and the bare training loop
from extractive_qa import cli
from extractive_qa.config import experiment, run_plan
from extractive_qa.config.model_family import EMBEDDED_MODEL
from extractive_qa.config.settings import WindowSpec
from extractive_qa.data import squad_files
from extractive_qa.data.batching import Collator, FeatureBatchSampler
from extractive_qa.data.features import build_features, load_tokenizer

VARIANTS = [  # name, attention, precision, cuDNN attention allowed, TF32
    ("fp32 sdpa", "sdpa", "fp32", True, False),
    ("fp32 sdpa + TF32", "sdpa", "fp32", True, True),
    ("bf16 sdpa, cuDNN attention on", "sdpa", "bf16", True, True),
    ("bf16 sdpa, cuDNN attention off", "sdpa", "bf16", False, True),
    ("bf16 eager attention", "eager", "bf16", False, True),
    ("fp16 sdpa, cuDNN attention off", "sdpa", "fp16", False, True),
]


@cli.boundary
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=12)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    with tempfile.TemporaryDirectory(prefix="attention-backends-") as tmp:  # the model built for it
        return measure(args, torch.device("cuda"), Path(tmp))


def measure(args: argparse.Namespace, device: torch.device, tmp: Path) -> int:
    tokenizer = load_tokenizer(EMBEDDED_MODEL)
    model_path = tp.model_dir("bert-base", tmp, tokenizer)
    settings = argparse.Namespace(
        train_file=tp.ROOT / "squad_data" / "local-train-v1.1.json", max_seq_length=384, doc_stride=128,
        batch_size=args.batch_size, precision="bf16", compile=False, batches=args.batches,
    )  # fmt: skip
    conf = experiment.load_yaml(tp.trial_config(settings, model_path, tmp))
    hp = run_plan.run_plan(conf, experiment.local_hparams(conf), 1).hparams
    squad = squad_files.load_squad(settings.train_file, training=True)
    features = build_features(squad.examples, tokenizer, WindowSpec(384, 128, 64), labels=True, offsets=False)
    sampler = FeatureBatchSampler(
        features.lengths, args.batch_size, shuffle=True, batching="sorted", seed=tp.SEED
    )
    collate = Collator(features, True, 8, labels=True)  # the many widths this measures
    batches = [collate(ix.tolist()) for ix in sampler.batches(0)[: args.batches]]
    print(f"{torch.cuda.get_device_name()}; widths {[b['input_ids'].shape[1] for b in batches]}", flush=True)

    def loop_for(attn: str, precision: str, cudnn: bool, tf32: bool) -> tp.Loop:
        loop = tp.Loop(
            model_path, tp.Rung("", "sorted", 8, attn, "trial", precision, False, tf32), hp, 100, device
        )
        torch.backends.cuda.enable_cudnn_sdp(cudnn)  # after Loop applied the trial's settings
        return loop

    for name, attn, precision, cudnn, tf32 in VARIANTS:
        loop = loop_for(attn, precision, cudnn, tf32)
        rates = []
        for _ in range(2):
            torch.cuda.synchronize()
            started = time.perf_counter()
            for batch in batches:
                loop.step(batch)
            torch.cuda.synchronize()
            rates.append(len(batches) * args.batch_size / (time.perf_counter() - started))
        print(
            f"  {name:34s} first-seen widths {rates[0]:8.1f} seq/s   repeated {rates[1]:8.1f} seq/s",
            flush=True,
        )
        del loop

    from torch.profiler import ProfilerActivity, profile

    loop = loop_for("sdpa", "bf16", True, True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for batch in batches[:6]:
            loop.step(batch)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
