"""The TUI tests' engine: the real `AsyncEngine` over a `ScriptedRunner`, and what the tests
observe of it.

- Replies follow a script of texts; once it is used up the model answers
  "You said: <last user message>".
- One token per character, and the chat template `<role>content</role>…<assistant>`, so the
  prompt that reached the engine reads back as messages (`Submission.messages`).
- The engine runs on a step clock: a step that prefills costs 50 ms, a decode step 10 ms,
  so every reply shows TTFT 50 ms and 100 tok/s and snapshots do not depend on the machine.
- `hold()` freezes replies mid-stream until `release()` or a cancel. The step in flight
  then completes, so a stopped reply holds one token more than was on screen at the key
  press, as with a real model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from app.engine.async_engine import AsyncEngine, RequestStream
from app.engine.engine import EngineConfig, LLMEngine
from app.engine.types import SamplingParams
from backends.base import BatchItem
from tests.fakes.runner import ScriptedRunner
from tests.fakes.tokenizer import FakeTokenizer

TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
_TURN = re.compile(r"<(system|user|assistant)>(.*?)</\1>", re.DOTALL)
PREFILL_S, DECODE_S = 0.05, 0.01
# The modules whose `time.perf_counter` stamps request metrics and arrivals.
CLOCKED_MODULES = ("app.engine.engine", "app.engine.request", "app.engine.async_engine")


def parse_prompt(text: str) -> list[dict[str, str]]:
    """The messages of a prompt rendered with `TEMPLATE`."""
    return [{"role": role, "content": content} for role, content in _TURN.findall(text)]


def echo(tokenizer: FakeTokenizer):
    """The default reply: "You said: " and the prompt's last user message."""

    def reply(prompt_ids: list[int]) -> str:
        users = [m["content"] for m in parse_prompt(tokenizer.decode(prompt_ids))
                 if m["role"] == "user"]
        return f"You said: {users[-1] if users else ''}"

    return reply


class StepClock:
    """A `perf_counter` that moves only when the runner computes a step."""

    def __init__(self) -> None:
        self.now = 100.0
        self.time = SimpleNamespace(perf_counter=lambda: self.now)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for module in CLOCKED_MODULES:
            monkeypatch.setattr(f"{module}.time", self.time)

    def step(self, items: list[BatchItem]) -> None:
        self.now += PREFILL_S if any(len(item.tokens) > 1 for item in items) else DECODE_S


class ClockedRunner(ScriptedRunner):
    """`ScriptedRunner` that advances a `StepClock` per step and records `close()`."""

    def __init__(self, *args, clock: StepClock, **kwargs):
        super().__init__(*args, **kwargs)
        self.clock = clock
        self.closed = False

    def execute(self, items):
        rows = super().execute(items)
        self.clock.step(items)
        return rows

    def close(self) -> None:
        self.closed = True
        super().close()


@dataclass(slots=True)
class Submission:
    """One request as it reached the engine."""

    request_id: str
    messages: list[dict[str, str]]
    prompt_ids: list[int]
    params: SamplingParams


class ScriptedEngine:
    """A real `AsyncEngine` (`.engine`) over a `ClockedRunner` (`.runner`), recording every
    submitted request (`submitted`) and every request cancelled before it finished
    (`cancelled`, by id). Build it with the `scripted` fixture (it installs the clock)."""

    def __init__(self, replies: list[str], *, clock: StepClock, model_name: str = "fake-135m",
                 context_length: int = 4096):
        tokenizer = FakeTokenizer("chars", chat_template=TEMPLATE)
        self.runner = ClockedRunner(replies, echo(tokenizer), tokenizer=tokenizer, clock=clock,
                                    num_blocks=max(256, -(-context_length // 16)),
                                    block_size=16, n_ctx=context_length,
                                    name=model_name)
        config = EngineConfig(context_length=context_length)
        self.engine = AsyncEngine(LLMEngine(self.runner, config), model_name, "fake")
        self.model_name = model_name
        self.submitted: list[Submission] = []
        self.cancelled: list[str] = []
        self._submit = self.engine.submit
        self.engine.submit = self._record  # type: ignore[method-assign]

    @property
    def closed(self) -> bool:
        return self.runner.closed

    def hold(self, after_tokens: int = 1) -> None:
        """Freeze every reply once it has `after_tokens` tokens, until `release()` or a cancel."""
        self.runner.hold(after_tokens)

    def release(self) -> None:
        self.runner.release()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def _record(self, prompt_ids: list[int], params: SamplingParams,
                request_id: str | None = None) -> RequestStream:
        stream = self._submit(prompt_ids, params, request_id)
        text = self.runner.tokenizer.decode(prompt_ids)
        self.submitted.append(Submission(stream.request_id, parse_prompt(text),
                                         list(prompt_ids), params))
        cancel = stream.cancel

        def cancel_and_release() -> None:
            if not stream.finished and stream.request_id not in self.cancelled:
                self.cancelled.append(stream.request_id)
            cancel()  # queued first, so it lands right after the step in flight
            self.runner.release()

        stream.cancel = cancel_and_release  # type: ignore[method-assign]
        return stream
