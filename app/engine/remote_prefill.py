"""The engine's side of the two-box mode: a prompt's KV computed by another machine.

At admission the scheduler asks the `RemotePrefill` (the two-box client,
`app/disagg/client.py`) whether a prompt's uncached part should be prefilled remotely. If
so, the request gets its slot and the blocks for its whole prompt, enters
`RequestStatus.REMOTE_PREFILL` (it is not scheduled and holds no step budget, so the other
streams keep decoding), and the client is handed a `RemoteJob`. The client then calls back,
from its own thread, through the step thread's inbox (`AsyncEngine.remote_kv` and
`remote_end`):

    LLMEngine.import_remote_kv(request_id, start, kv)   one verified chunk, in order
    LLMEngine.end_remote_prefill(request_id, outcome)   done, or failed

Each chunk is written into the request's slot and its full blocks enter the prefix cache as
if computed here. On `end_remote_prefill` the request rejoins the running queue and computes
what is left locally: only the last prompt token after a complete transfer (so no logits
or sampler state cross the wire), or everything after the last complete chunk after a
failure. Design after exo's remote prefill (the decode box sends `prompt[:-1]` past its cache
hit and runs the last token itself) and vLLM's "recompute from a valid prefix" on load
failures (shared/notes/two-box.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class RemoteJob:
    """What to prefill remotely: `token_ids` are the prompt without its last token (KV for
    positions `0 .. len(token_ids)-1` is wanted), `start` the first position the decode box
    lacks (its prefix-cache hit, in tokens)."""

    request_id: str
    token_ids: list[int]
    start: int


@dataclass(slots=True)
class RemoteOutcome:
    """How a remote prefill ended. ok: every chunk arrived verified. reason: why it went
    remote, or the failure that ended it ("timeout", "checksum", "peer_closed", ...).
    stats: the client's measurements (bytes, seconds, link GB/s, overlap fraction)."""

    ok: bool
    reason: str
    stats: dict = field(default_factory=dict)


class RemotePrefill(Protocol):
    """The scheduler's view of a prefill peer. Every method is called on the step thread
    and must return at once (the work runs elsewhere)."""

    def decide(self, num_tokens: int, num_cached: int) -> tuple[bool, str] | tuple[bool, str, dict]:
        """(go remote?, why[, numbers]): for a prompt whose KV is wanted for `num_tokens`
        positions, `num_cached` of them already cached here. Reasons are short snake_case
        codes ("faster", "short_prompt", "peer_backoff", ...) counted in /metrics; the
        optional numbers behind them (predicted seconds, ...) go into the route record
        (`RequestMetrics.remote_prefill`) for `app.disagg.report` to put in words."""
        ...

    def begin(self, job: RemoteJob) -> None:
        """Start the transfer; results come back as described in the module docstring."""
        ...

    def cancel(self, request_id: str) -> None:
        """The request ended here (aborted, or the engine stopped): stop its transfer and let
        the peer free it. No callback is due after this."""
        ...

    def observe_local(self, num_tokens: int, seconds: float) -> None:
        """A prompt with `num_tokens` uncached tokens was prefilled here in `seconds` (from
        first scheduled to first token): the policy's local prefill speed."""
        ...

    def observe_import(self, num_tokens: int, seconds: float) -> None:
        """Importing `num_tokens` tokens of remote KV took `seconds` of the step thread."""
        ...

    def close(self) -> None:
        """The engine is closing: end every transfer and the client's thread."""
        ...
