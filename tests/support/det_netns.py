"""Separate hosts on one machine, for tests and benchmarks: network namespaces joined by a switch.

Not product code. `machines(n, link=...)` makes n "machines" (network namespaces, each with an
`eth0` and its own address) and one for the stand-in master, all on a bridge inside a switch
namespace. Every machine's `eth0` is shaped with tc (tbf for the rate, netem for the delay), so
traffic between machines crosses a link of the chosen bandwidth and latency. Only namespaces
and addresses made here are used; everything is deleted on exit, Ctrl-C and failure included
(processes left in a namespace are killed first).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
SUBNET = "10.213.{}.{}"  # inside our own namespaces only

# bits/s, the tbf burst that rate needs at HZ=250-1000, and the netem delay
LINKS: dict[str, tuple[int, str, str]] = {
    "10gbit": (10_000_000_000, "4mb", "0.05ms"),
    "1gbit": (1_000_000_000, "512kb", "0.1ms"),
    "100mbit": (100_000_000, "64kb", "0.2ms"),
}


def supported() -> str | None:
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2)"
    name = f"sqprobe-{uuid.uuid4().hex[:6]}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def call_in(netns: str, fn: Callable[[], T]) -> T:
    """fn() on a thread that has entered `netns` (sockets it opens stay in that namespace)."""
    result: dict[str, Any] = {}

    def target() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns({netns})")
            result["value"] = fn()
        except BaseException as err:  # handed to the caller
            result["error"] = err
        finally:
            os.close(fd)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


@dataclass
class Network:
    machines: list[tuple[str, str]]  # (namespace, address) per machine
    master: tuple[str, str]
    link: str

    delay: str | None = None  # the one-way delay in force; None where netem is missing

    def shape(self, link: str, delay: str | None = None) -> None:
        """Set every machine's link to `link` (LINKS): tbf for the rate, under netem for the
        one-way delay where the kernel has sch_netem (without it the link is rate-limited only,
        and `self.delay` stays None)."""
        rate, burst, default_delay = LINKS[link]
        tbf = ["tbf", "rate", f"{rate}bit", "burst", burst, "latency", "50ms"]
        self.delay = None
        for ns, _ in self.machines:
            tc = ["ip", "netns", "exec", ns, "tc", "qdisc"]
            subprocess.run([*tc, "del", "dev", "eth0", "root"], capture_output=True)
            netem = subprocess.run(
                [*tc, "add", "dev", "eth0", "root", "handle", "1:", "netem", "delay", delay or default_delay],
                capture_output=True,
            )
            if netem.returncode == 0:
                _ip("tc", "qdisc", "add", "dev", "eth0", "parent", "1:", "handle", "2:", *tbf, ns=ns)
                self.delay = delay or default_delay
            else:
                _ip("tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", *tbf, ns=ns)
        self.link = link

    def cut(self, machine: int) -> None:
        """Pull the cable of one machine."""
        _ip("ip", "link", "set", "eth0", "down", ns=self.machines[machine][0])


@contextlib.contextmanager
def machines(count: int, link: str = "10gbit", delay: str | None = None) -> Iterator[Network]:
    tag = uuid.uuid4().hex[:6]
    subnet = int(tag[:2], 16) % 200 + 10  # a /24 of our own per network, so parallel runs differ
    switch = f"sq-sw-{tag}"
    names = [f"sq-m{i}-{tag}" for i in range(count)] + [f"sq-ms-{tag}"]
    made: list[str] = []
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # run the finally below

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    try:
        for ns in [switch, *names]:
            _ip("ip", "netns", "add", ns)
            made.append(ns)
        _ip("ip", "link", "add", "br0", "type", "bridge", ns=switch)
        _ip("ip", "link", "set", "br0", "up", ns=switch)
        hosts = []
        for i, ns in enumerate(names):
            addr = SUBNET.format(subnet, 100 if ns.startswith("sq-ms") else i + 1)
            port = f"p{i}-{tag}"
            _ip(
                "ip",
                "link",
                "add",
                port,
                "netns",
                switch,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _ip("ip", "link", "set", port, "master", "br0", ns=switch)
            _ip("ip", "link", "set", port, "up", ns=switch)
            _ip("ip", "addr", "add", f"{addr}/24", "dev", "eth0", ns=ns)
            _ip("ip", "link", "set", "eth0", "up", ns=ns)
            _ip("ip", "link", "set", "lo", "up", ns=ns)
            hosts.append((ns, addr))
        net = Network(machines=hosts[:-1], master=hosts[-1], link=link)
        net.shape(link, delay)
        yield net
    finally:
        for ns in reversed(made):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
