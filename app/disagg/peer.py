"""Two-box settings shared by both ends: addresses, the shared secret, deadlines.

The secret is read from a file (never a flag: command lines are visible to every user of
the machine). Binding anything but loopback requires one; a missing or short secret is an
error, not a warning (shared/notes/two-box.md §6: exo binds 0.0.0.0 with no authentication).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from app.disagg.policy import PolicyConfig

MIN_SECRET_BYTES = 16
DEFAULT_PORT = 7070
SECRET_HINT = ("create one with: python -c \"import secrets; print(secrets.token_hex(32))\" "
               "> tandem-peer.secret, and copy the file to both machines")


class PeerConfigError(ValueError):
    """A two-box setting that cannot work (bad address, missing or short secret)."""


def read_secret(path: str | Path | None) -> bytes:
    """The shared secret in `path` (surrounding whitespace stripped), or b"" for None.
    Raises PeerConfigError if the file cannot be read or holds fewer than
    MIN_SECRET_BYTES bytes."""
    if path is None:
        return b""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as e:
        raise PeerConfigError(f"cannot read the secret file {path}: {e.strerror}") from None
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
    of this prompt so far. policy: when to go remote.
    """

    host: str
    port: int = DEFAULT_PORT
    secret: bytes = field(default=b"", repr=False)
    connect_timeout_s: float = 1.0
    first_frame_timeout_s: float = 10.0
    frame_timeout_s: float = 2.0
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self) -> None:
        if not is_loopback(self.host) and not self.secret:
            raise PeerConfigError(f"a prefill peer at {self.host} needs --secret-file: "
                                  f"without it anyone on the network could feed this "
                                  f"machine KV ({SECRET_HINT})")
        for name in ("connect_timeout_s", "first_frame_timeout_s", "frame_timeout_s"):
            if not getattr(self, name) > 0:
                raise PeerConfigError(f"{name} must be > 0")
