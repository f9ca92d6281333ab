"""An emulated link for two-box runs on one machine: a network namespace holding PEER_IP,
joined to this namespace's HOST_IP by a veth pair whose both ends are shaped with
`tc netem rate R delay D` (or, where the kernel has no netem, a `tbf` rate limit alone).
Needs root and iproute2."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator

HOST_IP, PEER_IP = "10.77.0.1", "10.77.0.2"


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def _must(*cmd: str) -> None:
    r = _run(*cmd)
    if r.returncode:
        raise OSError(f"{' '.join(cmd)}: {r.stderr.strip()}")


@contextlib.contextmanager
def emulated_link(rate: str = "1gbit", delay: str = "0.5ms") -> Iterator[tuple[str, str]]:
    """Yields (namespace, shaping), shaping "netem" (rate and delay) or "tbf" (rate only).
    Everything is removed on exit. Raises OSError if a namespace cannot be made."""
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"tbx{tag}", f"vtb{tag}a", f"vtb{tag}b"
    _must("ip", "netns", "add", ns)
    inside = ("ip", "netns", "exec", ns)
    try:
        _must("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        _must("ip", "link", "set", there, "netns", ns)
        _must("ip", "addr", "add", f"{HOST_IP}/24", "dev", here)
        _must("ip", "link", "set", here, "up")
        _must(*inside, "ip", "addr", "add", f"{PEER_IP}/24", "dev", there)
        _must(*inside, "ip", "link", "set", there, "up")
        _must(*inside, "ip", "link", "set", "lo", "up")
        shaping = "netem"
        for prefix, dev in (((), here), (inside, there)):
            if _run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "netem", "rate", rate,
                    "delay", delay).returncode:
                shaping = "tbf"
                _must(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                      "burst", "128kb", "latency", "50ms")
        yield ns, shaping
    finally:
        _run("ip", "netns", "del", ns)
        _run("ip", "link", "del", here)
