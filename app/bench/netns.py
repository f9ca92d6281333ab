"""An emulated link for two-box runs on one machine: a network namespace holding the peer's
address, joined to this namespace by a veth pair whose both ends are shaped with
`tc netem rate R delay D` (or, where the kernel has no netem, a `tbf` rate limit alone).
The pair takes the first 10.77.N.0/24 that no interface here holds, so a namespace that a
killed run left behind (still routing its subnet) does not swallow the new link's traffic.
Needs root and iproute2."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """namespace: where the peer runs (`ip netns exec NAMESPACE ...`). shaping: "netem"
    (rate and delay) or "tbf" (rate only). host_ip: this end's address. peer_ip: the
    namespace's address, where a worker started in it listens."""

    namespace: str
    shaping: str
    host_ip: str
    peer_ip: str


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def _must(*cmd: str) -> None:
    r = _run(*cmd)
    if r.returncode:
        raise OSError(f"{' '.join(cmd)}: {r.stderr.strip()}")


def free_subnet() -> int:
    """The first N in 0..254 for which no interface in this namespace holds a 10.77.N.x
    address. Raises OSError if all are taken."""
    held = _run("ip", "-o", "-4", "addr", "show").stdout
    for n in range(255):
        if f" 10.77.{n}." not in held:
            return n
    raise OSError("no free 10.77.N.0/24 subnet for an emulated link")


@contextlib.contextmanager
def emulated_link(rate: str = "1gbit", delay: str = "0.5ms") -> Iterator[Link]:
    """Yields the Link; everything is removed on exit. Raises OSError if a namespace cannot
    be made."""
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"tbx{tag}", f"vtb{tag}a", f"vtb{tag}b"
    n = free_subnet()
    host_ip, peer_ip = f"10.77.{n}.1", f"10.77.{n}.2"
    _must("ip", "netns", "add", ns)
    inside = ("ip", "netns", "exec", ns)
    try:
        _must("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        _must("ip", "link", "set", there, "netns", ns)
        _must("ip", "addr", "add", f"{host_ip}/24", "dev", here)
        _must("ip", "link", "set", here, "up")
        _must(*inside, "ip", "addr", "add", f"{peer_ip}/24", "dev", there)
        _must(*inside, "ip", "link", "set", there, "up")
        _must(*inside, "ip", "link", "set", "lo", "up")
        shaping = "netem"
        for prefix, dev in (((), here), (inside, there)):
            if _run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "netem", "rate", rate,
                    "delay", delay).returncode:
                shaping = "tbf"
                _must(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                      "burst", "128kb", "latency", "50ms")
        yield Link(ns, shaping, host_ip, peer_ip)
    finally:
        _run("ip", "netns", "del", ns)
        _run("ip", "link", "del", here)
