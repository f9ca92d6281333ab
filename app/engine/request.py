"""One record per sequence: tokens, counters, block table, status, timings."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from app.engine.constrain import Matcher
from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.sampler import is_plain_greedy
from app.engine.types import RequestMetrics, SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    REMOTE_PREFILL = "remote_prefill"  # waiting for a prefill peer's KV (two-box mode)
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """A sequence being generated.

    Token regions (vLLM v1's bookkeeping: one subtraction decides what to compute)::

        |<-------------- token_ids (prompt + output) -------------->|<- spec_token_ids ->|
        |<--- num_computed_tokens (KV exists) --->|<-------------- to compute -------------->|

    `spec_token_ids` are drafts proposed for the next step: computed with the real tokens,
    then verified; rejected ones are rolled back, so after a step `num_computed_tokens <=
    num_tokens` again. `metrics.cached_tokens` is the part of the prompt served from the
    prefix cache when the request was first scheduled. `block_table[i]` holds positions
    `i*block_size ..`. `seed_key` keys the request's random draws (`sampler.position_rng`).
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0  # leading blocks of block_table registered in the prefix cache
    slot: int | None = None
    finish_reason: str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    num_preemptions: int = 0
    prompt_block_hashes: list[bytes] | None = None  # chained hashes of full prompt blocks
    spec_token_ids: list[int] = field(default_factory=list)
    spec_state: dict = field(default_factory=dict)  # proposers' and controller's per-request state
    plain_greedy: bool = field(init=False, default=False)  # is_plain_greedy(params)
    # set by the engine
    seed_key: int = 0
    detokenizer: IncrementalDetokenizer | None = None
    # the grammar state of a constrained request (`params.grammar`): after its output tokens
    matcher: Matcher | None = None

    def __post_init__(self) -> None:
        # its row is a bare argmax; a constrained row is masked first
        self.plain_greedy = is_plain_greedy(self.params) and self.params.grammar is None
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)
        self.metrics.prompt_tokens = len(self.prompt_ids)
        if not self.metrics.arrival_time:
            self.metrics.arrival_time = time.perf_counter()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids):]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={self.status.value})"
        )
