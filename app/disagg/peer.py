"""Two-box settings shared by both ends: addresses, the shared secret, deadlines.

The secret is read from a file (never a flag: command lines are visible to every user of
the machine). Binding anything but loopback requires one; a missing or short secret is an
error, not a warning (shared/notes/two-box.md §6: exo binds 0.0.0.0 with no authentication).
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path

from app.disagg.policy import PolicyConfig

MIN_SECRET_BYTES = 16
DEFAULT_PORT = 7070
# the worker's limits (`tandem prefill-worker` flags; docs/two-box.md, "Deadlines")
DEFAULT_MAX_QUEUE = 4  # prompts admitted beyond its slots
DEFAULT_MAX_HANDSHAKES = 8  # connections in the handshake at once
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0  # connect to PREFILL received
DEFAULT_WRITE_TIMEOUT_S = 10.0  # the most a peer may take to accept one frame
SECRET_HINT = ("create one with: (umask 077; python -c \"import secrets; "
               "print(secrets.token_hex(32))\" > tandem-peer.secret), and copy the file to "
               "both machines")


class PeerConfigError(ValueError):
    """A two-box setting that cannot work (bad address, missing or short secret)."""


def read_secret(path: str | Path | None) -> bytes:
    """The shared secret in `path` (surrounding whitespace stripped), or b"" for None.
    Raises PeerConfigError if the file cannot be read, is open to group or others (as ssh
    refuses such a key: `> file` in a shell gives 0644, readable by every user) or holds
    fewer than MIN_SECRET_BYTES bytes."""
    if path is None:
        return b""
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            secret = fh.read().strip()
    except OSError as e:
        raise PeerConfigError(f"cannot read the secret file {path}: {e.strerror}") from None
    if os.name == "posix" and mode & 0o077:
        raise PeerConfigError(f"the secret file {path} is open to other users (mode "
                              f"{stat.S_IMODE(mode):04o}); run: chmod 600 "
                              f"{shlex.quote(str(path))}")
    if len(secret) < MIN_SECRET_BYTES:
        raise PeerConfigError(f"the secret in {path} is {len(secret)} bytes; at least "
                              f"{MIN_SECRET_BYTES} are needed ({SECRET_HINT})")
    return secret


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_this_host(host: str) -> bool:
    """Whether `host` is this machine: loopback, or an address (or a name resolving to one)
    assigned to one of its interfaces. Binding a UDP socket succeeds only for those; nothing
    is sent. A name that does not resolve is not this host."""
    if is_loopback(host):
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, addr in infos:
        try:
            if ipaddress.ip_address(addr[0]).is_loopback:
                return True
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((addr[0], 0, *addr[2:]))
            return True
        except (OSError, ValueError):
            continue
    return False


def check_bind(host: str, secret: bytes) -> None:
    """Raises PeerConfigError if `host` is not loopback and there is no secret."""
    if not is_loopback(host) and not secret:
        raise PeerConfigError(f"binding {host} exposes this machine's model to the network: "
                              f"pass --secret-file ({SECRET_HINT})")


def parse_peer(text: str) -> tuple[str, int]:
    """"HOST:PORT", "[v6]:PORT", or HOST / [v6] alone (port DEFAULT_PORT) -> (host, port).
    Raises PeerConfigError."""
    if text.startswith("[") and text.endswith("]") or (text and ":" not in text):
        host, port = text.strip("[]"), str(DEFAULT_PORT)
    else:
        host, sep, port = text.rpartition(":")
        host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PeerConfigError(f"--prefill-peer must be HOST or HOST:PORT, not {text!r}")
    return host, int(port)


@dataclass(slots=True)
class PeerConfig:
    """The decode box's view of its prefill worker.

    host, port: where the worker listens. secret: shared secret (b"": loopback only).
    connect_timeout_s: TCP connect + handshake. first_frame_timeout_s: from sending the
    prompt to the first KV frame (the worker computes a chunk first), plus twice the time
    the worker's measured prefill speed predicts for that chunk. frame_timeout_s: most
    seconds between two frames, plus twice the longest the worker has taken for a chunk
    of this prompt so far. policy: when to go remote. threads: this process's CPU threads
    (`--threads`; None: all the CPUs it may run on, llama.cpp's default), compared with the
    worker's when both run on this machine (`thread_warning`).
    """

    host: str
    port: int = DEFAULT_PORT
    secret: bytes = field(default=b"", repr=False)
    connect_timeout_s: float = 1.0
    first_frame_timeout_s: float = 10.0
    frame_timeout_s: float = 2.0
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    threads: int | None = None

    def __post_init__(self) -> None:
        if not is_loopback(self.host) and not self.secret:
            raise PeerConfigError(f"a prefill peer at {self.host} needs --secret-file: "
                                  f"without it anyone on the network could feed this "
                                  f"machine KV ({SECRET_HINT})")
        for name in ("connect_timeout_s", "first_frame_timeout_s", "frame_timeout_s"):
            if not getattr(self, name) > 0:
                raise PeerConfigError(f"{name} must be > 0")


def cpu_threads(threads: int | None) -> int:
    """The threads a llama.cpp process runs with `--threads threads` (None: the CPUs this
    process may run on)."""
    if threads:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def thread_warning(host: str, port: int, here: int, peer: int, cores: int) -> str | None:
    """One line with the fix when a prefill worker on this machine and this process ask for
    more threads together than the machine has cores (llama.cpp's threads spin-wait, so two
    processes over-subscribing the cores slow each other down many times; measured 7x on 2
    cores for a 1,494-token prompt), else None. `here`, `peer`: each side's threads."""
    if here + peer <= cores:
        return None
    mine = max(1, cores // 2)
    shown = f"[{host}]" if ":" in host else host
    return (f"the prefill worker at {shown}:{port} runs on this machine: its {peer} threads "
            f"and these {here} exceed the {cores} cores, and the two processes will slow "
            f"each other down; restart with --threads {mine} here and `tandem prefill-worker "
            f"--threads {max(1, cores - mine)}`")
