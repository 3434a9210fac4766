"""bench.lr_scaling's plan and report, on made-up rows: the phases it decides, the seeds each cell
gets, the goals it judges."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from tests.support.project import completed


def _bench(script: str, *args: str) -> str:
    done = completed(["-m", f"bench.{script.removesuffix('.py')}", *args])
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


SEEDS = [42, 43, 44, 45, 46]


ONE_X = [50.0, 52.0, 51.0, 53.0, 49.0]  # F1 at 1x, seed by seed


RADAM_SHIPPED = "RAdam 2x as shipped (the best form at 2x{}: warm-up 0, beta2 {}), sqrt, within 3 of AdamW 2x"


def _add(rows: list[dict], k: int, rule: str, lr: float, f1s: list[float], optimizer: str = "adamw",
         **more: float) -> None:  # fmt: skip
    for seed, f1 in zip(SEEDS, f1s, strict=False):  # 3 F1s: the first 3 seeds
        cell = {"optimizer": optimizer, "aggregation_frequency": k, "lr_scaling": rule}
        row = {**cell, "learning_rate": lr, "warmup_ratio": 0.1, **more, "seed": seed}
        rows.append({**row, "f1": f1, "exact_match": f1 - 8})


def test_lr_scaling_report_pairs_seeds_and_judges_the_goals(tmp_path: Path) -> None:
    """bench/lr_scaling.py report on recorded rows: the reference lr is the best at 1x, goals are
    paired differences on shared seeds, RAdam's forms (beta2 0.999 / 0.99 / 0.95) are cells of
    their own and the best at 2x is the one the goal judges, the cells not run yet are 'not
    measured yet'. The plot replaces what stood at its path whole, never writing through a link."""
    (tmp_path / "lr.png").symlink_to(tmp_path / "kept.png")
    (tmp_path / "kept.png").write_bytes(b"another file")
    out = _report(_recorded_rows(), tmp_path, "--png", str(tmp_path / "lr.png"))
    assert "reference learning rate at 4 samples/step (best mean F1 at 1x, seeds 42, 43, 44): 0.0001" in out
    assert "Goals, with the best rule at 8x (sqrt):" in out
    assert "- PASS AdamW 4x, sqrt, within 2 of 1x: paired F1 difference -0.80 [-0.80, -0.80]" in out
    assert "- PASS AdamW 8x, sqrt, within 4 of 1x: paired F1 difference -1.60" in out
    # no lr swept at 8x yet: no verdict (the rule against itself would read PASS +0.00)
    assert "AdamW 8x, sqrt, within 1.5 of the best swept lr: not measured yet (the sweep at 8x" in out
    # two of the four forms measured: the better one is judged, marked as chosen from a part
    assert f"- PASS {RADAM_SHIPPED.format(', not all measured yet', 0.99)}: paired F1 difference -0.60" in out
    assert "  - RAdam 2x (warm-up 0, beta2 0.999), not shipped: paired F1 difference to AdamW 2x -7.60" in out
    assert "| radam | 2 | 8 | sqrt | 0.0001 | 0.000141 | 0 | 0.999 | 3 | 5 | 43.00 ± " in out
    assert "| radam | 2 | 8 | sqrt | 0.0001 | 0.000141 | 0 | 0.99 | 3 | 5 | 50.00 ± " in out
    assert "| adamw | 8 | 32 | linear | 0.0001 | 0.0008 | 0.1 | 0.999 | 3 | 5 | 46.94 ± " in out
    assert (tmp_path / "lr.png").stat().st_size > 10_000 and not (tmp_path / "lr.png").is_symlink()
    assert (tmp_path / "kept.png").read_bytes() == b"another file"


def test_lr_scaling_report_judges_the_sweeps_the_radam_forms_and_the_longer_run(tmp_path: Path) -> None:
    """The same rows plus the sweep at 8x on the first 3 seeds (both worse than the rule's own
    2.83e-4), every RAdam form on the first 3 seeds (beta2 0.95 the best there: judged,
    provisional until 5 seeds), 8x for 6 epochs, and one lr between sqrt and linear at 4x."""
    rows, one = _recorded_rows(), ONE_X
    rule8 = 1e-4 * 8**0.5
    _add(rows, 8, "none", rule8 / 2, [f - 5 for f in one[:3]])
    _add(rows, 8, "none", rule8 * 2, [f - 4 for f in one[:3]])
    _add(rows, 2, "sqrt", 1e-4, [f - 2 for f in one[:3]], "radam", warmup_ratio=0.1, adam_beta2=0.999)
    _add(rows, 2, "sqrt", 1e-4, [f - 0.5 for f in one[:3]], "radam", warmup_ratio=0.0, adam_beta2=0.95)
    _add(rows, 8, "sqrt", 1e-4, [f + 5 for f in one[:3]], epochs=6)  # rows without `epochs` ran 3
    _add(rows, 4, "none", (2e-4 * 4e-4) ** 0.5, [f - 0.5 for f in one[:3]])  # between sqrt and linear
    out = _report(rows, tmp_path)
    assert (
        "- PASS AdamW 8x, sqrt, within 1.5 of the best swept lr: the rule's own lr (0.000283) is the "
        "best of 0.000141, 0.000283, 0.000566"
    ) in out
    assert (
        f"- PASS {RADAM_SHIPPED.format('', 0.95)}: paired F1 difference -0.10 [-0.10, -0.10] "
        "(goal >= -3.0; n = 3 of 5, provisional)"
    ) in out
    assert (
        "  - RAdam 2x (warm-up 0.1, beta2 0.999), not shipped: paired F1 difference to AdamW 2x -1.60" in out
    )
    assert "  - RAdam 2x (warm-up 0, beta2 0.99), not shipped: paired F1 difference to AdamW 2x -0.60" in out
    assert "- PASS AdamW 8x, sqrt, within 4 of 1x: paired F1 difference -1.60" in out  # 6 epochs: apart
    assert (
        "  - the best lr at 4x of 0.0001, 0.0002, 0.000283, 0.0004 (the rules' and one between): 0.000283, "
        "paired F1 difference to 1x -0.50 [-0.50, -0.50] (n = 3)"
    ) in out
    assert "| adamw | 8 | 32 | sqrt | 0.0001 | 0.000283 | 0.1 | 0.999 | 6 | 3 | 56.00 ± 1.00 |" in out
    assert (
        "AdamW 8x, sqrt, 6 epochs (4x's optimizer steps at 8x's batch): F1 56.00 ± 1.00 (n = 3); paired "
        "F1 difference to 8x at 3 epochs +6.60 [+6.60, +6.60], to 4x +5.80 [+5.80, +5.80]"
    ) in out


def test_lr_scaling_plan_decides_each_phase_on_three_seeds_and_runs_them_seed_by_seed() -> None:
    """Phase 1 decides on the first 3 seeds (a report before it completes says provisional);
    phase 2 runs seed by seed, so a study stopped anywhere keeps its cells paired."""
    from bench import lr_scaling

    seeds = (42, 43, 44, 45, 46)

    def played(runs: list) -> list[dict]:
        return [{**r.cell, "seed": r.seed, "f1": _landscape(r.cell, r.seed), "exact_match": 0} for r in runs]

    out = lr_scaling.report({"rows": played(lr_scaling.todo([], seeds)[:4])}, None, seeds)
    assert "-- provisional: phase 1 is not complete" in out and "phase 2 is not complete" in out
    phase1 = played(lr_scaling.todo([], seeds))
    phase2 = lr_scaling.todo(phase1, seeds)
    assert [r.seed for r in phase2] == [42] * 9 + [43] * 9 + [44] * 9 + [45, 46]
    assert len({json.dumps(r.cell, sort_keys=True) for r in phase2[:9]}) == 9
    assert len(lr_scaling.planned(phase1, seeds)) == 9 + 2 + 27  # each run once: the progress count


def test_lr_scaling_plan_gives_five_seeds_only_to_the_cells_a_goal_compares() -> None:
    """The whole study played against the landscape: the compared cells get 5 seeds, the rest 3;
    at 4x (best lr 1.2x the rule's) one lr runs between the rule's and linear's -- 99 runs, not
    145 with 5 seeds everywhere."""
    from bench import lr_scaling

    seeds = (42, 43, 44, 45, 46)
    rows = _play_lr_study(_landscape)
    assert "provisional" not in lr_scaling.report({"rows": rows}, None, seeds)
    assert len(rows) == 99
    cell = lr_scaling.cell
    rule8 = lr_scaling.resolved(cell("adamw", 8, "sqrt", 1e-4))
    five = [
        cell("adamw", 1, "none", 1e-4),
        *(cell("adamw", k, "sqrt", 1e-4) for k in (2, 4, 8)),
        cell("radam", 2, "sqrt", 1e-4, warmup=0.0, beta2=0.95),  # the form to ship
        cell("adamw", 8, "none", 2 * rule8),  # the oracle
    ]
    counts = _runs_per_cell(rows)
    assert {k for k, n in counts.items() if n == 5} == {json.dumps(c, sort_keys=True) for c in five}
    assert set(counts.values()) == {3, 5} and 5 * len(counts) == 145
    between = cell("adamw", 4, "none", (2e-4 * 4e-4) ** 0.5)  # towards linear, the better neighbour
    assert lr_scaling.between_at_4x(rows, 1e-4, seeds[:3]) == between
    assert counts[json.dumps(between, sort_keys=True)] == 3


def test_lr_scaling_plan_sweeps_radam_lamb_and_the_oracle_where_the_landscape_says() -> None:
    """Of RAdam's four forms only the best at 2x (beta2 0.95) gets 5 seeds; the oracle sweep, best
    at its upper end (x2), grows to x4 (worse, so it stops); LAMB gets its own reference lr at 1x
    (1e-3, inside its sweep) and runs 8x from it by the rule; the rule at 8x runs again for twice
    the epochs (4x's optimizer steps)."""
    from bench import lr_scaling

    seeds = (42, 43, 44, 45, 46)
    rows = _play_lr_study(_landscape)
    counts, cell = _runs_per_cell(rows), lr_scaling.cell
    rule8 = lr_scaling.resolved(cell("adamw", 8, "sqrt", 1e-4))
    forms = {
        (r["aggregation_frequency"], r["warmup_ratio"], r["adam_beta2"])
        for r in rows
        if r["optimizer"] == "radam"
    }
    assert forms == {
        (k, w, b) for k in (1, 2) for w, b in ((0.1, 0.999), (0.0, 0.999), (0.0, 0.99), (0.0, 0.95))
    }
    shipped = cell("radam", 2, "sqrt", 1e-4, warmup=0.0, beta2=0.95)
    assert lr_scaling.radam_choice(rows, "sqrt", 1e-4, seeds[:3]) == shipped
    swept = lr_scaling.swept_at_8x(rows, 1e-4, "sqrt", seeds[:3])
    assert [c["learning_rate"] for c in swept[1:]] == [0.5 * rule8, 2 * rule8, 4 * rule8]  # grown past x2
    assert all(counts[json.dumps(c, sort_keys=True)] >= 3 for c in swept)
    assert lr_scaling.oracle(rows, 1e-4, "sqrt", seeds[:3]) == cell("adamw", 8, "none", 2 * rule8)
    lamb = {(r["aggregation_frequency"], r["learning_rate"]) for r in rows if r["optimizer"] == "lamb"}
    assert lamb == {(1, 5e-4), (1, 1e-3), (1, 2e-3), (8, 1e-3)}  # not AdamW's 1e-4
    assert counts[json.dumps(cell("lamb", 8, "sqrt", 1e-3), sort_keys=True)] == 3
    out = lr_scaling.report({"rows": rows}, None, seeds)
    lamb_line = "LAMB's reference lr at 1x (best of 0.0005, 0.001, 0.002 on the first 3 seeds): 0.001"
    assert lamb_line + "\n" in out
    assert "| lamb | 8 | 32 | sqrt | 0.001 | 0.00283 | 0.1 | 0.999 | 3 | 3 |" in out
    # 8x for 6 epochs: a cell of its own, which the 3-epoch cell's rows and goals never include
    longer = cell("adamw", 8, "sqrt", 1e-4, epochs=6)
    assert lr_scaling.more_steps("sqrt", 1e-4) == longer and counts[json.dumps(longer, sort_keys=True)] == 3
    assert "| adamw | 8 | 32 | sqrt | 0.0001 | 0.000283 | 0.1 | 0.999 | 6 | 3 |" in out
    assert "| adamw | 8 | 32 | sqrt | 0.0001 | 0.000283 | 0.1 | 0.999 | 3 | 5 |" in out
    assert "AdamW 8x, sqrt, 6 epochs (4x's optimizer steps at 8x's batch): F1 " in out
    best4 = "  - the best lr at 4x of 0.0001, 0.0002, 0.000283, 0.0004 (the rules' and one between): 0.000283"
    assert best4 in out


def test_lr_scaling_reference_sweep_grows_past_an_edge_that_scores_best() -> None:
    """F1 at 1x peaks at 3e-4, above the sweep 5e-5 / 1e-4 / 2e-4: the sweep adds 4e-4 (now the
    best, again the edge) and 8e-4 (worse), stops there, and 4e-4 is the reference every later
    phase scales from."""

    from bench import lr_scaling

    def f1(c: dict, seed: int) -> float:
        best = 3e-4 * math.sqrt(c["aggregation_frequency"])
        return 60 - 10 * abs(math.log2(lr_scaling.resolved(c) / best)) + 0.1 * (seed - 44)

    rows = _play_lr_study(f1)
    ones = {r["learning_rate"] for r in rows if r["aggregation_frequency"] == 1 and r["optimizer"] == "adamw"}
    assert sorted(ones) == [5e-5, 1e-4, 2e-4, 4e-4, 8e-4]
    assert lr_scaling.reference_lr(rows, (42, 43, 44)) == 4e-4
    counts = _runs_per_cell(rows)
    assert counts[json.dumps(lr_scaling.cell("adamw", 1, "none", 4e-4), sort_keys=True)] == 5
    assert counts[json.dumps(lr_scaling.cell("adamw", 1, "none", 8e-4), sort_keys=True)] == 3
    between = lr_scaling.between_at_4x(rows, 4e-4, (42, 43, 44))["learning_rate"]  # scaled from 4e-4 too
    assert between == (4e-4 * 8e-4) ** 0.5  # the peak (6e-4) lies below sqrt's 8e-4: towards none's 4e-4
    assert all(
        r["learning_rate"] == 4e-4
        for r in rows
        if r["aggregation_frequency"] in (2, 4) and r["learning_rate"] != between
    )


def _recorded_rows() -> list[dict]:
    """Every rule at every scale on 5 seeds, and two of RAdam's forms at 2x."""
    rows: list[dict] = []
    _add(rows, 1, "none", 5e-5, [f - 10 for f in ONE_X])
    _add(rows, 1, "none", 1e-4, ONE_X)  # the best at 1x: the reference
    _add(rows, 1, "none", 2e-4, [f - 3 for f in ONE_X])
    for k in (2, 4, 8):
        _add(rows, k, "none", 1e-4, [f - 3 * k for f in ONE_X])
        _add(rows, k, "sqrt", 1e-4, [f - 0.2 * k for f in ONE_X])  # within the goals
        _add(rows, k, "linear", 1e-4, [f - 0.5 * k + (0.3 if i % 2 else -0.3) for i, f in enumerate(ONE_X)])
    _add(rows, 2, "sqrt", 1e-4, [f - 8 for f in ONE_X], "radam", warmup_ratio=0.0, adam_beta2=0.999)
    _add(rows, 2, "sqrt", 1e-4, [f - 1 for f in ONE_X], "radam", warmup_ratio=0.0, adam_beta2=0.99)
    return rows


def _report(rows: list[dict], tmp_path: Path, *extra: str) -> str:
    path = tmp_path / "lr.json"
    path.write_text(json.dumps({"config": "local.yaml", "micro_batch": 4, "rows": rows}))
    return _bench("lr_scaling.py", "report", "--json", str(path), *extra)


def _play_lr_study(f1: Callable[[dict, int], float]) -> list[dict]:
    """bench/lr_scaling.py's whole plan played against a made-up F1 landscape, pass by pass as
    its run() does (each pass runs what the rows so far have decided)."""
    from bench import lr_scaling

    seeds, rows = (42, 43, 44, 45, 46), []
    for _ in range(10):
        pending = lr_scaling.todo(rows, seeds)
        if not pending:
            break
        rows += [{**r.cell, "seed": r.seed, "f1": f1(r.cell, r.seed), "exact_match": 0.0} for r in pending]
    assert not lr_scaling.todo(rows, seeds)
    assert len(rows) == len({(json.dumps(r, sort_keys=True)) for r in rows})
    return rows


def _runs_per_cell(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        fields = ("optimizer", "aggregation_frequency", "lr_scaling", "learning_rate", "warmup_ratio",
                  "adam_beta2", "epochs")  # fmt: skip
        key = json.dumps({k: r[k] for k in fields if k in r}, sort_keys=True)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _landscape(c: dict, seed: int) -> float:
    """A made-up F1 landscape: the best lr grows as sqrt(k), and 1.2x / 1.6x more at 4x / 8x, so
    twice the rule's lr beats it at 8x; LAMB's best is 10x AdamW's; RAdam loses the more, the
    smaller its beta2's adaptive share and the longer its warm-up."""
    from bench import lr_scaling

    k = c["aggregation_frequency"]
    best = 1e-4 * math.sqrt(k) * {4: 1.2, 8: 1.6}.get(k, 1.0) * (10 if c["optimizer"] == "lamb" else 1)
    radam = 0.0
    if "adam_beta2" in c:
        radam = {0.999: 20, 0.99: 4, 0.95: 1}[c["adam_beta2"]] + 10 * c["warmup_ratio"]
    return 60 - 10 * abs(math.log2(lr_scaling.resolved(c) / best)) + 0.1 * (seed - 44) - radam
