"""Per-chat generation settings, as stored with each chat.

The mapping onto engine sampling parameters is `tui.engine_client.to_sampling_params`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from models.registry import DEFAULT_MAX_TOKENS


@dataclass(slots=True)
class ChatSettings:
    """What one chat sends with every request.

    The class defaults are llama.cpp's sampler defaults (temperature 0.8, top-p 0.95,
    top-k 40, min-p 0.05, no repetition penalty); new chats start from the model's
    recommended settings instead (`for_model`, from `models.registry`). `max_tokens=None`
    means "until the context window is full"; `seed=None` means a fresh random seed per
    reply; `model=None` means the model the app was started with.
    """

    system_prompt: str = ""
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repetition_penalty: float = 1.0
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # `tandem run`'s default too
    seed: int | None = None
    model: str | None = None  # None: the model `tandem chat` started with

    def validate(self) -> None:
        """Raise ValueError with a user-facing message if a value is out of range."""
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top-p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top-k must be >= 0 (0 disables it)")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min-p must be in [0, 1]")
        if not self.repetition_penalty > 0:
            raise ValueError("repetition penalty must be > 0 (1 = off)")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max tokens must be at least 1 (or empty for no limit)")

    @classmethod
    def for_model(cls, model: str | None) -> ChatSettings:
        """Settings whose sampling values are `model`'s recommended ones (a registry name or
        a registry model's file; anything else gets llama.cpp's defaults)."""
        from models.registry import generation_defaults

        d = generation_defaults(model)
        return cls(temperature=d.temperature, top_p=d.top_p, top_k=d.top_k, min_p=d.min_p,
                   repetition_penalty=d.repetition_penalty)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as stored in the database."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatSettings:
        """Build from stored JSON; unknown keys (from newer versions) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
