"""Token log-probabilities in OpenAI's two response shapes (natural log, as the engine gives).

- chat: `choices[i].logprobs = {"content": [{"token", "logprob", "bytes", "top_logprobs":
  [{"token", "logprob", "bytes"}]}]}`;
- legacy completions: `choices[i].logprobs = {"tokens", "token_logprobs", "top_logprobs"
  (one `{token: logprob}` dict per token), "text_offset"}`, offsets in characters of the
  choice's text (which starts with the prompt when `echo` is set).

`-inf` (a token the filters removed) is reported as -9999.0, as OpenAI does: JSON has no
infinity.
"""

from __future__ import annotations

import math
from typing import Any

from app.engine.types import TokenLogprob

FLOOR = -9999.0


def finite(x: float) -> float:
    """`x` clamped to JSON-representable values (`-inf`, NaN -> -9999.0)."""
    if math.isnan(x) or x < FLOOR:
        return FLOOR
    return float(x)


def _token_bytes(tokenizer: Any, token_id: int, text: str) -> list[int]:
    try:
        return list(tokenizer.token_bytes(token_id))
    except Exception:  # a tokenizer without byte access: the text's UTF-8
        return list(text.encode("utf-8"))


def chat_content(entries: list[TokenLogprob], tokenizer: Any, top: int) -> list[dict[str, Any]]:
    """The chat shape's `content` list for `entries`, with at most `top` alternatives each."""
    result = []
    for e in entries:
        result.append(
            {
                "token": e.token,
                "logprob": finite(e.logprob),
                "bytes": _token_bytes(tokenizer, e.token_id, e.token),
                "top_logprobs": [
                    {
                        "token": text,
                        "logprob": finite(lp),
                        "bytes": _token_bytes(tokenizer, tid, text),
                    }
                    for tid, text, lp in e.top[:top]
                ],
            }
        )
    return result


class LegacyLogprobs:
    """Builds the completions shape chunk by chunk, tracking the running text offset."""

    def __init__(self, top: int, start_offset: int = 0):
        self.top = top
        self.offset = start_offset

    def prompt(self, token_texts: list[str]) -> dict[str, Any]:
        """Echoed prompt tokens: their text and offsets; no log-probabilities (null)."""
        offsets = []
        for text in token_texts:
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": list(token_texts),
            "token_logprobs": [None] * len(token_texts),
            "top_logprobs": [None] * len(token_texts),
            "text_offset": offsets,
        }

    def echo(self, token_texts: list[str], text: str) -> dict[str, Any]:
        """`prompt(token_texts)`, then generated text offsets continue after `text` (the echoed
        prompt as sent, whose length can differ from its tokens' texts joined)."""
        part = self.prompt(token_texts)
        self.offset = len(text)
        return part

    def add(self, entries: list[TokenLogprob]) -> dict[str, Any]:
        """The shape for newly generated tokens, continuing the offsets."""
        tokens, lps, tops, offsets = [], [], [], []
        for e in entries:
            tokens.append(e.token)
            lps.append(finite(e.logprob))
            tops.append({text: finite(lp) for _, text, lp in e.top[: self.top]})
            offsets.append(self.offset)
            self.offset += len(e.token)
        return {
            "tokens": tokens,
            "token_logprobs": lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def merge_legacy(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate legacy-shape parts (prompt echo, then generated tokens)."""
    out: dict[str, list[Any]] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for p in parts:
        for key in out:
            out[key].extend(p[key])
    return out
