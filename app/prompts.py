"""Prompts to token ids: the model's chat template, or raw text.

Outside the engine core: chat templating needs `models.chat_template` (jinja2), which the
backend-free core does not import.
"""

from __future__ import annotations

from app.tool_calls import CallFormat, derive_format
from backends.base import Tokenizer
from models.chat_template import render_segments


def _specials(tok: Tokenizer) -> tuple[str, str]:
    bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
    eos_id = min(tok.eos_ids) if tok.eos_ids else None
    eos = tok.token_text(eos_id) if eos_id is not None else ""
    return bos, eos


def call_format(tokenizer: Tokenizer) -> CallFormat:
    """The model's native tool-call format, derived from its chat template (cached)."""
    return derive_format(tokenizer.chat_template, *_specials(tokenizer))


def chat_prompt_ids(tokenizer: Tokenizer, messages: list[dict],
                    add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
    """Render the model's chat template over `messages` and tokenize it. Message text is
    tokenized without special-token parsing, so a user typing `<|im_end|>` cannot forge a
    role marker; the template's own text is parsed for special tokens. `tools` (OpenAI's
    tool shapes) is passed to the template as its `tools` variable when given.

    Raises models.chat_template.ChatTemplateError (the template failed or refused the
    messages)."""
    tok = tokenizer
    bos, eos = _specials(tok)
    extra = {"tools": tools} if tools else {}
    segments = render_segments(tok.chat_template, messages, bos_token=bos, eos_token=eos,
                               add_generation_prompt=add_generation_prompt, **extra)
    ids: list[int] = []
    for text, is_content in segments:
        if text:
            ids.extend(tok.encode(text, add_special=False, parse_special=not is_content))
    return ids


def raw_prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """Tokenize a raw prompt: BOS added if the model asks for it, special tokens parsed."""
    return tokenizer.encode(text, add_special=True, parse_special=True)
