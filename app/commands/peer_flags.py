"""The two-box flags: `--prefill-peer` and friends on `run`, `chat` and `serve`, and
`--secret-file` shared with `prefill-worker`. Parsed into `app.disagg.peer.PeerConfig`."""

from __future__ import annotations

import argparse

from app.commands.engine_flags import positive_int
from app.disagg.peer import DEFAULT_PORT, MIN_SECRET_BYTES, PeerConfig, parse_peer, read_secret
from app.disagg.policy import PolicyConfig

_POLICY = PolicyConfig()


def add_secret_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--secret-file", metavar="FILE", default=None,
        help=f"file holding the secret both boxes share (at least {MIN_SECRET_BYTES} bytes; "
        "required unless both ends are on loopback; default: none)")


def add_peer_args(parser: argparse.ArgumentParser) -> None:
    """`--prefill-peer`, `--secret-file`, `--prefill-policy`, `--prefill-min-tokens`."""
    g = parser.add_argument_group("two-box mode (another machine prefills long prompts)")
    g.add_argument(
        "--prefill-peer", metavar="HOST:PORT", default=None,
        help=f"a `tandem prefill-worker` (default port {DEFAULT_PORT}) that prefills long "
        "prompts and streams their KV here; any failure falls back to prefilling here "
        "(default: none)")
    add_secret_arg(g)
    g.add_argument(
        "--prefill-policy", choices=("auto", "always"), default=_POLICY.mode,
        help="auto: remote only when predicted faster from measured prefill speeds and the "
        "link; always: every prompt (default: %(default)s)")
    g.add_argument(
        "--prefill-min-tokens", type=positive_int, metavar="N", default=_POLICY.min_tokens,
        help="with auto, prompts with fewer uncached tokens stay here (default: %(default)s)")


def peer_from(ns: argparse.Namespace) -> PeerConfig | None:
    """The PeerConfig the flags ask for, or None without `--prefill-peer`. Raises
    PeerConfigError (a ValueError) for a bad address or secret."""
    if getattr(ns, "prefill_peer", None) is None:
        if getattr(ns, "secret_file", None) is not None and hasattr(ns, "prefill_peer"):
            raise ValueError("--secret-file is for --prefill-peer, which is not given")
        return None
    host, port = parse_peer(ns.prefill_peer)
    policy = PolicyConfig(mode=ns.prefill_policy, min_tokens=ns.prefill_min_tokens)
    return PeerConfig(host, port, read_secret(ns.secret_file), policy=policy)
