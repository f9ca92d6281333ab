"""Configuration of the engine core: batching limits and the engine's own settings.

Backend-free; `app.config.EngineArgs` (outside the core) holds everything needed to build an
engine, runner included, and derives these.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SchedulerConfig:
    """Args:
    max_num_seqs: requests running at once (batch rows).
    max_num_batched_tokens: token budget of one step (prefill chunks + decodes + drafts).
    max_waiting: admission bound: `AsyncEngine.submit` refuses a request when
        `max_num_seqs + max_waiting` are in flight.
    Raises ValueError for values out of range.
    """

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_waiting: int = 256

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        if self.max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")


@dataclass(slots=True)
class EngineConfig:
    """Args:
    context_length: most tokens (prompt + output) one sequence may hold.
    scheduler: batching limits (None: the defaults).
    enable_prefix_caching: reuse cached prompt blocks.
    """

    context_length: int = 8192
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.scheduler is None:
            self.scheduler = SchedulerConfig()
        if self.context_length < 2:
            raise ValueError("context_length must be at least 2")


@dataclass(slots=True)
class SpecConfig:
    """Speculative decoding.

    Args:
        mode: "off"; "auto" (the adaptive controller sizes every draft; drafts from a
            request's prediction, else n-gram prompt lookup); "ngram" (the same proposers
            and controller, named for what drafts); "fixed:K" (K draft tokens whenever a
            proposer has them: the benchmark's baseline); "draft" (only the draft model).
        num_draft_tokens: most draft tokens per sequence and step (the cap on k).
        forced_drafts: a constrained request's grammar-forced tokens are drafts (in every
            mode but off); off only to measure what they bring.
        suffix_tokens: memory cap of the suffix index of earlier requests' outputs, in
            tokens (`spec_decode.suffix`; ~830 bytes each); 0: no suffix drafts.
    Raises ValueError for an unknown mode, a cap below 1 or a negative suffix cap.
    """

    mode: str = "auto"
    num_draft_tokens: int = 8
    forced_drafts: bool = True
    suffix_tokens: int = 1 << 15
    fixed_k: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError("num_draft_tokens must be at least 1")
        if self.suffix_tokens < 0:
            raise ValueError("suffix_tokens must be 0 (off) or more")
        self.fixed_k = None
        if self.mode.startswith("fixed:"):
            try:
                self.fixed_k = int(self.mode.split(":", 1)[1])
            except ValueError:
                raise ValueError(f"spec mode {self.mode!r}: expected fixed:K") from None
            if not 1 <= self.fixed_k <= self.num_draft_tokens:
                raise ValueError(f"fixed:K needs 1 <= K <= {self.num_draft_tokens}")
        elif self.mode not in ("off", "auto", "ngram", "draft"):
            raise ValueError(
                f"spec mode must be off, auto, ngram, draft or fixed:K, not {self.mode!r}")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"
