"""One phrase for where a prompt was prefilled (two-box mode), shared by `tandem run`'s
stats line and the TUI status bar. Input: `RequestMetrics.remote_prefill`."""

from __future__ import annotations


def route_summary(route: dict | None) -> str | None:
    """e.g. "prefilled remotely (faster: 2047 tokens, 47.2 MB of KV)", "prefilled here
    (short_prompt)", "remote prefill failed (frame_timeout) after 512 tokens"; None when no
    prefill peer is configured. Reasons are the policy's (`app.disagg.policy`)."""
    if route is None:
        return None
    if not route["remote"]:
        return f"prefilled here ({route['reason']})"
    imported = route.get("imported_tokens", 0)
    if route.get("ok"):
        return (f"prefilled remotely ({route['reason']}: {imported} tokens, "
                f"{route.get('bytes', 0) / 1e6:.1f} MB of KV)")
    if "failure" in route:
        return f"remote prefill failed ({route['failure']}) after {imported} tokens"
    return "prefilling remotely"
