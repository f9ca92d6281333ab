"""`FakeEmbedder`: a deterministic `backends.base.Embedder` without a model.

A vector is the token trigrams of the input hashed into `n_embd` buckets (blake2b of the
three ids), counted and L2-normalised: texts that share words point alike, so the shape tests
of the embedding routes run on the fake engine too, with the same assertions.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np


class FakeEmbedder:
    pooling = "mean"
    pooling_source = "default"

    def __init__(self, tokenizer, max_tokens: int, n_embd: int = 64):
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.n_embd = n_embd
        self.n_vocab = tokenizer.n_vocab
        self.calls: list[list[list[int]]] = []  # the inputs of every `embed`

    def tokenize(self, text: str, limit: int | None = None) -> list[int]:
        tokens = self.tokenizer.encode(text, add_special=True)
        if limit is None or len(tokens) <= limit:
            return tokens
        return tokens[:limit]

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        self.calls.append([list(i) for i in inputs])
        out = []
        for tokens in inputs:
            v = np.zeros(self.n_embd)
            for k in range(max(1, len(tokens) - 2)):
                gram = struct.pack(f"<{len(tokens[k:k + 3])}i", *tokens[k:k + 3])
                v[int.from_bytes(hashlib.blake2b(gram, digest_size=4).digest(), "little")
                  % self.n_embd] += 1.0
            out.append((v / np.linalg.norm(v)).tolist())
        return out
