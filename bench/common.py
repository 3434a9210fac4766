"""What several benchmarks share: random BERT-base, the bare training loop, timing helpers.

The bare loop (`Loop`) does what SquadTrial.train_batch does -- forward under autocast,
backward, clip, optimizer and schedule step -- without Determined, one switch at a time (`Rung`).
Benchmarks import it as `bench.common`.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import itertools
import json
import os
import platform
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

import train
from extractive_qa.config import experiment
from extractive_qa.config.model_family import EMBEDDED_MODEL, load_model_kwargs, resolve_pretrained
from extractive_qa.config.settings import Hyperparameters
from extractive_qa.data.batching import forward_params, model_inputs
from extractive_qa.io.files import ROOT
from extractive_qa.launch import process as launch
from extractive_qa.qa import mixed_precision
from extractive_qa.trial import cpu_allocator, dropout_masks, model_io, optimization

BERT_BASE = dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
)
SQUAD_V11_WINDOWS = 88_600  # train-v1.1 at 384/128 with the bert-base-uncased vocab


SEED = 42


@dataclass
class Rung:
    name: str
    batching: str  # BATCHINGS: padded (the standard recipe), random, buckets, sorted
    multiple: int  # pad_to_multiple_of: a batch's width is rounded up to it (and buckets' width)
    attn: str
    optimizer: str  # "plain" torch AdamW, or "trial" = optimization.build_optimizer (fused on CUDA)
    precision: str
    compile: str = ""  # torch.compile mode ("default", "reduce-overhead": CUDA graphs); "": eager
    tf32: bool = False  # CUDA only: the trial's default (hyperparameters.tf32)
    masks: str = "fast"  # CPU dropout masks (hyperparameters.dropout_masks); "torch": bernoulli_
    graphs: bool = False  # CUDA only: forward + backward captured as one CUDA graph per input shape
    # bf16 weights with fp32 master weights in the optimizer, no autocast (no per-op casts); the
    # QA head stays fp32. A benchmark's lever: the trial trains with autocast over fp32 weights.
    master_weights: bool = False


def window_sample(windows: int, need: int, seed: int = SEED) -> np.ndarray:
    """`need` window indices drawn at random from `windows`; past the file's size it cycles through
    fresh permutations (large batches of a small file: throughput does not depend on which
    windows repeat, and none repeats before every one has been drawn)."""
    rng = np.random.default_rng(seed)
    rounds = -(-need // windows)
    return np.concatenate([rng.permutation(windows) for _ in range(rounds)])[:need]


def model_dir(kind: str, tmp: Path, tokenizer: Any) -> str:
    if kind == "embedded":
        return resolve_pretrained(EMBEDDED_MODEL)
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)  # random weights: speed does not depend on them
    path = tmp / "bert-base"
    BertForQuestionAnswering(BertConfig(**BERT_BASE)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


class Loop:
    """What SquadTrial.train_batch does, without Determined: forward, backward, clip, step."""

    def __init__(
        self, model_path: str, rung: Rung, hp: Hyperparameters, total: int, device: torch.device
    ) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # a 'Loading weights' bar per rung between the table rows
        launch.seed_everything(SEED)  # as train.py seeds before the trial builds its model
        if device.type == "cuda":
            mixed_precision.configure_cuda_math(rung.tf32)
        else:
            cpu_allocator.keep_freed_memory()  # as the trial does (model_setup)
        model, _, _ = model_io.load_qa_model(model_path, **load_model_kwargs(rung.attn))
        if rung.precision in mixed_precision.AUTOCAST_DTYPES:
            mixed_precision.fp32_logits(model)  # as the trial does
        self.model = model.to(device).train()
        self.accepted = forward_params(model)
        self.masters = MasterWeights(model) if rung.master_weights else None
        if rung.optimizer == "plain":
            self.optimizer = torch.optim.AdamW(
                model.parameters(),
                lr=hp.learning_rate,
                eps=hp.adam_epsilon,
                weight_decay=hp.weight_decay,
            )
        else:
            self.optimizer = optimization.build_optimizer(model, hp, hp.learning_rate, device)
        if self.masters is not None:
            self.optimizer = self.masters.optimizer_over_masters(self.optimizer)
        warmup = int(hp.warmup_ratio * total)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, optimization.linear_warmup_decay(total, warmup)
        )
        self.precision, self.masks, self.compiled = rung.precision, rung.masks, rung.compile
        self.scaler = torch.amp.GradScaler("cuda") if rung.precision == "fp16" else None
        self.forward = torch.compile(self.model, mode=rung.compile) if rung.compile else self.model
        self.device, self.max_norm = device, hp.max_grad_norm
        self.graphs = rung.graphs
        self.graphed: dict[tuple, torch.nn.Module] = {}

    def step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        # The labelled ranges are what bench.cpu_step's profile groups time by.
        record = torch.profiler.record_function
        inputs = {
            k: v.to(self.device, non_blocking=True) for k, v in model_inputs(batch, self.accepted).items()
        }
        if self.graphs:
            loss = self.graphed_loss(inputs)
        else:
            masks = dropout_masks.masks(self.masks, self.device.type, bool(self.compiled))
            precision = "fp32" if self.masters is not None else self.precision  # bf16 weights: no autocast
            with record("forward"), masks, mixed_precision.autocast(self.device.type, precision):
                loss = self.forward(**inputs).loss
        with record("backward"):
            if self.scaler:
                self.scaler.scale(loss).backward()
                self.scaler.unscale_(self.optimizer)
            else:
                loss.backward()
        with record("optimizer"):
            if self.masters is not None:
                self.masters.take_gradients()
            params = self.masters.fp32 if self.masters is not None else self.model.parameters()
            torch.nn.utils.clip_grad_norm_(params, self.max_norm)
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.schedule.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.masters is not None:
                self.masters.give_weights()
        return loss.detach()

    def graphed_loss(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The forward pass through a CUDA graph captured for these input shapes (the first step
        at a shape captures it: a few warm-up passes, then the capture); its backward replays the
        matching backward graph. A step then costs one launch per graph instead of one per kernel.
        The optimizer step stays eager (fused AdamW is a handful of launches)."""
        names = tuple(sorted(inputs))
        key = tuple((n, tuple(inputs[n].shape)) for n in names)
        graphed = self.graphed.get(key)
        if graphed is None:
            wrapper = _LossOf(self.model, names, self.precision, self.device.type)
            sample = tuple(inputs[n].clone() for n in names)
            graphed = torch.cuda.make_graphed_callables(wrapper, sample, allow_unused_input=True)
            self.graphed[key] = graphed
        return graphed(*(inputs[n] for n in names))


class MasterWeights:
    """The model's weights in bf16 for the forward and backward passes (the QA head stays fp32:
    fp32 logits), the optimizer stepping fp32 copies of them: after backward each bf16 gradient
    becomes the fp32 copy's, and after the step the fp32 weights are rounded into the model."""

    def __init__(self, model: torch.nn.Module) -> None:
        head = getattr(model, "qa_outputs", None)
        keep = {id(p) for p in head.parameters()} if head is not None else set()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.fp32 = [p.detach().clone() for p in self.params]  # the master weights
        with torch.no_grad():
            for p in self.params:
                if id(p) not in keep:
                    p.data = p.data.to(torch.bfloat16)

    def optimizer_over_masters(self, optimizer: Any) -> Any:
        """The same optimizer (class, groups, options) over the fp32 copies."""
        index = {id(p): i for i, p in enumerate(self.params)}
        groups = [
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": [self.fp32[index[id(p)]] for p in g["params"]],
            }
            for g in optimizer.param_groups
        ]
        # Its constructor's own options only: torch's AdamW records `decoupled_weight_decay` among
        # its defaults (it is an Adam underneath) but does not take it as an argument.
        accepted = inspect.signature(type(optimizer).__init__).parameters
        options = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        return type(optimizer)(groups, **options)

    def take_gradients(self) -> None:
        for master, p in zip(self.fp32, self.params, strict=True):
            master.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    def give_weights(self) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.fp32)


class _LossOf(torch.nn.Module):
    """The model's loss as a function of positional tensors, what make_graphed_callables takes.
    Autocast's weight cache must be off inside a captured graph (torch.cuda.make_graphed_callables'
    documentation): the cache would hold casts from the capture, not the replay."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...], precision: str, device_type: str):
        super().__init__()
        self.model, self.names, self.device_type = model, names, device_type
        self.dtype = mixed_precision.AUTOCAST_DTYPES.get(precision)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        enabled = self.dtype is not None
        with torch.autocast(self.device_type, dtype=self.dtype, enabled=enabled, cache_enabled=False):
            return self.model(**dict(zip(self.names, tensors, strict=True))).loss


def cpu_description() -> dict[str, Any]:
    """What a CPU figure is measured on: model name and family, cores, torch's threads, the bf16
    units `precision: auto` looks for, and the vector / matrix flags the kernels can use."""
    name, family, flags = platform.processor() or platform.machine(), "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name" and name == (platform.processor() or platform.machine()):
                name = value
            elif key in ("cpu family", "model") and len(family.split()) < 4:
                family += f" {key} {value}"
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu": name,
        "family": family.strip(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "bf16_units": mixed_precision.cpu_bf16_units() or ["none"],
        "flags": sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma", "avx_vnni"))),
        "torch": torch.__version__,
    }


def machine_text(device: torch.device | None = None, cpu: dict[str, Any] | None = None) -> str:
    """One line naming what a figure was measured on: a CUDA device's name with its host's CPU
    cores, or a CPU's model, family, torch's threads, the host's cores and bf16 units -- `cpu` (a
    recorded cpu_description) or this one's."""
    if cpu is None and device is not None and device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({os.cpu_count()} CPU cores)"
    cpu = cpu if cpu is not None else cpu_description()
    units = ", ".join(cpu.get("bf16_units", ["?"]))
    return (
        f"{cpu.get('cpu', '?')} ({cpu.get('family') or '?'}), {cpu.get('torch_threads', '?')} threads "
        f"of {cpu.get('cores', '?')} cores, bf16 units: {units}"
    )


def software_versions(device: torch.device | None = None) -> dict[str, str]:
    """The versions a figure depends on: Python, torch, transformers, NumPy and Determined (as
    installed), the kernel; on a GPU also CUDA (torch's build) and the driver."""
    from importlib import metadata

    import transformers

    try:
        determined = metadata.version("determined")
    except metadata.PackageNotFoundError:
        determined = "not installed"
    versions = {
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "numpy": np.__version__, "determined": determined,
        "system": f"{platform.system()} {platform.release()}",
    }  # fmt: skip
    if device is not None and device.type == "cuda":
        versions.update(cuda=str(torch.version.cuda), driver=driver_version())
    return versions


def driver_version() -> str:
    """The NVIDIA driver's version (nvidia-smi), or "?" where it cannot be asked."""
    import subprocess

    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def provenance(module: str, argv: list[str], device: torch.device | None = None) -> dict[str, Any]:
    """What every results file records beside its figures: the command that wrote it, the commit
    it ran at (with "+changes" when the work tree differed from it), the date, the machine and
    the software versions."""
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    # A copy of the tree sent to another machine (a GPU's) names its commit in BENCH_COMMIT:
    # whatever .git travelled with it need not be the tree's.
    commit = os.environ.get("BENCH_COMMIT") or git("rev-parse", "HEAD") or "unknown"
    if "BENCH_COMMIT" not in os.environ and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    return {
        "command": " ".join(["python3 -m", module, *argv]),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_text(device),
        "cpu": cpu_description(),
        "versions": software_versions(device),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_loop(loop: Loop, batches: Iterable[dict[str, torch.Tensor]], warmup: int) -> tuple[float, float]:
    """(seconds after the first `warmup` batches, last loss); warm-up batches train but are not timed."""
    loss = torch.zeros(())
    batches = iter(batches)
    for batch in itertools.islice(batches, warmup):
        loop.step(batch)
    sync(loop.device)
    t0 = time.perf_counter()
    for batch in batches:
        loss = loop.step(batch)
    sync(loop.device)
    return time.perf_counter() - t0, float(loss)


def tiny_validation_file(tmp: Path) -> Path:
    """One dev paragraph: the trial validates once at the end; that is not what we time."""
    dev = json.loads((ROOT / "squad_data" / "dev-v1.1-excerpt.json").read_text())
    article = dev["data"][0]
    one = {
        "version": dev.get("version", "1.1"),
        "data": [{"title": article["title"], "paragraphs": article["paragraphs"][:1]}],
    }
    path = tmp / "dev-one-paragraph.json"
    path.write_text(json.dumps(one))
    return path


def trial_config(args: argparse.Namespace, model_path: str, tmp: Path) -> Path:
    conf = experiment.load_yaml(ROOT / "local.yaml")
    conf["data"].update(
        pretrained_model=model_path,
        train_file=str(args.train_file),
        validation_file=str(tiny_validation_file(tmp)),
        cache_dir=str(tmp / "cache"),
        max_seq_length=args.max_seq_length,
        doc_stride=args.doc_stride,
    )
    conf["hyperparameters"].update(
        global_batch_size=args.batch_size,
        precision=args.precision,
        torch_compile=bool(args.compile),
        train_length={"type": "const", "val": {"batches": args.batches}},
    )
    conf["reproducibility"] = {"experiment_seed": SEED}
    conf["scheduling_unit"] = args.batches
    path = tmp / "trial.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


def run_trial(conf_path: Path, tmp: Path, run: int) -> dict[str, Any]:
    """The trial through Determined's local Trainer, exactly as `python3 train.py` runs it."""
    cwd = os.getcwd()
    args = train.parse_args(["--config", str(conf_path), "--checkpoint-dir", str(tmp / f"ckpt-{run}")])
    with contextlib.redirect_stdout(io.StringIO()):
        result = train.run(train.run_options(args))
    os.chdir(cwd)
    assert result is not None
    return result
