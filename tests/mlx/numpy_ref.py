"""An independent f32 numpy forward of a llama-architecture GGUF, for tight MLX parity.

It uses the GGUF weights exactly as stored, i.e. with llama.cpp's Q/K row permutation, and
llama.cpp's "NORM" RoPE (rotating adjacent pairs 2i, 2i+1; src/models/llama.cpp), so it
shares neither the loader's un-permutation nor mlx-lm's rotate-half RoPE with the MLX path.
Attention scores are invariant under the same row permutation of Q and K, so both must agree
up to f32 rounding. Hyperparameters (RMSNorm epsilon, RoPE base, head counts) come from the
GGUF metadata, as llama.cpp reads them; the attention scale is 1/sqrt(head_dim).
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


class NumpyLlama:
    """The GGUF's weights dequantized to f32 once (4 bytes per parameter: ~540 MB for the
    embedded model), with per-sequence K/V caches for batched greedy decoding."""

    def __init__(self, gguf_path: str):
        import gguf
        from gguf.quants import dequantize

        r = gguf.GGUFReader(gguf_path)

        def meta(key):
            return r.fields[f"llama.{key}"].contents()

        self.W = {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
                  for t in r.tensors}
        self.n_layers = int(meta("block_count"))
        self.nh, self.nkv = int(meta("attention.head_count")), int(meta("attention.head_count_kv"))
        self.eps = float(meta("attention.layer_norm_rms_epsilon"))
        self.theta = float(meta("rope.freq_base"))
        self.hd = self.W["token_embd.weight"].shape[1] // self.nh

    def forward(self, seqs: list[list[int]], kvs: list[list]) -> np.ndarray:
        """Logits `[len(seqs), vocab]` of the last token of each sequence in `seqs`, whose
        tokens follow the positions already in its cache `kvs[b]` (a list of per-layer K, V
        `[T, kv_heads, head_dim]`, extended in place). Sequences are stacked for the matmuls,
        so one weight read serves the batch; attention runs per sequence."""
        W, nh, nkv, hd, eps = self.W, self.nh, self.nkv, self.hd, self.eps
        lens = [len(ids) for ids in seqs]
        cuts = np.cumsum([0, *lens])
        x = W["token_embd.weight"][np.array([t for ids in seqs for t in ids], dtype=np.int64)]
        starts = [kv[0][0].shape[0] if kv else 0 for kv in kvs]
        pos = [np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)]
        inv_freq = self.theta ** (-np.arange(0, hd, 2) / hd)
        ang = np.concatenate(pos)[:, None] * inv_freq[None, :]
        # query t of a sequence (position p) sees its keys 0..p
        masks = [np.where(np.arange(p[-1] + 1)[None, :] <= p[:, None], 0.0, -np.inf)
                 for p in pos]
        for i in range(self.n_layers):
            pre = f"blk.{i}."
            h = _rms(x, W[pre + "attn_norm.weight"], eps)
            q = _rope_norm((h @ W[pre + "attn_q.weight"].T).reshape(-1, nh, hd), ang)
            k = _rope_norm((h @ W[pre + "attn_k.weight"].T).reshape(-1, nkv, hd), ang)
            v = (h @ W[pre + "attn_v.weight"].T).reshape(-1, nkv, hd)
            o = np.empty((len(x), nh * hd), dtype=np.float32)
            for b, kv in enumerate(kvs):
                lo, hi = cuts[b], cuts[b + 1]
                if len(kv) <= i:
                    kv.append((k[lo:hi], v[lo:hi]))
                else:
                    kv[i] = (np.concatenate([kv[i][0], k[lo:hi]]),
                             np.concatenate([kv[i][1], v[lo:hi]]))
                kb, vb = (np.repeat(a, nh // nkv, axis=1) for a in kv[i])
                scores = np.einsum("thd,shd->hts", q[lo:hi], kb) / np.sqrt(hd) + masks[b]
                scores = np.exp(scores - scores.max(-1, keepdims=True))
                scores /= scores.sum(-1, keepdims=True)
                o[lo:hi] = np.einsum("hts,shd->thd", scores, vb).reshape(hi - lo, nh * hd)
            x = x + o @ W[pre + "attn_output.weight"].T
            h = _rms(x, W[pre + "ffn_norm.weight"], eps)
            g = h @ W[pre + "ffn_gate.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * (h @ W[pre + "ffn_up.weight"].T)) @ W[
                pre + "ffn_down.weight"].T
        out_w = W.get("output.weight", W["token_embd.weight"])  # tied embeddings
        last = x[cuts[1:] - 1]
        return (_rms(last, W["output_norm.weight"], eps) @ out_w.T).astype(np.float32)

    def logits(self, ids: list[int]) -> np.ndarray:
        """Next-token logits `[vocab]` float32 after `ids` (positions 0..len-1)."""
        return self.forward([ids], [[]])[0]

    def greedy(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        """`n` greedy tokens after each prompt, decoded together (prefill, then one token
        per sequence per forward)."""
        kvs: list[list] = [[] for _ in prompts]
        outs = [[int(t)] for t in np.argmax(self.forward(prompts, kvs), axis=-1)]
        while len(outs[0]) < n:
            nxt = np.argmax(self.forward([[o[-1]] for o in outs], kvs), axis=-1)
            for o, t in zip(outs, nxt, strict=True):
                o.append(int(t))
        return outs


def llama_next_token_logits(gguf_path: str, ids: list[int]) -> np.ndarray:
    """Next-token logits `[vocab]` after `ids` (positions 0..len-1), float32."""
    return NumpyLlama(gguf_path).logits(ids)
