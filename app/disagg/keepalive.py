"""TCP keepalive for both ends of a two-box connection: a peer whose machine died or whose
link was cut (no FIN, no RST) is noticed by the kernel within about a minute, so neither
side keeps a socket, a queue place or a slot for it (docs/two-box.md, "Deadlines").

The kernel's defaults (Linux: first probe after 2 h of silence, RFC 1122 §4.2.3.6) suit
WANs; two boxes on one LAN can afford a probe every few seconds. With IDLE_S 15, INTERVAL_S
5 and COUNT 3, a silent dead peer is dropped after 15 + 3 * 5 = 30 s.
"""

from __future__ import annotations

import socket

IDLE_S = 15  # seconds of silence before the first probe
INTERVAL_S = 5  # seconds between unanswered probes
COUNT = 3  # unanswered probes before the connection is dropped


def set_keepalive(sock, idle_s: int = IDLE_S, interval_s: int = INTERVAL_S,
                  count: int = COUNT) -> None:
    """Turn on keepalive for `sock` (a socket or asyncio's TransportSocket), with the
    timings where the platform has the options (Linux: TCP_KEEPIDLE/INTVL/CNT; macOS has
    TCP_KEEPALIVE for the idle time); elsewhere the system's timings apply. Never raises:
    a socket that refuses an option keeps the rest."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    if idle is not None:
        options.append((socket.IPPROTO_TCP, idle, idle_s))
    for name, value in (("TCP_KEEPINTVL", interval_s), ("TCP_KEEPCNT", count)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            pass
