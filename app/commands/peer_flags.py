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
        help=f"a `tandem prefill-worker` (HOST, or HOST:PORT; port {DEFAULT_PORT} if not "
        "given) that prefills long "
        "prompts and streams their KV here; any failure falls back to prefilling here "
        "(default: none)")
    add_secret_arg(g)
    g.add_argument(
        "--prefill-policy", choices=("auto", "always"), default=None,
        help="auto: remote only when predicted faster from measured prefill speeds and the "
        f"link; always: every prompt (default: {_POLICY.mode})")
    g.add_argument(
        "--prefill-min-tokens", type=positive_int, metavar="N", default=None,
        help=f"with auto, prompts with fewer uncached tokens stay here (default: "
        f"{_POLICY.min_tokens})")


def peer_from(ns: argparse.Namespace) -> PeerConfig | None:
    """The PeerConfig the flags ask for, or None without `--prefill-peer`. Raises
    PeerConfigError (a ValueError) for a bad address or secret."""
    if getattr(ns, "prefill_peer", None) is None:
        if hasattr(ns, "prefill_peer"):
            for dest in ("secret_file", "prefill_policy", "prefill_min_tokens"):
                if getattr(ns, dest, None) is not None:
                    flag = "--" + dest.replace("_", "-")
                    raise ValueError(f"{flag} is for --prefill-peer, which is not given")
        return None
    host, port = parse_peer(ns.prefill_peer)
    policy = PolicyConfig(mode=ns.prefill_policy or _POLICY.mode,
                          min_tokens=ns.prefill_min_tokens or _POLICY.min_tokens)
    return PeerConfig(host, port, read_secret(ns.secret_file), policy=policy,
                      threads=getattr(ns, "threads", None))
