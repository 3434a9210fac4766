"""The write-up's multi-machine experiment in miniature: 2 machines x 1 slot over a shaped link.

    sudo python3 -m bench.multi_machine [--links 10gbit,1gbit,100mbit] [--aggregation 1,2,4]
                                        [--batches 16] [--out runs/multi-machine]

Every run is the embedded default (local.yaml: MiniLM, AdamW) started as a 0.38.1 allocation
(tests/support/det_cluster.py) on emulated hosts (tests/support/det_netns.py: network namespaces on a switch,
each machine's link shaped with tc tbf). Per aggregation frequency: one 1-machine x 1-slot run
(per-slot batch 8) and, for each link, a 2-machine x 1-slot run (global batch 16, the same
per-slot compute: one CPU thread per machine); at the slowest link also with fp16 gradient
compression. samples/s comes from the master's training reports exactly as `scaling.py report`
computes it (scaling_report.build_report; report.md / report.json / report.png in --out), and each
2-machine row is set beside docs/scaling.md's model:

    T_batch = b / r,  T_comm = 2 (n-1)/n * S / B,  samples/s = n a b / (a T_batch + T_comm)

with r the measured 1-slot rate at that aggregation, b = 8, n = 2, S = 4 P bytes (2 P with
compression; P counted from the model) and B the shaped link rate. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import provenance
from extractive_qa import cli, scaling_report, scaling_runs
from extractive_qa.config import experiment
from extractive_qa.config.model_family import EMBEDDED_MODEL, pretrained_config
from extractive_qa.io.files import ROOT
from tests.support import det_cluster, det_netns

PER_SLOT_BATCH = 8
DELAYS: set[str | None] = set()  # the one-way delays the links had (None: netem missing)


def small_validation_set(tmp: Path) -> Path:
    """Two paragraphs of the dev excerpt: runs end with a short validation, not 810 questions."""
    doc = json.loads((ROOT / "squad_data/dev-v1.1-excerpt.json").read_text())
    article = doc["data"][0]
    path = tmp / "dev-small.json"
    path.write_text(
        json.dumps({"version": "1.1", "data": [{**article, "paragraphs": article["paragraphs"][:2]}]})
    )
    return path


def config_for(slots: int, agg: int, batches: int, compression: bool, dev: Path) -> tuple[dict, dict]:
    conf = experiment.load_yaml(ROOT / "local.yaml")
    conf["data"].update(
        cache_dir=".cache/features",  # per machine
        train_file=str(ROOT / conf["data"]["train_file"]),
        validation_file=str(dev),
    )
    conf["resources"]["slots_per_trial"] = slots
    conf["optimizations"] = {"aggregation_frequency": agg, "gradient_compression": compression}
    conf["min_validation_period"] = {"batches": batches}
    conf["scheduling_unit"] = 4
    conf["entrypoint"] = "python3 -m determined.launch.torch_distributed python3 train.py"
    hp = experiment.local_hparams(conf)
    hp["global_batch_size"] = PER_SLOT_BATCH * slots
    hp["train_length"] = {"batches": batches}
    return conf, hp


def run(tmp: Path, conf: dict, hp: dict, machines: int, link: str) -> scaling_runs.RunInputs:
    env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    with det_netns.machines(machines, link=link) as net:
        DELAYS.add(net.delay)
        with det_cluster.emulated_cluster(tmp, env=env, network=net) as cluster:
            record = cluster.run_trial(conf, hp, containers=machines, slots_per_container=1, timeout=1500)
            reports = cluster.master.metrics
            ok = record.exit_codes[-1] == 0 and not cluster.master.errors
    opt = conf["optimizations"]
    name = f"{machines}x1 {link if machines > 1 else 'local'} agg{opt['aggregation_frequency']}" + (
        " fp16" if opt["gradient_compression"] else ""
    )
    return scaling_runs.RunInputs(
        name=name,
        state="COMPLETED" if ok else "ERROR",
        slots=machines,
        global_batch_size=hp["global_batch_size"],
        aggregation=opt["aggregation_frequency"],
        optimizer=hp["optimizer"],
        training=[(r["steps_completed"], r["time"]) for r in reports if r["group"] == "training"],
        validation=[
            (r["steps_completed"], r["time"], r["metrics"]) for r in reports if r["group"] == "validation"
        ],
        error=None if ok else f"exit codes {record.exit_codes}: {record.logs[-1][-500:]}",
    )


def parameters() -> int:
    import torch
    from transformers import AutoModelForQuestionAnswering

    config = pretrained_config(EMBEDDED_MODEL, local_only=True)  # sizes only: no weights read
    with torch.device("meta"):
        model = AutoModelForQuestionAnswering.from_config(config)
    return sum(p.numel() for p in model.parameters())


def model_rate(r: float, agg: int, link: str, grad_bytes: float, n: int = 2) -> float:
    bandwidth = det_netns.LINKS[link][0] / 8  # bytes/s
    t_batch = PER_SLOT_BATCH / r
    t_comm = 2 * (n - 1) / n * grad_bytes / bandwidth
    return n * agg * PER_SLOT_BATCH / (agg * t_batch + t_comm)


def plot_links(report: dict[str, Any], path: Path, source: dict[str, str]) -> None:
    """Per-slot efficiency against link rate, measured and modelled, one colour per aggregation
    (in place of scaling.py's speedup-vs-slots plot, which cannot show the link)."""
    with scaling_report.png_axes(path, source, (6.5, 4.5)) as ax:
        _draw_links(report, ax)


def _draw_links(report: dict[str, Any], ax: Any) -> None:
    rows = [r for r in report["runs"] if r.get("model_samples_per_s")]
    base = {r["aggregation"]: r["samples_per_s"] for r in report["runs"] if r["slots"] == 1}
    for i, agg in enumerate(sorted({r["aggregation"] for r in rows})):
        for fp16, marker in ((False, "o"), (True, "s")):
            pts = sorted(
                (det_netns.LINKS[r["name"].split()[1]][0] / 1e9, r["efficiency"], r["model_samples_per_s"])
                for r in rows
                if r["aggregation"] == agg and r["name"].endswith("fp16") == fp16
            )
            if not pts:
                continue
            label = f"agg {agg}" + (" fp16" if fp16 else "")
            color = f"C{i}"
            ax.plot(
                [p[0] for p in pts], [p[1] for p in pts], marker + "-", color=color, label=label + " measured"
            )
            ax.plot([p[0] for p in pts], [p[2] / base[agg] / 2 for p in pts], marker, color=color,
                    mfc="none", ls=":", label=label + " model")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("link rate (Gbit/s)")
    ax.set_ylabel("per-slot efficiency (speedup / 2)")
    ax.set_title("2 machines x 1 slot vs 1 x 1, the embedded default (MiniLM)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)


@cli.boundary
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", default="10gbit,1gbit,100mbit")
    parser.add_argument("--aggregation", default="1,2,4")
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "multi-machine")
    args = parser.parse_args()
    why = det_cluster.supported() or det_netns.supported()
    if why:
        print(f"error: cannot emulate machines here: {why}", file=sys.stderr)
        return 2
    links = args.links.split(",")
    aggs = [int(a) for a in args.aggregation.split(",") if a.strip()]
    unknown = [link for link in links if link not in det_netns.LINKS]
    if unknown or args.batches % (4 * max(aggs)):
        print(f"error: links must be among {list(det_netns.LINKS)} and --batches a multiple of "
              f"{4 * max(aggs)}; got {args.links} / {args.batches}", file=sys.stderr)  # fmt: skip
        return 2
    slowest = min(links, key=lambda link: det_netns.LINKS[link][0])
    plan = [(1, a, "10gbit", False) for a in aggs]
    plan += [(2, a, link, False) for link in links for a in aggs]
    plan += [(2, a, slowest, True) for a in aggs]
    runs: list[scaling_runs.RunInputs] = []
    started = time.time()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        dev = small_validation_set(tmp)
        for i, (machines, agg, link, compression) in enumerate(plan):
            conf, hp = config_for(machines, agg, args.batches, compression, dev)
            runs.append(run(tmp / f"run{i}", conf, hp, machines, link))
            print(f"{runs[-1].name}: {runs[-1].state}", file=sys.stderr)
    report = scaling_report.build_report(runs, "multi-machine")
    p = parameters()
    base = {r["aggregation"]: r["samples_per_s"] for r in report["runs"] if r["slots"] == 1}
    rows = []
    for r in report["runs"]:
        if r["slots"] != 2 or r["samples_per_s"] is None or base.get(r["aggregation"]) is None:
            continue
        link = r["name"].split()[1]
        fp16 = r["name"].endswith("fp16")
        predicted = model_rate(base[r["aggregation"]], r["aggregation"], link, (2 if fp16 else 4) * p)
        r["model_samples_per_s"] = round(predicted, 3)
        r["measured_over_model"] = round(r["samples_per_s"] / predicted, 3)
        rows.append(r)
    report["definitions"]["model_samples_per_s"] = (
        "docs/scaling.md: n a b / (a b / r + 2 (n-1)/n S / B), r = the 1-slot run's samples/s at the same "
        f"aggregation, b = {PER_SLOT_BATCH}, S = 4 P (2 P with fp16 compression), P = {p}, B = the link rate"
    )
    by = {(r["name"].split()[1], r["aggregation"], r["name"].endswith("fp16")): r for r in rows}
    check = None
    if (slowest, 1, False) in by and (slowest, 4, False) in by:
        check = round(by[(slowest, 4, False)]["samples_per_s"] / by[(slowest, 1, False)]["samples_per_s"], 3)
    report["slowest_link_agg4_over_agg1"] = check
    report["link_delay"] = sorted(
        "none (no sch_netem in this kernel: rate-limited by tbf only)" if d is None else d for d in DELAYS
    )
    report["wall_minutes"] = round((time.time() - started) / 60, 1)
    report = {**provenance("bench.multi_machine", sys.argv[1:]), **report}
    scaling_report.write_report(report, args.out, draw=plot_links)
    print(json.dumps({"runs": [{k: r.get(k) for k in ("name", "samples_per_s", "speedup", "efficiency",
                                                       "model_samples_per_s", "measured_over_model")}
                               for r in report["runs"]],
                      "slowest_link_agg4_over_agg1": check, "parameters": p}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
