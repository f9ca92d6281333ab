"""Load a model for the MLX backend: a GGUF file, or an MLX / Hugging Face model directory.

Only architectures whose paged-cache parity is tested run (`SUPPORTED_ARCHITECTURES`); others
are refused with a message that names the llama.cpp backend. Call from the thread that will
run the model: MLX streams are thread-local since mlx 0.31.2 (ml-explore/mlx-lm#1181).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from backends.mlx.tokenizer import MLXTokenizer, tokenizer_from_dir, tokenizer_from_gguf

# mlx-lm model types run through the paged cache with a parity test (tests/mlx).
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")


@dataclass
class LoadedModel:
    """An mlx-lm model with its config dict (Hugging Face keys) and tokenizer."""

    model: nn.Module
    config: dict[str, Any]
    tokenizer: MLXTokenizer
    name: str


def default_dtype() -> mx.Dtype:
    """float16 on Metal; float32 on CPU, where MLX has no fast half-precision matmul and f32
    keeps parity with llama.cpp's f32 activations tight."""
    return mx.float16 if mx.metal.is_available() else mx.float32


def check_architecture(model_type: str) -> None:
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"architecture {model_type!r} is not supported by the MLX backend yet "
            f"(tested: {', '.join(SUPPORTED_ARCHITECTURES)}); use --backend llamacpp")


def build_model(config: dict[str, Any], weights) -> nn.Module:
    """Instantiate mlx-lm's own model class for `config` and load `(name, mx.array)` pairs
    (strict: every parameter must be present)."""
    from mlx_lm.utils import _get_classes

    check_architecture(config["model_type"])
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    model.load_weights(list(weights), strict=True)
    mx.eval(model.parameters())
    model.eval()
    return model


def load_gguf(path: str, dtype: mx.Dtype | None = None,
              quantize_bits: int | None = None) -> LoadedModel:
    """Dequantize a GGUF into an mlx-lm model with weights in `dtype`.

    quantize_bits: requantize Linear/Embedding weights to MLX affine `bits` (group 64), which
        is lossy on top of the GGUF quantization; None keeps dequantized floats.
    Raises FileNotFoundError, ValueError (unsupported architecture, tokenizer or RoPE).
    """
    from backends.mlx.gguf_weights import config_from_gguf, iter_weights, open_gguf

    dtype = dtype or default_dtype()
    reader = open_gguf(path)
    config = config_from_gguf(reader)
    check_architecture(config["model_type"])
    tokenizer = tokenizer_from_gguf(reader)
    weights = ((name, mx.array(w).astype(dtype)) for name, w in iter_weights(reader, config))
    model = build_model(config, weights)
    if quantize_bits:
        nn.quantize(model, group_size=64, bits=quantize_bits)
        mx.eval(model.parameters())
        config["quantization"] = {"group_size": 64, "bits": quantize_bits}
    return LoadedModel(model, config, tokenizer, Path(path).stem)


def load_dir(path: str) -> LoadedModel:
    """Load an MLX-format directory (config.json, model*.safetensors, tokenizer.json), e.g. an
    mlx-community repo or the output of `tandem models convert`. Raises FileNotFoundError,
    ValueError (unsupported architecture)."""
    from mlx_lm.utils import load_model

    p = Path(path)
    config = json.loads((p / "config.json").read_text())
    check_architecture(config.get("model_type", "?"))
    model, config = load_model(p)
    model.eval()
    return LoadedModel(model, config, tokenizer_from_dir(p), p.name)


def load(path: str, dtype: mx.Dtype | None = None) -> LoadedModel:
    """A `.gguf` file or a model directory. Raises FileNotFoundError if `path` is neither."""
    p = Path(path)
    if p.is_file():
        return load_gguf(str(p), dtype)
    if p.is_dir() and (p / "config.json").exists():
        return load_dir(str(p))
    raise FileNotFoundError(f"{path}: not a GGUF file or a model directory with config.json")
