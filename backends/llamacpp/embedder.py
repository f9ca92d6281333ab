"""Sentence embeddings from the loaded model: a second llama.cpp context on the same weights.

The runner's decode context is never touched: `LlamaEmbedder` makes its own context with
`embeddings=True` on the runner's `llama_model` (`llama_init_from_model` again: weights are
shared, the extra memory is this context's KV cells and compute buffer), built on first use.

Pooling is the model's own (`<arch>.pooling_type` in the GGUF: embedding models such as BERT
or nomic-bert carry mean or CLS). A causal LM carries none; it then gets
`CAUSAL_LM_POOLING` (mean over the input's tokens: see its comment for the measurement).
llama.cpp pools per micro-batch, so the context takes a whole batch in one micro-batch
(`n_ubatch = n_batch = n_ctx`); every input fits, as inputs are at most `max_tokens`.
One input per `llama_decode` (see `_one`), one `embed` at a time.
Vectors come back L2-normalised, as OpenAI's and Ollama's do.
"""

from __future__ import annotations

import threading

import llama_cpp as L
import numpy as np

from backends.llamacpp import runtime

# llama.cpp's enum llama_pooling_type -> its name in the docs and `Embedder.pooling`
POOLING_NAMES = {L.LLAMA_POOLING_TYPE_MEAN: "mean", L.LLAMA_POOLING_TYPE_CLS: "cls",
                 L.LLAMA_POOLING_TYPE_LAST: "last"}
# For a causal LM (no pooling in its GGUF): mean pooling. Measured on four sentence triples
# (docs/readme-embeddings.md): on SmolLM2-135M-Instruct, last-token pooling ranks an unrelated
# sentence above the paraphrase in one triple (code: 0.558 vs 0.632) and mean pooling ranks
# every paraphrase first (by 0.19-0.26); on Qwen2.5-Coder-1.5B both rank all four right. vLLM
# and llama-server's `--pooling last` take the last token for decoder models trained as
# embedders (Qwen3-Embedding, e5-mistral); chat models are not.
CAUSAL_LM_POOLING = L.LLAMA_POOLING_TYPE_MEAN
# Most tokens one input may have, whatever the serving context: the compute buffer grows with
# the micro-batch, which here is the whole batch (8192: OpenAI's embedding models take 8191).
MAX_EMBED_TOKENS = 8192


def model_pooling(model: L.llama_model_p) -> int | None:
    """The pooling a GGUF declares (`<arch>.pooling_type`, llama.cpp's enum), None if none."""
    arch = runtime.meta(model, "general.architecture") or ""
    value = runtime.meta(model, f"{arch}.pooling_type")
    if value is None or int(value) in (L.LLAMA_POOLING_TYPE_NONE,
                                       L.LLAMA_POOLING_TYPE_UNSPECIFIED):
        return None
    return int(value)


def cut_tokens(tokens: list[int], limit: int, head: int, tail: int) -> list[int]:
    """`tokens` (`head` special tokens, the text's, `tail` special tokens) cut to at most
    `limit` by dropping the text's last tokens; the special tokens stay where they fit."""
    if len(tokens) <= limit:
        return tokens
    keep = max(0, limit - head - tail)
    out = tokens[:head + keep] + (tokens[len(tokens) - tail:] if tail else [])
    return out[:limit]


class LlamaEmbedder:
    """Implements `backends.base.Embedder` on a llama.cpp model the caller keeps loaded.

    Args: the model, its tokenizer (`LlamaCppTokenizer`), the most tokens an input may have
    (capped by the model's training context and `MAX_EMBED_TOKENS`), worker threads and the
    flash attention type. Attributes: `n_embd`, `pooling` ("mean" | "cls" | "last"),
    `pooling_source` ("model": the GGUF's; "default": `CAUSAL_LM_POOLING`), `max_tokens`,
    `n_vocab`. `embed` is thread-safe (one computation at a time; `close` waits for it).
    Raises ValueError if the model pools for ranking (a reranker) or llama.cpp cannot make
    the context.
    """

    def __init__(self, model: L.llama_model_p, tokenizer, max_tokens: int, n_threads: int,
                 flash_attn_type: int = L.LLAMA_FLASH_ATTN_TYPE_AUTO):
        declared = model_pooling(model)
        if declared is not None and declared not in POOLING_NAMES:
            raise ValueError("this model ranks (rerank pooling); it does not embed")
        pooling = CAUSAL_LM_POOLING if declared is None else declared
        self.pooling = POOLING_NAMES[pooling]
        self.pooling_source = "default" if declared is None else "model"
        self.tokenizer = tokenizer
        self.n_vocab = tokenizer.n_vocab
        self.n_embd = L.llama_model_n_embd(model)
        self.max_tokens = min(max_tokens, L.llama_model_n_ctx_train(model), MAX_EMBED_TOKENS)
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = cp.n_outputs_max = self.max_tokens
        cp.n_seq_max = 1
        cp.embeddings = True
        cp.pooling_type = pooling
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.flash_attn_type = flash_attn_type
        self._ctx = L.llama_init_from_model(model, cp)
        if not self._ctx:
            raise ValueError(f"llama.cpp could not create a {self.max_tokens}-token "
                             "embedding context")
        self._mem = L.llama_get_memory(self._ctx)
        # how many special tokens tokenize puts before and after the text (BOS; CLS, SEP)
        bare = tokenizer.encode("a", add_special=False)
        full = tokenizer.encode("a", add_special=True)
        head = next((i for i in range(len(full) - len(bare) + 1)
                     if full[i:i + len(bare)] == bare), 0)
        self._specials = (head, len(full) - head - len(bare))
        self._lock = threading.Lock()
        self._batch = L.llama_batch_init(self.max_tokens, 0, 1)

    def tokenize(self, text: str, limit: int | None = None) -> list[int]:
        """The input's tokens with the model's own special tokens (BOS, BERT's CLS/SEP), and
        markup in `text` taken as plain text. With `limit`: at most `limit` tokens, the text
        cut at its end and the special tokens kept (as Ollama's `truncate`)."""
        tokens = self.tokenizer.encode(text, add_special=True, parse_special=False)
        return tokens if limit is None else cut_tokens(tokens, limit, *self._specials)

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One L2-normalised vector of `n_embd` floats per input (token ids, each 1 to
        `max_tokens` of them, in `[0, n_vocab)`: the caller checks). Raises RuntimeError if
        llama.cpp fails."""
        with self._lock:
            if not self._ctx:
                raise RuntimeError("the embedder is closed")
            return [self._one(tokens) for tokens in inputs]

    def _one(self, tokens: list[int]) -> list[float]:
        # One input per llama_decode: packing several changes the matrix shapes, hence the
        # kernels and the sums' order (Qwen2.5-Coder-1.5B Q4_K_M: up to 2.3e-3 per component),
        # and an input's vector must not depend on what else the request sent.
        batch = self._batch
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        batch.n_tokens = len(tokens)
        L.llama_memory_clear(self._mem, True)
        rc = L.llama_decode(self._ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} (embeddings)")
        ptr = L.llama_get_embeddings_seq(self._ctx, 0)
        if not ptr:
            raise RuntimeError("llama.cpp returned no pooled embedding")
        v = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).astype(np.float64)
        norm = float(np.linalg.norm(v))
        return (v / norm if norm > 0 else v).tolist()

    def close(self) -> None:
        """Free the context (waits for a running `embed`); the model stays the caller's."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if getattr(self, "_ctx", None):
                L.llama_free(self._ctx)
                self._ctx = None
            if getattr(self, "_batch", None) is not None:
                L.llama_batch_free(self._batch)
                self._batch = None
