"""The speculative bench's agent-loop workload: a coding agent's tool loop replayed, turn by
turn. Each of `concurrency` conversations runs TURNS turns; a turn's prompt is the
conversation so far (the system prompt with its tool protocol, every earlier reply as the
assistant's message, the tool's result as the next user message), so later turns repeat
earlier text, and the conversations repeat each other: the workload where prompt lookup and
the suffix index of earlier outputs have something to draft.
"""

from __future__ import annotations

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


class AgentLoop:
    """The next turn of each conversation, built from the replies so far. `first()` gives
    the first turn of conversation i; `follow(i, turn, replies)` the next one (None after
    TURNS turns). Each turn is greedy with `max_tokens`."""

    def __init__(self, tokenizer, max_tokens: int):
        self.tokenizer, self.max_tokens = tokenizer, max_tokens

    def _turn(self, i: int, replies: list[str]) -> tuple[list[int], SamplingParams]:
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": TASKS[i % len(TASKS)]}]
        for t, reply in enumerate(replies):
            messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": RESULTS[t % len(RESULTS)]})
        return (chat_prompt_ids(self.tokenizer, messages),
                SamplingParams(temperature=0, max_tokens=self.max_tokens))

    def first(self, i: int) -> tuple[list[int], SamplingParams]:
        return self._turn(i, [])

    def follow(self, i: int, replies: list[list[int]]) -> tuple[list[int], SamplingParams] | None:
        """Conversation i's next turn after the replies (token ids) so far, or None."""
        if len(replies) >= TURNS:
            return None
        return self._turn(i, [self.tokenizer.decode(r) for r in replies])
