"""When to prefill on the peer: a cost model fed by measurements, and a circuit breaker.

Remote pays when `remote_s(n_total, n_uncached) < local_s(n_uncached)`, with

    local_s  = n_uncached / local_rate
    wire     = bytes_per_token / link_bps                        (seconds per token)
    remote_s = setup_s + max(n_total / remote_rate, n_uncached * wire)
               + tail * (min(wire, 1 / remote_rate) + import_s_per_token)

The worker's compute and the link form a two-stage pipeline over chunks of `tail` tokens:
its duration is the slower stage over all chunks plus one chunk of the faster stage (the
last chunk's transfer when compute-bound, the first chunk's compute when link-bound), plus
importing the last chunk, which cannot hide (shared/notes/two-box.md §1, "when does going
remote pay"). The worker recomputes the whole prompt, cached part included, unless its
own prefix cache has it, hence `n_total`. Every rate is an exponentially weighted mean of
measurements: local prefills (the engine reports them), remote ones (the client's stats),
setup = connect + handshake. Until both prefill rates are known a long enough prompt goes
remote to measure the peer and the link ("probe"), then one stays local to measure this box
("probe_local"). The reasons are codes (they label /metrics); `app.disagg.report` words
them for people. The estimates outlive the process (`app.disagg.client` keeps them in the
model store per peer and model), so `tandem run` does not probe every time.

A worker shared by several decode boxes answers each PREFILL with the prompt tokens it
computes first (its QUEUE frame); `decide_queue` then keeps the prompt remote only while
that wait, `tokens_ahead / remote_rate`, plus remote_s still beats local_s.

Circuit breaker: after a failure the peer is not tried for `backoff_s`, doubling with each
consecutive failure up to `max_backoff_s`; a success resets it (the notes' 5 s -> 5 min).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

EWMA_WEIGHT = 0.3  # weight of the newest measurement
MARGIN = 1.1  # remote must be predicted at least 10% faster: its estimate is the noisier
MIN_OBSERVED_TOKENS = 128  # shorter local prefills measure step overhead, not prefill speed


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - EWMA_WEIGHT) * old + EWMA_WEIGHT * new


@dataclass(slots=True)
class PolicyConfig:
    """mode: "auto" (the cost model) or "always" (every prompt with an uncached part, unless
    the breaker is open). min_tokens: in "auto", prompts with fewer uncached tokens stay
    local. chunk_tokens: tokens per chunk the peer streams (the tail that cannot hide).
    backoff_s / max_backoff_s: circuit breaker intervals, seconds."""

    mode: str = "auto"
    min_tokens: int = 256
    chunk_tokens: int = 512
    backoff_s: float = 5.0
    max_backoff_s: float = 300.0

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "always"):
            raise ValueError(f"prefill policy must be auto or always, not {self.mode!r}")
        if self.min_tokens < 1 or self.chunk_tokens < 1:
            raise ValueError("min_tokens and chunk_tokens must be at least 1")
        if not 0 <= self.backoff_s <= self.max_backoff_s:
            raise ValueError("backoff_s must be in 0..max_backoff_s")


class PrefillPolicy:
    """Thread-safe: `decide` runs on the step thread, the observations on the client's.

    Args:
        config: mode, thresholds, breaker.
        bytes_per_token: KV bytes one token puts on the wire (all layers, K and V).
        clock: seconds, monotonic (tests pass a fake).
    """

    def __init__(self, config: PolicyConfig, bytes_per_token: int, clock=time.monotonic):
        self.config = config
        self.bytes_per_token = bytes_per_token
        self.clock = clock
        self._lock = threading.Lock()
        self.local_rate: float | None = None  # tokens/s
        self.remote_rate: float | None = None  # tokens/s, the peer's prefill
        self.setup_s: float | None = None  # connect + handshake
        self.link_bps: float | None = None  # bytes/s
        self.import_s_per_token: float | None = None
        self.failures = 0
        self.open_until = 0.0

    # -- the decision ----------------------------------------------------------------------

    def predict(self, n_total: int, n_uncached: int) -> tuple[float, float] | None:
        """(local seconds, remote seconds), or None while a prefill rate is unknown."""
        if self.local_rate is None or self.remote_rate is None:
            return None
        tail = min(n_uncached, self.config.chunk_tokens)
        wire = self.bytes_per_token / self.link_bps if self.link_bps else 0.0  # s/token
        stream = max(n_total / self.remote_rate, n_uncached * wire)
        faster_stage = min(wire, 1 / self.remote_rate) if wire else 0.0
        remote = (self.setup_s or 0.0) + stream + tail * (faster_stage
                                                          + (self.import_s_per_token or 0.0))
        return n_uncached / self.local_rate, remote

    def decide(self, n_total: int, n_cached: int) -> tuple[bool, str]:
        """(go remote?, reason) for a prompt needing KV for `n_total` positions of which
        `n_cached` are cached here. Reasons: "always", "faster", "probe" (remote);
        "short_prompt", "local_faster", "probe_local", "peer_backoff" (local)."""
        return self.decide_detail(n_total, n_cached)[:2]

    def decide_detail(self, n_total: int, n_cached: int) -> tuple[bool, str, dict]:
        """`decide` plus the numbers behind it, for the route's words (`report`):
        "uncached" tokens always; "min_tokens" (short_prompt); "local_s" and "remote_s",
        the predicted seconds (faster, local_faster); "retry_s" (peer_backoff)."""
        n_uncached = n_total - n_cached
        numbers: dict = {"uncached": n_uncached}
        with self._lock:
            if (wait := self.open_until - self.clock()) > 0:
                return False, "peer_backoff", {**numbers, "retry_s": wait}
            if self.config.mode == "always":
                return True, "always", numbers
            if n_uncached < self.config.min_tokens:
                return False, "short_prompt", {**numbers, "min_tokens": self.config.min_tokens}
            if self.remote_rate is None:
                return True, "probe", numbers
            if self.local_rate is None:
                return False, "probe_local", numbers
            local, remote = self.predict(n_total, n_uncached)
            numbers.update(local_s=local, remote_s=remote)
            go = remote * MARGIN < local
            return go, "faster" if go else "local_faster", numbers

    def decide_queue(self, n_total: int, n_uncached: int, tokens_ahead: int
                     ) -> tuple[bool, dict]:
        """(stay remote?, numbers) once the worker has said, in its QUEUE frame, how many
        prompt tokens of other prompts it computes before this one: in "auto" with both
        prefill rates known, remote stays only while `wait_s + remote_s` (wait_s =
        tokens_ahead / remote_rate) is predicted MARGIN faster than `local_s`; otherwise
        (mode "always", a rate still unknown, nothing ahead) it stays. numbers: "wait_s"
        (when a rate is known), "local_s" and "remote_s" (when compared)."""
        with self._lock:
            if self.remote_rate is None:
                return True, {}
            wait = tokens_ahead / self.remote_rate
            numbers: dict = {"wait_s": wait}
            if self.config.mode == "always" or not tokens_ahead or self.local_rate is None:
                return True, numbers
            local, remote = self.predict(n_total, n_uncached)
            numbers.update(local_s=local, remote_s=wait + remote)
            return (wait + remote) * MARGIN < local, numbers

    def remote_from(self, max_tokens: int) -> int | None:
        """In "auto", the fewest uncached tokens (no prefix cached, at least min_tokens) from
        which the current estimates send a prompt remote, or None when no prompt up to
        `max_tokens` goes (or a prefill rate is still unknown). Beyond one chunk both
        predictions grow linearly, so past the first length that goes, longer ones go too:
        doubling finds it, bisection pins it."""
        def goes(n: int) -> bool:
            local, remote = self.predict(n, n)
            return remote * MARGIN < local

        with self._lock:
            if self.local_rate is None or self.remote_rate is None:
                return None
            lo = self.config.min_tokens
            if lo > max_tokens:
                return None
            if goes(lo):
                return lo
            hi = lo
            while not goes(hi):
                if hi >= max_tokens:
                    return None
                lo, hi = hi, min(2 * hi, max_tokens)
            while hi - lo > 1:  # goes(hi), not goes(lo)
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if goes(mid) else (mid, hi)
            return hi

    # -- observations ----------------------------------------------------------------------

    def observe_local(self, num_tokens: int, seconds: float) -> None:
        """A prompt of `num_tokens` uncached tokens was prefilled here in `seconds`."""
        if num_tokens >= MIN_OBSERVED_TOKENS and seconds > 0:
            with self._lock:
                self.local_rate = _ewma(self.local_rate, num_tokens / seconds)

    def observe_remote(self, stats: dict) -> None:
        """A remote prefill succeeded: fold in its measurements (`client.TransferStats`
        keys) and close the breaker."""
        with self._lock:
            if stats.get("worker_prefill_s", 0) > 0 and stats.get("worker_tokens", 0) > 0:
                self.remote_rate = _ewma(self.remote_rate,
                                         stats["worker_tokens"] / stats["worker_prefill_s"])
            if stats.get("setup_s") is not None:
                self.setup_s = _ewma(self.setup_s, stats["setup_s"])
            if stats.get("link_gbps"):
                self.link_bps = _ewma(self.link_bps, stats["link_gbps"] * 1e9)
            self.failures = 0
            self.open_until = 0.0

    def observe_import(self, num_tokens: int, seconds: float) -> None:
        """The decode box spent `seconds` importing `num_tokens` tokens of KV."""
        if num_tokens > 0:
            with self._lock:
                self.import_s_per_token = _ewma(self.import_s_per_token, seconds / num_tokens)

    def observe_failure(self, reason: str) -> None:
        """A remote prefill failed: open the breaker for a growing interval. A busy peer is
        not a failure, nor one whose queue is too long: they only say to try later."""
        if reason in ("busy", "worker_queue"):
            return
        with self._lock:
            backoff = min(self.config.backoff_s * 2 ** self.failures, self.config.max_backoff_s)
            self.failures += 1
            self.open_until = self.clock() + backoff

    ESTIMATES = ("local_rate", "remote_rate", "setup_s", "link_bps", "import_s_per_token")

    def estimates(self) -> dict[str, float | None]:
        """The measured speeds, to keep for the next process (`load_estimates`)."""
        with self._lock:
            return {name: getattr(self, name) for name in self.ESTIMATES}

    def load_estimates(self, saved: dict) -> None:
        """Start from speeds measured earlier; anything malformed is ignored."""
        with self._lock:
            for name in self.ESTIMATES:
                value = saved.get(name)
                if isinstance(value, int | float) and value > 0:
                    setattr(self, name, float(value))

    def snapshot(self) -> dict:
        """The current estimates (for logs and the bench)."""
        with self._lock:
            return {"local_tok_s": self.local_rate, "remote_tok_s": self.remote_rate,
                    "setup_s": self.setup_s, "link_gbps": (self.link_bps / 1e9
                                                           if self.link_bps else None),
                    "import_s_per_token": self.import_s_per_token,
                    "failures": self.failures,
                    "backoff_s": max(0.0, self.open_until - self.clock())}
