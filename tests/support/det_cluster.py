"""A Determined 0.38.1 cluster in miniature, for tests: a stand-in master and emulated containers.

Not product code. The trial is started exactly as a 0.38.1 agent starts it
(master/static/srv/entrypoint.sh): in a container of its own -- here a private mount namespace
with a tmpfs at /run/determined and the checkpoint storage bind-mounted at
/determined_shared_fs -- with the environment the master and agent set
(master/pkg/tasks/task.go:196-240, task_trial.go:114-126, agent/internal/containers/spec.go:
140-152 and 215-225), then

    python3 -m determined.exec.prep_container --download_context_directory --resources --proxy
    test -f startup-hook.sh && source startup-hook.sh
    python3 -m determined.exec.prep_container --rendezvous
    exec python3 -m determined.exec.launch          # runs the YAML's entrypoint

against the stand-in master of tests/support/det_master.py, which serves the context as `det experiment
create` builds it. Like the master, `Cluster` starts a preempted trial again and restarts a failed
one from its latest checkpoint, as `max_restarts` does. `python3 -m tests.support.det_cluster local.yaml`
runs a whole YAML.

One idea: an agent's container start, step by step as 0.38.1 does it; the steps only make sense
in their order.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from determined.common.api import bindings

from extractive_qa.config import experiment
from extractive_qa.errors import ConfigError

from .det_master import ROOT, TASK_ID, Allocation, Master

SHARED_FS = Path("/determined_shared_fs")  # determined.constants.SHARED_FS_CONTAINER_PATH
RUN_DIR = Path("/run/determined")
EXPCONF_DEFAULTS = ROOT.parent / "shared" / "tools" / "expconf_defaults.py"


def supported() -> str | None:
    """Why containers cannot be emulated here (None when they can)."""
    if os.geteuid() != 0:
        return "needs root (private mount namespaces per emulated container)"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"unshare -m failed: {probe.stderr.strip()}"
    return None


def free_ports(n: int) -> list[int]:
    """n distinct ports free right now (held open together, so none is handed out twice).

    Every emulated allocation gets its own c10d port and its own two ZMQ ports
    (INTER_TRAIN_PROCESS_COMM_PORT_1/_2), as a real master does from its port registry
    (master/internal/task/allocation.go: `getPorts(spec.UniqueExposedPortRequests)`, then
    `spec.ExtraEnvVars[portName]`; the requests are task_trial.go's DTRAIN_SSH_PORT,
    INTER_TRAIN_PROCESS_COMM_PORT_1/2 and C10D_PORT). With Determined's defaults
    (determined/constants.py) a second emulated cluster on the same host -- another test run
    beside this one -- can hold them: the restarted allocation of the pause test exits 1, its
    chief cannot bind its broadcast server (`zmq.error.ZMQError: Address already in use`), and
    rank 1 connects to the other run's chief and receives its serial messages instead of a hello
    (`RuntimeError: got non-_HelloMessage: _SerialMessage`). The 2-slot fixture of
    tests/test_cluster.py holds the two default ZMQ ports open while it runs, so it fails at once
    without per-allocation ports.
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@dataclass
class TrialRun:
    """One trial as the master drives it: allocations until it completes or runs out of restarts."""

    exit_codes: list[int] = field(default_factory=list)
    preempted: int = 0
    logs: list[str] = field(default_factory=list)

    def failures(self) -> str:
        """The end of each failed allocation's log: the message of an exit-code assertion."""
        failed = [
            f"--- allocation {i} exited {code}:\n{log[-3000:]}"
            for i, (code, log) in enumerate(zip(self.exit_codes, self.logs, strict=True))
            if code != 0
        ]
        return "\n".join(failed) or "no allocation failed"


class Cluster:
    """Runs trials of one experiment config on emulated containers against a stand-in master."""

    def __init__(
        self,
        master: Master,
        storage: Path,
        workdir: Path,
        env: dict[str, str] | None = None,
        machines: list[tuple[str, str]] | None = None,
        store: Any = None,
    ):
        self.master = master
        # (network namespace, address) per container rank: separate hosts (tests/support/det_netns.py);
        # None: every container on this host's loopback.
        self.machines = machines
        self.storage = storage  # shared_fs host_path
        # An S3 or GCS bucket on loopback (tests/support/object_stores.py) instead of shared_fs:
        # the trial is handed its checkpoint_storage, the containers the SDK's variables.
        self.store = store
        shared_fs = {"type": "shared_fs", "host_path": str(storage)}
        master.checkpoint_storage = store.storage() if store else shared_fs
        self.workdir = workdir
        self.extra_env = {**(store.env if store and store.kind == "gcs" else {}), **(env or {})}
        storage.mkdir(parents=True, exist_ok=True)
        workdir.mkdir(parents=True, exist_ok=True)
        self.run_id = 0

    def experiment_config(self, conf: dict[str, Any]) -> dict[str, Any]:
        """The config as the master hands it: every schema default filled (by the master's own
        schemas through ../shared/tools/expconf_defaults.py where present), shared_fs storage."""
        import yaml

        if self.store is not None:
            conf = {**conf, "checkpoint_storage": self.store.storage()}
        if EXPCONF_DEFAULTS.is_file():
            path = self.workdir / f"exp-{uuid.uuid4().hex[:8]}.yaml"
            path.write_text(yaml.safe_dump(conf))
            out = subprocess.run(
                [sys.executable, str(EXPCONF_DEFAULTS), str(path), "--checkpoint-dir", str(self.storage)],
                capture_output=True,
                text=True,
                check=True,
            )
            return json.loads(out.stdout)
        conf = experiment.with_master_defaults(conf)
        conf["checkpoint_storage"] = {
            **(self.store.storage() if self.store else {"type": "shared_fs", "host_path": str(self.storage)}),
            "save_experiment_best": 0,
            "save_trial_best": 1,
            "save_trial_latest": 1,
        }
        conf.setdefault("debug", False)
        return conf

    def _env(self, conf: dict, hparams: dict, alloc: Allocation, rank: int, slots: list[int]) -> dict:
        latest = self.master.checkpoints[-1] if self.master.checkpoints else None
        env = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.workdir / f"home-{rank}"),  # each machine its own home
            "LANG": "C.UTF-8",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            # agent/internal/containers/spec.go
            "DET_MASTER": self.master.url,
            "DET_MASTER_HOST": self.master.host,
            "DET_MASTER_ADDR": self.master.host,
            "DET_MASTER_PORT": self.master.url.rsplit(":", 1)[1],
            "DET_CLUSTER_ID": "emulated-cluster",
            "DET_MASTER_ID": "emulated-master",
            "DET_AGENT_ID": f"agent-{rank}",
            "DET_CONTAINER_ID": f"{alloc.id}-c{rank}",
            "DET_SLOT_IDS": json.dumps(slots),
            # master/pkg/tasks/task.go EnvVars
            "PYTHONUSERBASE": "/run/determined/pythonuserbase",
            "DET_TASK_ID": TASK_ID,
            "DET_ALLOCATION_ID": alloc.id,
            "DET_RESOURCES_ID": f"{alloc.id}-c{rank}",
            "DET_RESOURCES_TYPE": "docker-container",
            "DET_SESSION_TOKEN": "allocation-token",
            "DET_USER_TOKEN": "user-token",
            "DET_USER": "determined",
            "DET_WORKDIR": str(RUN_DIR / "workdir"),
            "DET_RUN_DIR": str(RUN_DIR),
            "DET_USE_TLS": "false",
            "DET_SEGMENT_ENABLED": "false",
            "DET_TASK_LOGGING_METADATA": json.dumps({"allocation_id": alloc.id, "task_id": TASK_ID}),
            # master/pkg/tasks/task_trial.go
            "DET_TASK_TYPE": "TRIAL",
            "DET_EXPERIMENT_ID": str(self.master.experiment_id),
            "DET_TRIAL_ID": str(self.master.trial_id),
            "DET_TRIAL_RUN_ID": str(self.run_id),
            "DET_TRIAL_SEED": str(conf["reproducibility"]["experiment_seed"] % 2**31),
            "DET_EXPERIMENT_CONFIG": json.dumps(conf),
            "DET_HPARAMS": json.dumps(hparams),
            "DET_STEPS_COMPLETED": str(latest.steps_completed if latest else 0),
        }
        # The ports the master's registry assigns each allocation (task.go's
        # UniqueExposedPortRequests, handed as env vars in internal/task/allocation.go): torch's
        # c10d store and Determined's ZMQ broadcast (chief pub / pull). Left at the harness's
        # defaults (12360 / 12376), a second cluster on this host, or a container of the
        # previous allocation still exiting, answers a rank's hello: the pause test's restart
        # failed that way ("got non-_HelloMessage: _SerialMessage").
        env.update(self.ports)
        if latest:
            env["DET_LATEST_CHECKPOINT"] = latest.uuid
        env.update(self.extra_env)
        return env

    def checkpoint_dir(self, uuid: str) -> Path:
        """A checkpoint the trial reported, as a directory here: in the shared_fs storage, or
        downloaded from the bucket (once) with Determined's own storage manager."""
        if self.store is None:
            return self.storage / uuid
        target = self.workdir / "downloaded" / uuid
        if not target.is_dir():
            with self.store.environment():
                self.store.manager().download(uuid, target)
        return target

    def host_tmp_entries(self) -> list[Path]:
        """The top-level /tmp entries a container still needs to see: this cluster's files
        (pytest's tmp root), the Python environment and the project, where they lie under /tmp
        (a CI clone may)."""
        keep = set()
        for path in (self.workdir, Path(sys.prefix), ROOT):
            parts = path.resolve().parts
            if len(parts) > 2 and parts[1] == "tmp":
                keep.add(Path("/tmp", parts[2]))
        return sorted(keep)

    def start(
        self, conf: dict, hparams: dict, containers: int = 1, slots_per_container: int = 1
    ) -> Allocation:
        self.run_id += 1
        alloc = Allocation(id=f"alloc-{uuid.uuid4().hex[:8]}")
        self.master.allocations[alloc.id] = alloc
        self.ports = dict(
            zip(
                ("C10D_PORT", "INTER_TRAIN_PROCESS_COMM_PORT_1", "INTER_TRAIN_PROCESS_COMM_PORT_2"),
                map(str, free_ports(3)),
                strict=True,
            )
        )
        if self.machines is not None:
            assert len(self.machines) >= containers, "one machine per container"
        addrs = [m[1] for m in self.machines[:containers]] if self.machines else ["127.0.0.1"] * containers
        for rank in range(containers):
            self.master.rendezvous[(alloc.id, f"{alloc.id}-c{rank}")] = bindings.v1RendezvousInfo(
                addresses=addrs, rank=rank, slots=[slots_per_container] * containers
            )
        for rank in range(containers):
            slots = list(range(slots_per_container))
            env = self._env(conf, hparams, alloc, rank, slots)
            # A container's /tmp is its own (Determined's pid_server socket lives there, named by
            # the allocation); what the run needs from the host's /tmp is bound back in.
            bind_back = "".join(
                f"mkdir -p {keep}; mount --bind /run/determined/.hosttmp/{keep.name} {keep}; "
                for keep in self.host_tmp_entries()
            )
            script = (
                "set -e; mkdir -p /run/determined /determined_shared_fs; "
                "mount -t tmpfs tmpfs /run/determined; "
                f"mount --bind {self.storage} /determined_shared_fs; "
                "mkdir -p /run/determined/.hosttmp; mount --bind /tmp /run/determined/.hosttmp; "
                "mount -t tmpfs tmpfs /tmp; "
                + bind_back
                + "mkdir -p /run/determined/info /run/determined/workdir; cd /run/determined/workdir; "
                "python3 -m determined.exec.prep_container --download_context_directory --resources --proxy; "
                "test -f startup-hook.sh && source startup-hook.sh; "
                "python3 -m determined.exec.prep_container --rendezvous; "
                "exec python3 -m determined.exec.launch"
            )
            log = open(self.workdir / f"{alloc.id}-c{rank}.log", "w")
            (self.workdir / f"home-{rank}").mkdir(exist_ok=True)
            host = ["ip", "netns", "exec", self.machines[rank][0]] if self.machines else []
            proc = subprocess.Popen(
                [*host, "unshare", "-m", "--propagation", "private", "bash", "-c", script],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            alloc.containers.append(proc)
        return alloc

    def wait(self, alloc: Allocation, timeout: float) -> list[int]:
        """Exit codes of every container. As the master does, when one container of an allocation
        fails, the others are killed rather than left to their own (long) timeouts."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = [proc.poll() for proc in alloc.containers]
            if all(code is not None for code in codes):
                return [int(code) for code in codes]  # type: ignore[arg-type]
            if any(code not in (None, 0) for code in codes):
                self.kill(alloc)
                return [
                    proc.wait() if code is None else int(code)  # killed: -9
                    for proc, code in zip(alloc.containers, codes, strict=True)
                ]
            time.sleep(0.2)
        self.kill(alloc)
        return [proc.wait() for proc in alloc.containers]

    def kill(self, alloc: Allocation) -> None:
        """Every process of the allocation: each container's group, and any process that left it
        (a rank the launcher started outside the container's process group outlived a killed
        container and waited on a collective for good), found by its DET_ALLOCATION_ID."""
        for proc in alloc.containers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in allocation_pids(alloc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def log(self, alloc: Allocation) -> str:
        return "\n".join(
            (self.workdir / f"{alloc.id}-c{rank}.log").read_text() for rank in range(len(alloc.containers))
        )

    def run_trial(
        self,
        conf: dict,
        hparams: dict,
        *,
        containers: int = 1,
        slots_per_container: int = 1,
        timeout: float = 300,
        during: Callable[[Allocation], None] | None = None,
        after: Callable[[Allocation, list[int]], None] | None = None,
    ) -> TrialRun:
        """Allocations until the trial completes: a preempted run is started again (a pause and
        activate), a failed one restarted from its latest checkpoint while max_restarts allows."""
        conf = self.experiment_config(conf)
        record = TrialRun()
        restarts = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alloc = self.start(conf, hparams, containers, slots_per_container)
            if during is not None:
                during(alloc)
                during = None  # a fault or preemption is injected into the first allocation only
            codes = self.wait(alloc, deadline - time.monotonic())
            alloc.ended = time.monotonic()
            if after is not None:
                after(alloc, codes)
            record.logs.append(self.log(alloc))
            code = next((c for c in codes if c != 0), 0)
            record.exit_codes.append(code)
            if code == 0 and alloc.preempt and alloc.acked:
                record.preempted += 1
                continue
            if code != 0 and restarts < int(conf.get("max_restarts", 5)):
                restarts += 1
                continue
            return record
        raise TimeoutError(
            f"trial did not finish within {timeout} s; logs:\n" + "\n".join(record.logs)[-4000:]
        )


def _allocation_processes(alloc: Allocation) -> Iterator[tuple[int, list[bytes], dict[bytes, bytes]]]:
    """(pid, command line, environment) of every process whose environment names the allocation."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            env = dict(
                kv.split(b"=", 1) for kv in (entry / "environ").read_bytes().split(b"\0") if b"=" in kv
            )
        except OSError:
            continue
        if env.get(b"DET_ALLOCATION_ID") == alloc.id.encode():
            yield int(entry.name), cmd, env


def allocation_pids(alloc: Allocation) -> list[int]:
    return [pid for pid, _, _ in _allocation_processes(alloc) if pid != os.getpid()]


def rank_pids(alloc: Allocation, rank: int) -> list[int]:
    """The train.py processes of one global rank inside an allocation's containers."""
    return [
        pid
        for pid, cmd, env in _allocation_processes(alloc)
        if any(part.endswith(b"train.py") for part in cmd)
        and env.get(b"RANK") == str(rank).encode()
        and b"determined.launch.wrap_rank" not in b" ".join(cmd)
    ]


@contextlib.contextmanager
def emulated_cluster(
    tmp: Path, env: dict[str, str] | None = None, network: Any = None, store: Any = None
) -> Iterator[Cluster]:
    """A stand-in master and its agents; with `network` (tests/support/det_netns.py) each container runs
    on its own host and the master listens on a host of its own; with `store` checkpoints go to
    that S3 or GCS bucket."""
    if network is None:
        master = Master()
        machines = None
    else:
        master = Master(host=network.master[1], netns=network.master[0])
        machines = network.machines
    try:
        yield Cluster(master, tmp / "shared_fs", tmp / "agent", env, machines, store)
    finally:
        master.close()


def main() -> int:
    """One shipped YAML on the emulated cluster, whole, from the repo's upload; prints the last
    validation as the master recorded it (JSON). What a test cannot afford: a full-length run.

        python3 -m tests.support.det_cluster local.yaml --threads 2
    """
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("yaml", help="an experiment YAML in the repo root, e.g. local.yaml")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS in the container")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds before giving up")
    args = parser.parse_args()
    if (why := supported()) is not None:
        parser.error(f"cannot emulate containers here: {why}")
    try:
        conf = experiment.load_yaml(ROOT / args.yaml)
    except (OSError, ConfigError) as err:
        parser.error(str(err))
    if (conf.get("resources") or {}).get("slots_per_trial", 1) != 1:
        parser.error(f"{args.yaml}: only 1-slot YAMLs (one container, this machine's CPU)")
    with tempfile.TemporaryDirectory(prefix="det-cluster-") as tmp:
        with emulated_cluster(Path(tmp), env={"OMP_NUM_THREADS": str(args.threads)}) as cluster:
            start = time.monotonic()
            record = cluster.run_trial(conf, experiment.local_hparams(conf), timeout=args.timeout)
            if record.exit_codes[-1] != 0 or cluster.master.errors:
                print(record.failures(), cluster.master.errors, file=sys.stderr)
                return 1
            val = cluster.master.validations()[-1]
            print(
                json.dumps(
                    {
                        "yaml": args.yaml,
                        "steps_completed": val["steps_completed"],
                        "seconds": round(time.monotonic() - start),
                        **val["metrics"],
                    }
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
