"""GGUF file -> mlx-lm config dict and weights (numpy), for the llama, qwen2 and qwen3 families.

Tensors are read through `gguf.GGUFReader` (memory-mapped) and dequantized with
`gguf.quants.dequantize`, which handles every GGUF quant type. `mx.load` is not used: it
silently mis-dequantizes Q4_K and fails on Q5_*/Q3_K/IQ* (see shared/notes/mlx.md §4).

llama.cpp's converter permutes the Q and K projection rows of llama-architecture models so that
its "NORM" RoPE (adjacent pairs) applies (`conversion/llama.py: LlamaModel.permute`); we undo
that permutation so that mlx-lm's default rotate-half RoPE (`rope_traditional=False`) runs and
the KV pool holds K in the Hugging Face convention that DESIGN.md's wire format uses.
qwen2/qwen3 GGUFs use NEOX RoPE and are not permuted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

# GGUF architectures we can map onto mlx-lm model definitions (names are mlx-lm model_type).
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")

# GGUF per-layer tensor suffix -> mlx-lm module path under `model.layers.N.`
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def open_gguf(path: str):
    """Open a GGUF file memory-mapped. Raises FileNotFoundError / ValueError (not a GGUF)."""
    import gguf

    try:
        return gguf.GGUFReader(path, "r")
    except FileNotFoundError:
        raise
    except Exception as e:  # gguf raises bare ValueError/struct errors on foreign files
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e


def field(reader, key: str, default: Any = None) -> Any:
    """Value of a GGUF metadata key (str, number or list), or `default` if absent."""
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def gguf_architecture(reader) -> str:
    return str(field(reader, "general.architecture", ""))


def config_from_gguf(reader) -> dict[str, Any]:
    """An mlx-lm (Hugging Face style) config dict built from GGUF metadata.

    Raises ValueError for architectures or RoPE variants we do not map.
    """
    arch = gguf_architecture(reader)
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported by the MLX backend "
            f"(supported: {', '.join(GGUF_ARCHITECTURES)}); use --backend llamacpp"
        )
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        # Llama 3.1+ frequency factors: mlx-lm's Llama3RoPE needs the original scaling
        # parameters, which the GGUF does not carry; refusing beats silently wrong positions.
        raise ValueError("GGUF with rope_freqs (Llama 3.1-style RoPE scaling) is not supported "
                         "by the MLX GGUF loader yet; use --backend llamacpp")

    def a(key, default=None):
        return field(reader, f"{arch}.{key}", default)

    n_heads = int(a("attention.head_count"))
    hidden = int(a("embedding_length"))
    head_dim = int(a("attention.key_length", 0) or a("rope.dimension_count", 0)
                   or hidden // n_heads)
    tokens = field(reader, "tokenizer.ggml.tokens")
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    vocab = int(a("vocab_size", 0) or (len(tokens) if tokens else 0) or embd.shape[-1])
    config: dict[str, Any] = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(a("block_count")),
        "intermediate_size": int(a("feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(a("attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": vocab,
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(a("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
    }
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in names
        config["mlp_bias"] = "blk.0.ffn_up.bias" in names
    scaling = a("rope.scaling.type")
    if scaling and scaling != "none":
        if scaling != "linear":
            raise ValueError(f"GGUF RoPE scaling {scaling!r} is not supported by the MLX GGUF "
                             "loader yet; use --backend llamacpp")
        config["rope_scaling"] = {"type": "linear", "factor": float(a("rope.scaling.factor"))}
    return config


def mlx_name(gguf_name: str) -> str:
    """mlx-lm parameter name of a GGUF tensor (`blk.3.attn_q.weight` ->
    `model.layers.3.self_attn.q_proj.weight`). Raises ValueError for unknown tensors."""
    base, _, kind = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        if part in _LAYER_NAMES:
            return f"model.layers.{int(layer)}.{_LAYER_NAMES[part]}.{kind}"
    elif base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{kind}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation.

    Per head, GGUF row `2*i + h` holds Hugging Face row `h*(d/2) + i` (h in {0, 1}), i.e. the
    converter applied `reshape(n_heads, 2, d/2, ...).swapaxes(1, 2)`; this is its inverse.
    `w` is `[n_heads*d, in]` (weight) or `[n_heads*d]` (bias).
    """
    rest = w.shape[1:]
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, d // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def iter_weights(reader, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """Yield `(mlx-lm name, float32 array)` per tensor, in numpy orientation `[out, in]`.

    One tensor is dequantized at a time so peak host memory stays near one layer.
    """
    from gguf.quants import dequantize

    permuted = config["model_type"] == "llama"
    for t in reader.tensors:
        name = mlx_name(t.name)
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if permuted and ".self_attn.q_proj." in name:
            w = unpermute_rows(w, config["num_attention_heads"])
        elif permuted and ".self_attn.k_proj." in name:
            w = unpermute_rows(w, config["num_key_value_heads"])
        yield name, w
