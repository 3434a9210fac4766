"""Two machines in one box: a 2-container allocation over a shaped link (tests/support/det_netns.py),
each container started as a 0.38.1 agent starts it (tests/support/det_cluster.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_cluster import assert_equals_one_process_evaluation, assert_same, final, shaped_like

from tests.support import det_cluster, det_netns

WHY_NOT = det_cluster.supported() or det_netns.supported()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"two emulated machines: {WHY_NOT}")
TIMEOUT_S = 8  # SQUAD_COLLECTIVE_TIMEOUT_S for these runs


def multi_machine_conf(model: Path, tmp: Path) -> tuple[dict, dict]:
    """multi_machine.yaml (aggregation 2, RAdam) on 2 machines x 1 slot, 24 batches."""
    conf, hp = shaped_like("multi_machine.yaml", model, tmp, batches=24, slots=2)
    conf["data"]["cache_dir"] = ".cache/features"  # relative: inside each container, per machine
    env = [v for v in conf["environment"]["environment_variables"] if not v.startswith("SQUAD_")]
    conf["environment"]["environment_variables"] = [*env, f"SQUAD_COLLECTIVE_TIMEOUT_S={TIMEOUT_S}"]
    return conf, hp


def run_two_machines(tmp: Path, conf: dict, hp: dict, **kw: Any) -> tuple[Any, Any]:
    with det_netns.machines(2, link="1gbit") as net:
        with det_cluster.emulated_cluster(tmp, network=net, env={"GLOO_SOCKET_IFNAME": "eth0"}) as cluster:
            if "on_report" in kw:
                cluster.master.on_report = kw.pop("on_report")(cluster, net)
            if "after" in kw:
                kw["after"] = kw["after"](net)
            record = cluster.run_trial(conf, hp, containers=2, slots_per_container=1, timeout=400, **kw)
            assert cluster.master.errors == [], cluster.master.errors
            return cluster, record


@pytest.fixture(scope="module")
def two_machines(
    tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict, dict, Any, Any]:
    tmp = tmp_path_factory.mktemp("two-machines")
    conf, hp = multi_machine_conf(tiny_bert, tmp)
    cluster, record = run_two_machines(tmp, conf, hp)
    assert record.exit_codes == [0], record.failures()
    return tmp, conf, hp, cluster, record


def test_two_machines_train_and_equal_a_one_process_evaluation(two_machines) -> None:
    tmp, _, _, cluster, _ = two_machines
    assert_equals_one_process_evaluation(cluster, tmp)


def test_each_machine_builds_its_own_cache_and_gets_the_same_settings(two_machines) -> None:
    _, _, _, _, record = two_machines
    log = record.logs[0]
    for rank in (0, 1):
        line = re.search(
            rf"\[rank={rank}\] .*rank {rank} of 2: features train (\w+) / validation (\w+) in (\S+);(.*)", log
        )
        assert line, f"no startup line from rank {rank}"
        # Each machine tokenized for itself, into its own container's directory.
        assert line.group(1) == "built" and line.group(2) == "built"
        assert line.group(3).startswith("/run/determined/workdir/")
        # multi_machine.yaml's settings reached both machines unchanged.
        assert (
            "aggregation_frequency=2 optimizer=radam gradient_compression=False global_batch_size=8"
            in line.group(4)
        )
        # The recipe's rule at 8 x 2 samples per step: 1e-3 (shaped_like's) x sqrt(16 / 32).
        assert f"learning_rate={RESOLVED_LR:.6g} (lr_scaling sqrt from 0.001 at 32 samples" in line.group(4)


RESOLVED_LR = 1e-3 * (8 * 2 / 32) ** 0.5


def test_the_chief_alone_warns_that_radam_is_too_short(two_machines) -> None:
    """12 optimizer steps of RAdam: its rectifier lets almost none of the lr through; rank 0 says
    so once, before training, in the log the WebUI shows."""
    _, _, _, _, record = two_machines
    warned = [line for line in record.logs[0].splitlines() if "rectifier keeps the step under half" in line]
    assert len(warned) == 1 and "[rank=0]" in warned[0] and "WARNING" in warned[0], warned
    assert "over this run's 12 optimizer steps" in warned[0]


def test_the_master_records_the_resolved_learning_rate(two_machines) -> None:
    """multi_machine.yaml as the master hands it (aggregation 2, lr_scaling sqrt): 12 optimizer
    steps, warm-up int(0.1 x 12) = 1 step, so the first report (2 batches, step 0) is the peak."""
    _, _, _, cluster, _ = two_machines
    training = [r for r in cluster.master.metrics if r["group"] == "training"]
    lrs = [r["metrics"]["lr"] for r in training]
    assert lrs[0] == pytest.approx(RESOLVED_LR, rel=1e-6) and max(lrs) == pytest.approx(RESOLVED_LR, rel=1e-6)


def test_cut_link_fails_in_bounded_time_and_the_restart_matches(two_machines, tmp_path: Path) -> None:
    _, conf, hp, baseline, _ = two_machines
    cut_at: dict[str, float] = {}

    def cut_machine_1_at_step_8(cluster: Any, net: Any) -> Any:
        def hook(report: dict) -> None:
            if report["group"] == "training" and report["steps_completed"] == 8 and not cut_at:
                net.cut(1)
                cut_at["t"] = time.monotonic()

        return hook

    def reconnect(net: Any) -> Any:
        def after(alloc: Any, codes: list[int]) -> None:
            if cut_at and "ended" not in cut_at:
                cut_at["ended"] = alloc.ended
                det_netns._ip("ip", "link", "set", "eth0", "up", ns=net.machines[1][0])

        return after

    cluster, record = run_two_machines(tmp_path, conf, hp, on_report=cut_machine_1_at_step_8, after=reconnect)
    assert cut_at, "the link was never cut"
    # The run ended on its own, within the configured collective timeout plus teardown.
    assert cut_at["ended"] - cut_at["t"] < TIMEOUT_S + 60
    assert record.exit_codes[0] != 0 and record.exit_codes[-1] == 0 and len(record.exit_codes) == 2
    assert "error: a peer process stopped answering during a collective" in record.logs[0]
    # The restart resumed from the step-6 checkpoint and ended equal to the uninterrupted run.
    second = [r for r in cluster.master.metrics if r["trial_run_id"] == 2 and r["group"] == "training"]
    assert second[0]["steps_completed"] == 8
    assert_same(final(cluster.master), final(baseline.master))


def test_namespaces_are_removed_on_failure() -> None:
    import subprocess

    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with pytest.raises(RuntimeError):
        with det_netns.machines(2, link="100mbit"):
            raise RuntimeError("boom")
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert after == before
