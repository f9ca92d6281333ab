"""Render a model's own Jinja chat template, safely, keeping message text apart.

Templates come from model files, so they are untrusted code: they run in jinja2's
`ImmutableSandboxedEnvironment` with the helpers Hugging Face's `apply_chat_template`
provides (`raise_exception`, `strftime_now`, a `tojson` that does not HTML-escape,
loop controls), so templates written for transformers render the same here.

Why segments: if the rendered prompt were tokenized as one string with special-token
parsing, a user typing `<|im_end|>` would close their own turn and forge a new role.
`render_segments` marks which spans came from message content so the caller tokenizes
those without special parsing and only the template's own text with it.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used when a model ships no template. ChatML is what SmolLM2 and Qwen2.5 use, and the
# commonest format among small instruct models; a model trained on another format will
# still run, only with a prompt layout it has not seen.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

Message = dict[str, Any]
Segment = tuple[str, bool]  # (text, is_content)


class ChatTemplateError(ValueError):
    """The template failed to compile or render; the message carries jinja's reason. A
    ValueError: it is the request's (or the model's template's) fault, answered with a 400."""


class TemplateRaised(ChatTemplateError):
    """The template itself refused the messages with `raise_exception(message)` (e.g. roles
    out of order for this model); `message` is the template's own text, to show as is."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class _RaisedByTemplate(TemplateError):
    """What `raise_exception` raises inside jinja; `render` turns it into TemplateRaised."""


def render(
    template: str | None,
    messages: list[Message],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    **context: Any,
) -> str:
    """Render `messages` with `template` (ChatML if None or empty) to one plain string.

    `context` adds template variables (e.g. `tools`). Do not tokenize this string with
    special-token parsing when it holds user text; use `render_segments` for that.

    Raises:
        TemplateRaised: the template called `raise_exception(message)` (a ChatTemplateError
            whose text is the template's message, unchanged).
        ChatTemplateError: the template has a syntax error, failed, or tried something the
            sandbox forbids.
    """
    variables = dict(
        context,
        messages=messages,
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
    )
    compiled = _compile(template or CHATML_TEMPLATE)
    try:
        return compiled.render(variables)
    except _RaisedByTemplate as exc:
        raise TemplateRaised(str(exc.message)) from None
    except Exception as exc:  # template code is foreign: any failure is the template's
        raise ChatTemplateError(_describe(exc)) from None


def render_segments(
    template: str | None,
    messages: list[Message],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    **context: Any,
) -> list[Segment]:
    """Render like `render`, split into `(text, is_content)` segments, in prompt order.

    Each message's content (a string, or the `text` of its text parts) is swapped for a
    unique marker, the template is rendered, and the output is split on the markers:
    template text is `is_content=False` (tokenize with special parsing), message content
    is `is_content=True` (tokenize without). Leading and trailing whitespace of a message
    travels outside the marker, so templates that `trim` content render exactly as with
    the real text; whitespace found next to a marker is counted as content (it may really
    be the template's, which changes nothing but the tokenization boundary). Empty
    segments are dropped and neighbours of one kind merged.

    Limits: a template that branches on or slices the content sees the marker, not the
    text. Tokenizing the segments separately can split a BPE merge at a segment edge,
    which the model sees as a slightly unusual but valid token sequence.

    Raises:
        ChatTemplateError: as `render`, or the template cut a marker apart.
    """
    nonce = secrets.token_hex(8)
    marker = re.compile(f"\ue000{nonce}:(\\d+)\ue001")
    pieces: list[tuple[str, str, str]] = []  # (leading ws, core text, trailing ws)

    def stand_in(text: str) -> str:
        core = text.strip()
        lead = text[: len(text) - len(text.lstrip())] if core else text
        trail = text[len(text.rstrip()) :] if core else ""
        pieces.append((lead, core, trail))
        return f"{lead}\ue000{nonce}:{len(pieces) - 1}\ue001{trail}"

    masked = [_mask_message(m, stand_in) for m in messages]
    rendered = render(template, masked, bos_token, eos_token, add_generation_prompt, **context)

    parts = marker.split(rendered)  # text, index, text, index, ..., text
    segments: list[Segment] = []
    for i in range(0, len(parts), 2):
        text = parts[i]
        if "\ue000" in text or "\ue001" in text:  # a marker the template cut apart
            raise ChatTemplateError("chat template altered message content beyond trimming")
        if i + 1 >= len(parts):
            segments.append((text, False))
            break
        lead, core, trail = pieces[int(parts[i + 1])]
        # Whitespace that survived next to the marker belongs to the message: give it back,
        # so it is tokenized together with the text as it would be in one string.
        if lead and text.endswith(lead):
            text, core = text[: -len(lead)], lead + core
        following = parts[i + 2]
        if trail and following.startswith(trail):
            parts[i + 2], core = following[len(trail) :], core + trail
        segments.append((text, False))
        segments.append((core, True))
    return _merge(segments)


def _mask_message(message: Message, stand_in) -> Message:
    masked = dict(message)
    content = message.get("content")
    if isinstance(content, str):
        masked["content"] = stand_in(content)
    elif isinstance(content, list):  # multimodal-style parts: only text parts carry text
        masked["content"] = [
            dict(p, text=stand_in(p["text"]))
            if isinstance(p, dict) and isinstance(p.get("text"), str)
            else p
            for p in content
        ]
    return masked


def _merge(segments: list[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for text, is_content in segments:
        if not text:
            continue
        if merged and merged[-1][1] == is_content:
            merged[-1] = (merged[-1][0] + text, is_content)
        else:
            merged.append((text, is_content))
    return merged


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja's built-in tojson HTML-escapes <, >, & and '; prompts need the raw characters.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env


@functools.lru_cache(maxsize=32)
def _compile(template: str):
    try:
        return _environment().from_string(template)
    except Exception as exc:
        raise ChatTemplateError(_describe(exc)) from None


def _describe(exc: Exception) -> str:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    line = getattr(exc, "lineno", None)
    where = f" (line {line})" if line else ""
    return f"chat template error{where}: {reason}"
