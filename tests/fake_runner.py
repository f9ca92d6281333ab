"""A runner without a model: next token = (token + 1) % vocab, greedy-decodable.

It records the KV-residency calls the engine makes, so tests can assert them.
"""

from __future__ import annotations

import numpy as np

from backends.base import BatchItem, ModelInfo


class FakeTokenizer:
    bos_id = None
    eos_ids = {0}
    chat_template = None

    def encode(self, text, add_special=False, parse_special=False):
        return [ord(c) % 100 + 1 for c in text]

    def token_bytes(self, token_id):
        return chr(ord("a") + token_id % 26).encode()

    def token_text(self, token_id):
        return self.token_bytes(token_id).decode()

    def decode(self, ids):
        return b"".join(self.token_bytes(t) for t in ids).decode()


class FakeRunner:
    def __init__(self, num_blocks=64, block_size=4, max_seqs=8, n_vocab=100, n_ctx=1024):
        self.info = ModelInfo("fake", "fake", 1, 1, 1, n_vocab, n_ctx)
        self.tokenizer = FakeTokenizer()
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
