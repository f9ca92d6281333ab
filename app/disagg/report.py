"""One phrase for where a prompt was prefilled (two-box mode), shared by `tandem run`'s
stats line and the TUI status bar. Input: `RequestMetrics.remote_prefill`, the route record
the scheduler writes from the policy's decision (`policy.PrefillPolicy.decide_detail`: a
reason code and the numbers behind it) and the client's transfer stats.

The codes stay codes in /metrics; here they become words a user can act on."""

from __future__ import annotations

# fallback reasons (`client._reason`, the worker's ERROR codes) in words
_FAILURES = {
    "refused": "worker not reachable",
    "connect_timeout": "no answer from the worker",
    "first_frame_timeout": "no KV from the worker in time",
    "frame_timeout": "the worker stalled",
    "peer_closed": "the worker hung up",
    "busy": "worker busy with other prompts",
    "worker_queue": "the worker's queue was longer than prefilling here",
    "auth": "the two secrets differ",
    "fingerprint": "the two boxes differ in model, KV cache type or exact mode",
    "version": "the two tandem versions differ",
    "import": "its KV could not be loaded here",
    "incomplete": "its KV was incomplete",
}


def _seconds(s: float) -> str:
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


def route_reason(route: dict) -> str:
    """The policy's reason code of `route` in words, with its numbers when it has them,
    e.g. "measured: this box prefills faster, 1.20 s here vs 2.31 s remote". An unknown code
    is returned as it is."""
    reason = route["reason"]
    if reason == "always":
        return "--prefill-policy always"
    if reason == "probe":
        return "first prompt: measuring the link"
    if reason == "probe_local":
        return "measuring this box"
    if reason in ("faster", "local_faster") and "local_s" in route:
        here, remote = _seconds(route["local_s"]), _seconds(route["remote_s"])
        if reason == "faster":
            return f"measured: the worker prefills faster, {remote} vs {here} here"
        return f"measured: this box prefills faster, {here} here vs {remote} remote"
    if reason == "short_prompt" and "min_tokens" in route:
        return f"short prompt: {route['uncached']} new tokens, under {route['min_tokens']}"
    if reason == "peer_backoff" and "retry_s" in route:
        return f"the worker failed just now, retrying in {route['retry_s']:.0f} s"
    if reason == "kv_full":
        return "no room here for its KV yet"
    return reason


def route_summary(route: dict | None) -> str | None:
    """e.g. "prefilled remotely (first prompt: measuring the link: 2047 tokens, 47.2 MB of
    KV)", "prefilled here (short prompt: 120 new tokens, under 256)", "remote prefill failed
    (the worker stalled) after 512 tokens"; None when no prefill peer is configured."""
    if route is None:
        return None
    if not route["remote"]:
        return f"prefilled here ({route_reason(route)})"
    imported = route.get("imported_tokens", 0)
    if route.get("ok"):
        return (f"prefilled remotely ({route_reason(route)}: {imported} tokens, "
                f"{route.get('bytes', 0) / 1e6:.1f} MB of KV)")
    if "failure" in route:
        failure = _FAILURES.get(route["failure"], route["failure"])
        return f"remote prefill failed ({failure}) after {imported} tokens"
    return "prefilling remotely"


def startup_line(host: str, port: int, policy, max_tokens: int) -> str:
    """What the decode box will do with its prefill worker, from what `policy` (a
    `policy.PrefillPolicy`, estimates loaded) has measured so far, for `serve`'s start-up
    output, e.g. "two-box: prompts of 1,536+ new tokens go to the prefill worker at
    10.0.0.2:7070, shorter ones stay here (measured: this box 850 tok/s, the worker 2,400
    tok/s, link 0.12 GB/s); any failure prefills here". `max_tokens`: the longest prompt."""
    shown = f"[{host}]" if ":" in host else host
    worker = f"the prefill worker at {shown}:{port}"
    tail = "; any failure prefills here"
    cfg = policy.config
    if cfg.mode == "always":
        return f"two-box: every prompt goes to {worker} (--prefill-policy always){tail}"
    est = policy.snapshot()
    here, there, link = est["local_tok_s"], est["remote_tok_s"], est["link_gbps"]
    if there is None:
        return (f"two-box: {worker}; the first prompt of {cfg.min_tokens}+ new tokens goes "
                f"there to measure the link, the next stays here to measure this box, then "
                f"each goes where it is predicted faster{tail}")
    if here is None:
        return (f"two-box: {worker} (measured {there:,.0f} tok/s); the next prompt of "
                f"{cfg.min_tokens}+ new tokens stays here to measure this box, then each "
                f"goes where it is predicted faster{tail}")
    measured = (f"measured: this box {here:,.0f} tok/s, the worker {there:,.0f} tok/s"
                + (f", link {link:.3g} GB/s" if link else ""))
    first = policy.remote_from(max_tokens)
    if first is None:
        return (f"two-box: prompts stay here: this box prefills faster than {worker} up to "
                f"{max_tokens:,} tokens ({measured}){tail}")
    shorter = ("shorter ones stay here" if first <= cfg.min_tokens
               else "shorter ones are faster here")
    return (f"two-box: prompts of {first:,}+ new tokens go to {worker}, {shorter} "
            f"({measured}){tail}")
