"""Running without a master: joining torchrun's process group (and handing Determined the
DistributedContext it would otherwise build), free ports, seeding.
"""

from __future__ import annotations

import datetime
import os
import random
from typing import Any

from extractive_qa.errors import ConfigError

# What torchrun sets beside WORLD_SIZE in every process it starts.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "MASTER_ADDR")  # fmt: skip


def local_world_size() -> int:
    """The process count of a local run: WORLD_SIZE as torchrun sets it, 1 without torchrun. A
    WORLD_SIZE that is not a positive count, or one set without torchrun's other variables (a
    shell that exported it), is a ConfigError rather than a ValueError deep in the launch."""
    raw = os.environ.get("WORLD_SIZE")
    if raw is None:
        return 1
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size < 1:
        raise ConfigError(f"WORLD_SIZE={raw!r}: not a process count; unset it, or run under torchrun.")
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if size > 1 and missing:
        raise ConfigError(
            f"WORLD_SIZE={raw} is set but {', '.join(missing)} are not: this process was not started "
            "by torchrun. Unset WORLD_SIZE for one process, or start the run with torchrun."
        )
    return size


def join_process_group(on_cluster: bool, timeout_s: float | None) -> Any:
    """Who initialises the torch process group, decided in one place.

    On a cluster det.pytorch.init() does it (_trainer.py:282-296: it ignores `distributed=`), so
    joining here would initialise the default group twice. Locally, torchrun sets WORLD_SIZE and
    nothing else joins: we do (gloo on CPU) and hand init() the DistributedContext. Either way
    collectives give up after `timeout_s` (run_plan.collective_timeout) instead of torch's 30 min.
    """
    if on_cluster or local_world_size() <= 1:
        return None
    import torch
    import torch.distributed as dist
    from determined import core

    os.environ.setdefault("USE_TORCH_DISTRIBUTED", "1")  # Determined's switch for torch DDP
    timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend=backend, **timeout)
    # Determined's DistributedContext talks over two fixed TCP ports by default (12360 and
    # 12360 + MAX_SLOTS_PER_AGENT, determined/constants.py:13-18): on a cluster each container
    # has its own network, but two local runs on one machine would cross-talk ("got
    # non-_HelloMessage") or fail to bind. Rank 0 picks two free ports and shares them.
    ports: list[Any] = [free_tcp_ports(2) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(ports, src=0)
    env = os.environ
    return core.DistributedContext(
        rank=dist.get_rank(),
        size=dist.get_world_size(),
        local_rank=int(env["LOCAL_RANK"]),
        local_size=int(env["LOCAL_WORLD_SIZE"]),
        cross_rank=int(env["GROUP_RANK"]),
        cross_size=int(env["GROUP_WORLD_SIZE"]),
        chief_ip=chief_address(int(env["GROUP_WORLD_SIZE"])),
        pub_port=ports[0][0],
        pull_port=ports[0][1],
    )


def chief_address(machines: int) -> str | None:
    """Where the other machines reach the chief's Determined messaging (its DistributedContext
    needs it as soon as there is more than one machine, and raises a bare AssertionError without).
    DET_CHIEF_IP when set; else torchrun's MASTER_ADDR -- the rendezvous host, i.e. the first
    machine's --local_addr or host name -- as this machine resolves it. The chief binds to that
    address, so it must not be a loopback one."""
    import socket

    if machines <= 1:
        return None  # one machine: Determined uses 127.0.0.1
    if os.environ.get("DET_CHIEF_IP"):
        return os.environ["DET_CHIEF_IP"]
    host = os.environ.get("MASTER_ADDR", "")
    try:
        address = socket.gethostbyname(host) if host else ""
    except OSError:
        address = ""
    if not address or address.startswith("127."):
        raise ConfigError(
            f"torchrun over {machines} machines: this machine cannot tell where the chief is "
            f"(MASTER_ADDR {host or 'unset'} resolves to {address or 'nothing'}). Start torchrun "
            "with --local_addr ADDRESS on every machine (the first machine's address is the "
            "chief's), or set DET_CHIEF_IP to the first machine's address."
        )
    return address


def free_tcp_ports(n: int) -> list[int]:
    """n distinct ports that nothing listens on now (the OS picks them)."""
    import socket

    probes = [socket.socket() for _ in range(n)]
    try:
        for probe in probes:
            probe.bind(("", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def seed_everything(seed: int) -> None:
    # On a cluster Determined seeds from the trial seed; locally we do it from experiment_seed.
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
