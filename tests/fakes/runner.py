"""Runners without a model, for tests of the real engine.

- `FakeRunner`: next token = (token + 1) % vocab, greedy-decodable. It records the steps and
  the KV-residency calls the engine makes, so tests can assert them.
- `ScriptedRunner`: the model says scripted replies (texts or token ids), with an optional
  delay per step, `hold()`/`release()` to freeze streams mid-reply and `fail_after(n)` to
  simulate a backend failure. Run it under `AsyncEngine(LLMEngine(runner, config), ...)`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from backends.base import BatchItem, ModelInfo, RunnerCapabilities
from tests.fakes.embedder import FakeEmbedder
from tests.fakes.tokenizer import FakeTokenizer

Reply = str | list[int]


class FakeRunner:
    capabilities = RunnerCapabilities(exact_truncate=True, kv_transfer=False)

    def __init__(self, num_blocks=64, block_size=4, max_seqs=8, n_vocab=100, n_ctx=1024):
        self.info = ModelInfo("fake", "fake", 1, 1, 1, n_vocab, n_ctx)
        self.tokenizer = FakeTokenizer("bytes", bos_id=None, eos_id=0)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_seq_tokens = num_blocks * block_size
        self.share_limit: int | None = None  # share at most this many blocks (split layout)
        self.max_seqs = max_seqs
        self.steps: list[list[BatchItem]] = []
        self.calls: list[tuple] = []

    def execute(self, items):
        self.steps.append(items)
        rows = []
        for item in items:
            for j in item.logits_indices:
                row = np.full(self.info.n_vocab, -10.0, dtype=np.float32)
                row[(item.tokens[j] + 1) % self.info.n_vocab] = 10.0
                rows.append(row)
        if not rows:
            return np.empty((0, self.info.n_vocab), dtype=np.float32)
        return np.stack(rows)

    def share_blocks(self, slot, block_ids):
        self.calls.append(("share", slot, list(block_ids)))
        return len(block_ids) if self.share_limit is None else min(self.share_limit,
                                                                    len(block_ids))

    def release(self, slot, n_keep_blocks):
        self.calls.append(("release", slot, n_keep_blocks))

    def evict(self, block_ids):
        self.calls.append(("evict", list(block_ids)))

    def truncate(self, slot, n_tokens):
        self.calls.append(("truncate", slot, n_tokens))

    def close(self):
        pass


class TransferRunner(FakeRunner):
    """A FakeRunner that imports KV (records `("import", slot, start, n)`); `refuse_import`
    makes the next import raise like a runner refusing a state."""

    capabilities = RunnerCapabilities(exact_truncate=True, kv_transfer=True)

    def __init__(self, **kw):
        super().__init__(**kw)
        self.refuse_import = False

    def import_kv(self, slot, block_table, start, kv):
        if self.refuse_import:
            raise RuntimeError("llama.cpp refused the imported KV state")
        self.calls.append(("import", slot, start, kv[0][0].shape[0]))


class ScriptedRunner(FakeRunner):
    """A runner whose model follows a script.

    Each new prompt gets the next of `replies` (a text, encoded with the tokenizer, or token
    ids); once they are used up, `default` (a reply, or a function of the prompt's token ids
    returning one). After its reply the model says EOS; if the engine goes on (`ignore_eos`)
    it says the reply again, EOS, and so on. Greedy decoding follows the script exactly: the
    scripted token's logit is `margin` above every other, and the others are fixed
    pseudo-random values in [-1, 0) that depend on the position, so sampled decoding
    (temperature, top-k, seeds) has a real, reproducible distribution to draw from.

    The runner stores the tokens of every KV block it computed, like a paged KV pool: the
    context of a row is read through its block table, so prefix-cache hits (`share_blocks`)
    see the same context. A preempted request that resumes is recognised (its context is a
    known prompt plus the start of that prompt's reply) and goes on with the same reply.

    `prompts` lists every prompt the model saw, in order. `step_s` is slept in each
    `execute`. Thread-safe for `hold`, `release` and `fail_after` from the test's thread.
    """

    def __init__(
        self,
        replies: Sequence[Reply] = (),
        default: Reply | Callable[[list[int]], Reply] = "",
        *,
        tokenizer: FakeTokenizer | None = None,
        step_s: float = 0.0,
        margin: float = 10.0,
        num_blocks: int = 1024,
        block_size: int = 16,
        max_seqs: int = 8,
        n_ctx: int = 4096,
        name: str = "scripted",
    ):
        tokenizer = tokenizer or FakeTokenizer()
        super().__init__(num_blocks, block_size, max_seqs, tokenizer.n_vocab, n_ctx)
        self.tokenizer = tokenizer
        self.info = ModelInfo(name, "fake", 1, 1, 1, tokenizer.n_vocab, n_ctx)
        self.replies = list(replies)
        self.default = default
        self.step_s = step_s
        self.margin = margin
        self.prompts: list[list[int]] = []
        self._replies: list[list[int]] = []  # the reply of prompts[i]
        self._eos = min(self.tokenizer.eos_ids) if self.tokenizer.eos_ids else None
        self._blocks: dict[int, list[int]] = {}  # block id -> its tokens
        self._slot_prompt: dict[int, int] = {}  # slot -> index into prompts
        self._lock = threading.Condition()
        self._hold_after: int | None = None
        self.holding = threading.Event()  # set while a step waits in `hold`
        self.num_steps = 0
        self._fail_at: int | None = None
        self.embeds = True  # False: `embedder` raises as for a model that cannot embed
        self._embedder: FakeEmbedder | None = None

    def embedder(self, max_tokens: int) -> FakeEmbedder:
        """A `FakeEmbedder` over this runner's tokenizer (the same one on every call)."""
        if not self.embeds:
            raise ValueError("this model ranks (rerank pooling); it does not embed")
        if self._embedder is None:
            self._embedder = FakeEmbedder(self.tokenizer, max_tokens)
        return self._embedder

    # -- script control ---------------------------------------------------------------------

    def hold(self, after_tokens: int = 1) -> None:
        """Freeze streams mid-reply: a step that would give any sequence its token number
        `after_tokens + 1` (or later) of the reply waits, before computing, until `release()`.
        The step thread waits with it, so a cancel sent meanwhile takes effect after the
        step, as when a real step is slow."""
        with self._lock:
            self._hold_after = after_tokens

    def release(self, slot: int | None = None, n_keep_blocks: int = 0) -> None:
        """With no arguments: end a `hold()`. With a slot: the `Runner.release` call."""
        if slot is not None:
            super().release(slot, n_keep_blocks)
            self._slot_prompt.pop(slot, None)
            return
        with self._lock:
            self._hold_after = None
            self._lock.notify_all()

    def fail_after(self, n_steps: int) -> None:
        """Steps after the next `n_steps` raise RuntimeError (a backend failure)."""
        with self._lock:
            self._fail_at = self.num_steps + n_steps

    def reply_for(self, prompt: list[int]) -> list[int]:
        """The reply a new prompt gets (consumes one of `replies`)."""
        if self.replies:
            reply = self.replies.pop(0)
        elif callable(self.default):
            reply = self.default(list(prompt))
        else:
            reply = self.default
        return self.tokenizer.encode(reply) if isinstance(reply, str) else list(reply)

    # -- Runner -----------------------------------------------------------------------------

    def execute(self, items: list[BatchItem]) -> np.ndarray:
        with self._lock:
            self.num_steps += 1
            if self._fail_at is not None and self.num_steps > self._fail_at:
                raise RuntimeError("simulated backend error")
        self.steps.append(items)
        bs = self.block_size
        wanted: list[tuple[int, list[int]]] = []  # (slot, context) per logits row
        for item in items:
            for k, tok in enumerate(item.tokens):
                pos = item.start_pos + k
                block = self._blocks.setdefault(item.block_table[pos // bs], [])
                del block[pos % bs:]
                block.append(tok)
            for j in item.logits_indices:
                wanted.append((item.slot, self._context(item, item.start_pos + j + 1)))
        plans = [self._plan(slot, ctx) for slot, ctx in wanted]
        self._wait_if_held([n for n, _ in plans])
        if self.step_s:
            time.sleep(self.step_s)
        n_vocab = self.info.n_vocab
        rows = np.empty((len(plans), n_vocab), dtype=np.float32)
        for r, ((_, token), (_, ctx)) in enumerate(zip(plans, wanted, strict=True)):
            rows[r] = np.random.default_rng([len(ctx), ctx[-1]]).random(n_vocab) - 1.0
            rows[r, token] = self.margin
        return rows

    def _context(self, item: BatchItem, n: int) -> list[int]:
        bs = self.block_size
        ctx: list[int] = []
        for b in item.block_table[: -(-n // bs)]:
            ctx += self._blocks.get(b, [])[: n - len(ctx)]
        if len(ctx) != n:
            raise AssertionError(f"KV of slot {item.slot} is missing positions {len(ctx)}..{n - 1}")
        return ctx

    def _plan(self, slot: int, ctx: list[int]) -> tuple[int, int]:
        """(tokens of the reply already in `ctx`, the next token) for one row."""
        index = self._slot_prompt.get(slot)
        if index is None:
            index = self._resumed(ctx)
            if index is None:
                self.prompts.append(list(ctx))
                self._replies.append(self.reply_for(ctx))
                index = len(self.prompts) - 1
            self._slot_prompt[slot] = index
        said = len(ctx) - len(self.prompts[index])
        return said, self._say(self._replies[index], said)

    def _say(self, reply: list[int], n: int) -> int:
        cycle = reply + ([] if self._eos is None else [self._eos])
        return cycle[n % len(cycle)] if cycle else 0

    def _resumed(self, ctx: list[int]) -> int | None:
        for index in range(len(self.prompts) - 1, -1, -1):
            prompt = self.prompts[index]
            said = len(ctx) - len(prompt)
            if said >= 1 and ctx[: len(prompt)] == prompt and all(
                ctx[len(prompt) + i] == self._say(self._replies[index], i) for i in range(said)
            ):
                return index
        return None

    def _wait_if_held(self, said: list[int]) -> None:
        with self._lock:
            while self._hold_after is not None and any(n >= self._hold_after for n in said):
                self.holding.set()
                self._lock.wait()
            self.holding.clear()
