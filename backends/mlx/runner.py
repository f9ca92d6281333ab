"""The MLX model runner: mlx-lm model definitions over a paged KV pool indexed by the engine's
block ids (protocol: `backends/base.py`).

The pool is addressed directly by the block tables each `BatchItem` carries, so prefix sharing
(`share_blocks`) costs nothing and rollback (`truncate`) is just rewriting positions later;
those calls are no-ops here. `export_kv`/`import_kv` move per-layer K/V in DESIGN.md's neutral
layout (`[tokens, kv_heads, head_dim]`, f16, rotate-half RoPE already applied); a q8_0 pool
(MLX 8-bit affine, `QuantizedPagedLayerCache`) is not llama.cpp's q8_0 wire layout, so it
moves no KV.

All MLX work runs on one private `MLXThread` (`backends/mlx/thread.py`): MLX streams are
thread-local, and the engine calls from its own step thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from backends.base import BatchItem, LayerKV, ModelInfo, RunnerCapabilities
from backends.mlx.thread import MLXThread

T = TypeVar("T")

# A row joins a padded forward only while padding stays under this fraction of the batch
# (B*L <= sum(len) / (1 - waste)); otherwise it gets its own forward, e.g. a 512-token prefill
# chunk next to decode rows (shared/notes/mlx.md §1, "Limits of the drop-in approach").
_MAX_PAD_WASTE = 0.34

# KV cache types of the MLX pool: "q8_0" is MLX's affine 8-bit quantization (group 64), the
# name of llama.cpp's 8-bit type so that one `--kv-cache-type` flag serves both backends.
KV_CACHE_TYPES = ("f16", "q8_0")


def check_kv_cache_type(kv_cache_type: str) -> None:
    """Raises ValueError (one line) for a KV cache type the MLX pool does not have."""
    if kv_cache_type not in KV_CACHE_TYPES:
        raise ValueError(f"--kv-cache-type {kv_cache_type} is for the llamacpp backend; the "
                         "MLX backend's KV cache is f16 or q8_0 (MLX 8-bit affine)")


def kv_transfer_refusal(kv_cache_type: str) -> str | None:
    """Why an MLX pool of `kv_cache_type` cannot move KV in two-box mode (one line), or None
    if it can."""
    if kv_cache_type == "f16":
        return None
    return (f"two-box mode sends f16 or llama.cpp's q8_0 KV; --kv-cache-type {kv_cache_type} "
            "on the MLX backend (MLX 8-bit affine) is not supported")


def group_rows(lengths: list[int]) -> list[list[int]]:
    """Partition row indices into padded forwards: longest first, greedily, bounded waste."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups:
            g = groups[-1]
            total = sum(lengths[j] for j in g) + lengths[i]
            if (len(g) + 1) * lengths[g[0]] * (1 - _MAX_PAD_WASTE) <= total:
                g.append(i)
                continue
        groups.append([i])
    return groups


class MLXRunner:
    """Runner over an mlx-lm model with `num_blocks` KV blocks of `block_size` tokens.

    Args:
        path: a `.gguf` file or an MLX model directory (see `backends.mlx.loader.load`).
        max_seqs: slots the engine may use (any slot works; the pool is shared).
        num_blocks, block_size: KV capacity; the pool per layer is
            `[num_blocks*block_size + 1, kv_heads, head_dim]` (last row: trash for pads).
        dtype: mx dtype of weights and activations (default: f16 on Metal, f32 on CPU).
        kv_cache_type: "f16": KV in the activations' dtype; "q8_0": MLX affine 8-bit
            (`QuantizedPagedLayerCache`), dequantized to that dtype as attention reads it.
    Raises FileNotFoundError / ValueError from loading (unsupported architecture etc.), and
    ValueError for another `kv_cache_type` or a head dim 32 does not divide (q8_0).
    """

    def __init__(self, path: str, max_seqs: int, num_blocks: int, block_size: int = 16,
                 dtype=None, kv_cache_type: str = "f16"):
        if max_seqs < 1 or num_blocks < 1 or block_size < 1:
            raise ValueError("max_seqs, num_blocks and block_size must be positive")
        check_kv_cache_type(kv_cache_type)
        self.kv_cache_type = kv_cache_type
        # The pool is addressed by block tables, so truncation is exact by design.
        self.capabilities = RunnerCapabilities(
            exact_truncate=True, kv_transfer=kv_transfer_refusal(kv_cache_type) is None)
        self.max_seqs = max_seqs
        self.num_blocks = num_blocks
        self.max_seq_tokens = num_blocks * block_size
        self.block_size = block_size
        self._thread: MLXThread | None = MLXThread()
        try:
            self._on_thread(self._load, path, dtype)
        except BaseException:
            self._thread.close()
            raise

    # -- thread plumbing -------------------------------------------------------------------

    def _on_thread(self, fn: Callable[..., T], *args) -> T:
        if self._thread is None:
            raise RuntimeError("the MLX runner is closed")
        return self._thread.call(fn, *args)

    def _load(self, path: str, dtype) -> None:
        import mlx.core as mx

        from backends.mlx.loader import load
        from backends.mlx.paged_cache import PagedLayerCache, QuantizedPagedLayerCache

        lm = load(path, dtype)
        self._lm = lm
        cfg = lm.config
        inner = lm.model.model
        self._inner = inner
        # mlx-lm models create `lm_head` only when embeddings are not tied
        self._head = (lm.model.lm_head if hasattr(lm.model, "lm_head")
                      else inner.embed_tokens.as_linear)
        n_heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or n_heads
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
        # activations (and so K/V) take the dtype of the embeddings' output
        act_dtype = inner.embed_tokens(mx.array([[0]])).dtype
        n_rows = self.num_blocks * self.block_size + 1
        cache = QuantizedPagedLayerCache if self.kv_cache_type == "q8_0" else PagedLayerCache
        self._caches = [cache(n_rows, kv_heads, head_dim, act_dtype) for _ in inner.layers]
        mx.eval([(c.keys, c.values) for c in self._caches])
        self.tokenizer = lm.tokenizer
        self.info = ModelInfo(
            name=lm.name, architecture=cfg["model_type"], n_layers=len(inner.layers),
            n_kv_heads=kv_heads, head_dim=head_dim, n_vocab=cfg["vocab_size"],
            n_ctx_train=int(cfg.get("max_position_embeddings") or 4096),
            rope_theta=cfg.get("rope_theta"))

    # -- compute ---------------------------------------------------------------------------

    def execute(self, items: list[BatchItem]) -> np.ndarray:
        """Compute one step; float32 logits `[sum(len(i.logits_indices)), n_vocab]` in item
        order, then index order. Raises ValueError for a malformed batch, RuntimeError if MLX
        fails."""
        for it in items:
            if not it.tokens:
                raise ValueError(f"slot {it.slot}: empty token list")
            if not 0 <= it.slot < self.max_seqs:
                raise ValueError(f"slot {it.slot} out of range [0, {self.max_seqs})")
            if any(not 0 <= i < len(it.tokens) for i in it.logits_indices):
                raise ValueError(f"slot {it.slot}: logits index out of range")
        if not items:
            return np.zeros((0, self.info.n_vocab), dtype=np.float32)
        try:
            return self._on_thread(self._execute, items)
        except ValueError:
            raise
        except Exception as e:
            raise RuntimeError(f"MLX step failed: {e}") from e

    def _execute(self, items: list[BatchItem]) -> np.ndarray:
        out: list[np.ndarray | None] = [None] * len(items)
        for group in group_rows([len(it.tokens) for it in items]):
            rows = self._forward([items[i] for i in group])
            at = 0
            for i in group:
                n = len(items[i].logits_indices)
                out[i] = rows[at:at + n]
                at += n
        return np.concatenate(out, axis=0)

    def _forward(self, items: list[BatchItem]) -> np.ndarray:
        import mlx.core as mx

        from backends.mlx.paged_cache import build_layout

        lengths = [len(it.tokens) for it in items]
        B, L = len(items), max(lengths)
        layout = build_layout([it.start_pos for it in items], lengths,
                              [it.block_table for it in items], self.block_size,
                              self.num_blocks)
        tokens = np.zeros((B, L), dtype=np.int32)
        for b, it in enumerate(items):
            tokens[b, :len(it.tokens)] = it.tokens
        for c in self._caches:
            c.layout = layout
        try:
            h = self._inner(mx.array(tokens), cache=self._caches)  # [B, L, hidden]
            want = [b * L + t for b, it in enumerate(items) for t in it.logits_indices]
            if want:
                # the LM head runs only on rows whose logits are wanted
                logits = self._head(h.reshape(B * L, -1)[mx.array(want)]).astype(mx.float32)
            else:
                logits = mx.zeros((0, self.info.n_vocab), dtype=mx.float32)
            # evaluate the pools too so the next step's scatter starts from materialised,
            # donatable buffers instead of a growing lazy graph
            mx.eval(logits, [(c.keys, c.values) for c in self._caches])
            return np.array(logits, copy=True)
        finally:
            for c in self._caches:
                c.layout = None

    # -- KV transfer (two-box mode) -----------------------------------------------------------

    def _check_transfer(self) -> None:
        reason = kv_transfer_refusal(self.kv_cache_type)
        if reason is not None:
            raise ValueError(reason)

    def _rows(self, block_table: list[int], start: int, n: int) -> np.ndarray:
        bt = np.asarray(block_table, dtype=np.int64)
        if start < 0 or n < 0 or len(bt) * self.block_size < start + n:
            raise ValueError("block table does not cover the requested positions")
        if len(bt) and (bt.min() < 0 or bt.max() >= self.num_blocks):
            raise ValueError("block id out of range")
        pos = np.arange(start, start + n)
        return (bt[pos // self.block_size] * self.block_size
                + pos % self.block_size).astype(np.int32)

    def export_kv(self, slot: int, block_table: list[int], start: int, n: int
                  ) -> list[LayerKV]:
        """K and V of positions `start..start+n-1`, per layer, each `[n, kv_heads, head_dim]`
        float16, post-RoPE in the rotate-half (Hugging Face) convention. Raises ValueError
        for a q8_0 pool (`kv_transfer_refusal`) or positions the table does not cover."""
        self._check_transfer()
        rows = self._rows(block_table, start, n)

        def run():
            import mlx.core as mx

            idx = mx.array(rows)
            out = []
            for c in self._caches:
                k, v = c.read(idx)
                k, v = k.astype(mx.float16), v.astype(mx.float16)
                mx.eval(k, v)
                out.append((np.array(k), np.array(v)))
            return out

        return self._on_thread(run)

    def import_kv(self, slot: int, block_table: list[int], start: int,
                  kv: list[LayerKV]) -> None:
        """Write per-layer K/V `[n, kv_heads, head_dim]` (layout of `export_kv`) into positions
        `start..start+n-1` of the blocks in `block_table`. Raises ValueError on shape mismatch
        or for a q8_0 pool (`kv_transfer_refusal`)."""
        self._check_transfer()
        if len(kv) != len(self._caches):
            raise ValueError(f"expected {len(self._caches)} layers, got {len(kv)}")
        n = kv[0][0].shape[0]
        want = (n, self.info.n_kv_heads, self.info.head_dim)
        if any(k.shape != want or v.shape != want for k, v in kv):
            raise ValueError(f"K/V must be {want} per layer")
        rows = self._rows(block_table, start, n)

        def run():
            import mlx.core as mx

            idx = mx.array(rows)
            for c, (k, v) in zip(self._caches, kv, strict=True):
                c.write(idx, mx.array(k), mx.array(v))
            mx.eval([(c.keys, c.values) for c in self._caches])

        self._on_thread(run)

    @property
    def kv_bytes(self) -> int:
        """Bytes of the KV pools of all layers (quantized sizes for q8_0)."""
        return sum(c.nbytes for c in self._caches)

    # -- sequence ops: the pool is addressed by the engine's block tables -----------------------

    def share_blocks(self, slot: int, block_ids: list[int]) -> int:
        """No copy: the shared blocks arrive in the slot's next block table."""
        return len(block_ids)

    def release(self, slot: int, n_keep_blocks: int) -> None:
        """No-op: blocks stay in the pool until the engine reuses them."""

    def evict(self, block_ids: list[int]) -> None:
        """No-op: an evicted block is simply overwritten by its next owner."""

    def truncate(self, slot: int, n_tokens: int) -> None:
        """No-op: positions past `n_tokens` are rewritten by the next step that computes them,
        and the mask never lets a row see keys past its own length."""

    def close(self) -> None:
        """Free the model and pools and stop the MLX thread (its streams cleared first).
        Idempotent."""
        if self._thread is None:
            return

        def drop():
            self._caches = []
            self._lm = self._inner = self._head = None

        thread, self._thread = self._thread, None
        try:
            thread.call(drop)
        finally:
            thread.close()


def load_mlx_runner(gguf_or_dir_path: str, max_seqs: int, num_blocks: int,
                    block_size: int = 16, kv_cache_type: str = "f16") -> MLXRunner:
    """The MLX runner for a `.gguf` file or an MLX model directory (engine entry point).
    Raises FileNotFoundError, ValueError (unsupported architecture/tokenizer/KV cache type),
    ImportError if mlx is not installed."""
    import mlx.core  # noqa: F401  -- fail early with ImportError when mlx is missing

    return MLXRunner(gguf_or_dir_path, max_seqs, num_blocks, block_size,
                     kv_cache_type=kv_cache_type)
