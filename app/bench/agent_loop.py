"""The speculative bench's conversation workloads, replayed turn by turn. Each of
`concurrency` conversations runs its turns in order; a turn's prompt is the conversation so
far (the system prompt, every earlier reply as the assistant's message, the script's next
user message after it), so later turns repeat earlier text, and the conversations repeat
each other: the workloads where prompt lookup and the suffix index of earlier outputs have
something to draft.

- `agent-loop` (`AGENT_LOOP`): a coding agent's tool loop, 10 turns: the system prompt holds
  the tool protocol, each next user message is a tool's result;
- `chat` (`CHAT`): a multi-turn chat about one function, 6 turns: the user asks for it, then
  for changes to it (type hints, a docstring, a rename, ...), so each reply rewrites the
  previous one.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.types import SamplingParams
from app.prompts import chat_prompt_ids

TURNS = 10
SYSTEM = (
    "You are a coding agent working in a Python repository. Call one tool per reply, as "
    'one line of JSON: {"tool": "read_file", "path": "..."}, {"tool": "run_tests"} or '
    '{"tool": "edit_file", "path": "...", "old": "...", "new": "..."}. '
    "Say in one sentence why, then the JSON line."
)
TASKS = ["The test test_total_price fails. Fix it.",
         "The test test_counter_reset fails. Fix it."]
FILE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal - tax
'''
RESULTS = [  # what the tools "return", turn after turn
    f"read_file src/shop.py:\n{FILE}",
    "run_tests: 1 failed, 11 passed\nFAILED tests/test_shop.py::test_total_price - "
    "assert 90.0 == 110.0",
    "read_file tests/test_shop.py:\ndef test_total_price():\n    assert total_price(ITEMS, 0.1) == 110.0\n",
    "edit_file src/shop.py: applied",
    "run_tests: 1 failed, 11 passed\nFAILED tests/test_shop.py::test_total_price - "
    "assert 90.0 == 110.0",
    f"read_file src/shop.py:\n{FILE.replace('- tax', '+ tax')}",
    "run_tests: 12 passed",
]


CHAT_TASKS = ["Write a Python function that returns the n-th Fibonacci number.",
              "Write a Python function that checks whether a string is a palindrome."]
CHAT_FOLLOW_UPS = ["Add type hints.", "Add a docstring.", "Rename the function to solve.",
                   "Make it handle negative input by raising ValueError.",
                   "Show the final version once more, nothing else."]


@dataclass(frozen=True)
class Script:
    """A conversation workload: an optional system prompt, the first user message of
    conversation i (`tasks[i % len]`), the user message after reply t (`follow_ups[t % len]`),
    and the number of turns."""

    system: str | None
    tasks: list[str]
    follow_ups: list[str]
    turns: int


AGENT_LOOP = Script(SYSTEM, TASKS, RESULTS, TURNS)
CHAT = Script(None, CHAT_TASKS, CHAT_FOLLOW_UPS, 1 + len(CHAT_FOLLOW_UPS))
SCRIPTS = {"agent-loop": AGENT_LOOP, "chat": CHAT}


class Conversations:
    """The next turn of each conversation of `script`, built from the replies so far.
    `first(i)` gives the first turn of conversation i; `follow(i, replies)` the next one
    (None after `script.turns` turns). Each turn is greedy with `max_tokens`."""

    def __init__(self, tokenizer, max_tokens: int, script: Script = AGENT_LOOP):
        self.tokenizer, self.max_tokens, self.script = tokenizer, max_tokens, script

    def _turn(self, i: int, replies: list[str]) -> tuple[list[int], SamplingParams]:
        s = self.script
        messages = [{"role": "system", "content": s.system}] if s.system else []
        messages.append({"role": "user", "content": s.tasks[i % len(s.tasks)]})
        for t, reply in enumerate(replies):
            messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": s.follow_ups[t % len(s.follow_ups)]})
        return (chat_prompt_ids(self.tokenizer, messages),
                SamplingParams(temperature=0, max_tokens=self.max_tokens))

    def first(self, i: int) -> tuple[list[int], SamplingParams]:
        return self._turn(i, [])

    def follow(self, i: int, replies: list[list[int]]) -> tuple[list[int], SamplingParams] | None:
        """Conversation i's next turn after the replies (token ids) so far, or None."""
        if len(replies) >= self.script.turns:
            return None
        return self._turn(i, [self.tokenizer.decode(r) for r in replies])
