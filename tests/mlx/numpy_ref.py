"""An independent f32 numpy forward of a llama-architecture GGUF, for tight MLX parity.

It uses the GGUF weights exactly as stored, i.e. with llama.cpp's Q/K row permutation, and
llama.cpp's "NORM" RoPE (rotating adjacent pairs 2i, 2i+1; src/models/llama.cpp), so it
shares neither the loader's un-permutation nor mlx-lm's rotate-half RoPE with the MLX path.
Attention scores are invariant under the same row permutation of Q and K, so both must agree
up to f32 rounding.
"""

from __future__ import annotations

import numpy as np


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_norm(x: np.ndarray, ang: np.ndarray) -> np.ndarray:
    """x `[T, heads, head_dim]`, ang `[T, head_dim/2]` radians; rotates pairs (2i, 2i+1)."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def llama_next_token_logits(gguf_path: str, ids: list[int]) -> np.ndarray:
    """Next-token logits `[vocab]` after `ids` (positions 0..len-1), float32."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(gguf_path)

    def meta(key):
        return r.fields[f"llama.{key}"].contents()

    W = {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
         for t in r.tensors}
    n_layers, nh = int(meta("block_count")), int(meta("attention.head_count"))
    nkv, eps = int(meta("attention.head_count_kv")), float(meta("attention.layer_norm_rms_epsilon"))
    theta = float(meta("rope.freq_base"))
    emb = W["token_embd.weight"]
    hd = emb.shape[1] // nh
    T = len(ids)
    x = emb[ids]
    ang = np.arange(T)[:, None] * theta ** (-np.arange(0, hd, 2) / hd)[None, :]
    causal = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    for i in range(n_layers):
        p = f"blk.{i}."
        h = _rms(x, W[p + "attn_norm.weight"], eps)
        q = _rope_norm((h @ W[p + "attn_q.weight"].T).reshape(T, nh, hd), ang)
        k = _rope_norm((h @ W[p + "attn_k.weight"].T).reshape(T, nkv, hd), ang)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + causal
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", scores, v).reshape(T, nh * hd)
        x = x + o @ W[p + "attn_output.weight"].T
        h = _rms(x, W[p + "ffn_norm.weight"], eps)
        g = h @ W[p + "ffn_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ W[p + "ffn_up.weight"].T)) @ W[
            p + "ffn_down.weight"].T
    out_w = W.get("output.weight", emb)
    return (_rms(x[-1], W["output_norm.weight"], eps) @ out_w.T).astype(np.float32)
