"""Public value types of the engine: sampling parameters, stream outputs, errors.

These are what the CLI, the server and the TUI exchange with `AsyncEngine`; nothing here
knows about a backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.constrain import CompiledGrammar


class EngineError(Exception):
    """Base class of errors the engine reports to a caller (bad input, overload)."""


class PromptTooLongError(EngineError, ValueError):
    """The prompt does not fit the context window with room for one generated token."""

    def __init__(self, prompt_tokens: int, context_length: int):
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        super().__init__(
            f"prompt is {prompt_tokens} tokens but the context window is {context_length} "
            f"tokens (at most {context_length - 1} prompt tokens leave room for a reply)"
        )


class EngineOverloadedError(EngineError):
    """The admission queue is full; retry later."""


@dataclass(slots=True)
class SamplingParams:
    """How one sequence is sampled and when it stops.

    `max_tokens=None` generates until EOS, a stop string or the context limit. `top_k=0`,
    `top_p=1.0`, `min_p=0.0` disable those filters; `temperature=0` is greedy. Penalties follow
    OpenAI (presence/frequency, additive on logits, over the output) and llama.cpp/CTRL
    (repetition, multiplicative, over the last `repeat_last_n` tokens of prompt + output: -1
    all of them, 0 none; 64 by default, as llama.cpp and Ollama, so text copied from further
    back, an edited file or a renamed identifier, is not punished). `logprobs=None` returns none; `k>=0` returns the
    chosen token's log-probability and the `k` most likely alternatives. `speculative=False`
    opts out of speculative decoding; `prediction` (token ids) is OpenAI's Predicted
    Outputs, the draft source for this request. Neither changes the output's distribution.
    `logit_bias` is OpenAI's: {token id: bias in [-100, 100]} added to that token's raw logit
    before the penalties (-100 in effect bans a token, +100 forces it); ids are checked
    against the vocabulary when sampled (the server checks them at submission).
    `grammar` (from `app.engine.constrain.GrammarCompiler.compile`, for this model) is what
    the output must match: each sequence gets its own matcher, every logits row it samples
    is masked to what the grammar allows before logit_bias, penalties, temperature and
    top-k/p/min-p, and the sequence ends ("stop") once the grammar is complete.
    """

    max_tokens: int | None = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    speculative: bool = True  # False opts this request out of speculative decoding
    prediction: list[int] | None = None  # expected output's token ids (Predicted Outputs)
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, [-100, 100]
    grammar: CompiledGrammar | None = None  # what the output must match (constrained decoding)

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be in [0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.repeat_last_n < -1:
            raise ValueError("repeat_last_n must be -1 (the whole history), 0 (off) or a "
                             "number of tokens")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError("logprobs must be >= 0")
        if self.logit_bias:
            for token, bias in self.logit_bias.items():
                if token < 0:
                    raise ValueError(f"logit_bias token id {token} must be >= 0")
                if not -100.0 <= bias <= 100.0:  # also refuses NaN
                    raise ValueError(f"logit_bias for token {token} must be in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class TokenLogprob:
    """Log-probability of one generated token and its top alternatives (natural log)."""

    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass(slots=True)
class RequestMetrics:
    """Counters and timings of one request; times in seconds (perf_counter clock)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_draft_tokens: int = 0  # draft tokens verified by the target (speculative decoding)
    num_accepted_tokens: int = 0  # of those, accepted (length of each accepted prefix)
    num_drafts: int = 0  # steps in which this request verified at least one draft token
    accepted_prediction_tokens: int = 0  # draft tokens from `prediction`, accepted
    rejected_prediction_tokens: int = 0  # draft tokens from `prediction`, computed and rejected
    num_forced_draft_tokens: int = 0  # of num_draft_tokens, forced by the request's grammar
    num_accepted_forced_tokens: int = 0  # of those, accepted
    # decode steps that verified no draft, by reason (`speculator.NO_DRAFT_REASONS`)
    no_draft: dict[str, int] = field(default_factory=dict)
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    # two-box mode, set only when a prefill peer is configured: {"remote": bool, "reason":
    # str} from the policy, then for remote ones "ok", "imported_tokens", "import_s" and
    # the client's stats (bytes, transfer seconds, link GB/s, overlap fraction)
    remote_prefill: dict | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token in seconds, from arrival."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def prefill_tok_s(self) -> float | None:
        """Prompt tokens computed (not cached) per second of prefill."""
        if self.first_token_time is None or self.first_scheduled_time is None:
            return None
        dt = self.first_token_time - self.first_scheduled_time
        computed = self.prompt_tokens - self.cached_tokens
        return computed / dt if dt > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens, or None if nothing was drafted."""
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_accepted_length(self) -> float | None:
        """Mean accepted draft tokens per verification that had drafts, or None."""
        if not self.num_drafts:
            return None
        return self.num_accepted_tokens / self.num_drafts

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first, in seconds."""
        if self.finish_time is None or self.first_token_time is None:
            return None
        if self.completion_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.completion_tokens - 1)

    @property
    def decode_tok_s(self) -> float | None:
        tpot = self.tpot
        return 1.0 / tpot if tpot else None


@dataclass(slots=True)
class RequestOutput:
    """One increment of a request's stream.

    `text` is the new text since the previous output, never containing a stop string or half
    a UTF-8 character; `token_ids` the new tokens (including any whose text is held back).
    `finish_reason` is `"stop"`, `"length"` or `"abort"` on the last output, else None;
    `stop_sequence` is the stop string that ended the request (finish "stop"), else None.
    """

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    metrics: RequestMetrics | None = None
    stop_sequence: str | None = None


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    """A prompt being computed: `computed` of `total` prompt tokens have KV (the first
    `cached` of them came from the prefix cache); `remote`: a prefill peer is computing it
    and its KV arrives in chunks (two-box mode)."""

    computed: int
    total: int
    cached: int = 0
    remote: bool = False


@dataclass(slots=True)
class EngineStats:
    """A snapshot of the engine for status bars and /metrics."""

    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    prefix_cache_hit_tokens: int  # cumulative
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_finished: int
    remote_prefilling: int = 0  # requests waiting for a prefill peer's KV (two-box mode)
    slots_total: int = 0  # the runner's sequence slots
    slots_used: int = 0  # slots held by live requests (0 when idle: none leaked)
    kv_saved_bytes: int = 0  # host memory of cached prefixes no slot holds (llama.cpp)
