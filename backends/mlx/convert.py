"""GGUF -> MLX model directory, so the MLX backend does not re-dequantize at every start.

The directory has mlx-lm's layout (`config.json`, `model.safetensors`) plus `tokenizer.json`,
`tandem_tokenizer.json` (special-token facts `tokenizer.json` does not carry) and
`tandem_source.json` (size and mtime of the GGUF it came from, to detect a stale copy).
It loads with `backends.mlx.loader.load_dir` and with mlx-lm's own `mlx_lm.utils.load_model`.
Converted models live in `models.store.mlx_conversion_dir(...)`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from models.store import mlx_conversion_dir

DTYPES = ("float16", "bfloat16", "float32")
converted_dir = mlx_conversion_dir  # the name backends.loader imports


def _source_facts(gguf_path: Path) -> dict:
    st = gguf_path.stat()
    return {"gguf": str(gguf_path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_current(out_dir: str | Path, gguf_path: str | Path) -> bool:
    """True if `out_dir` holds a complete conversion of the GGUF as it is now."""
    src = Path(out_dir) / "tandem_source.json"
    if not src.exists() or not (Path(out_dir) / "model.safetensors").exists():
        return False
    saved = json.loads(src.read_text())
    now = _source_facts(Path(gguf_path))
    return saved.get("size") == now["size"] and saved.get("mtime_ns") == now["mtime_ns"]


def convert_gguf_to_mlx(gguf_path: str | Path, out_dir: str | Path | None = None,
                        dtype: str = "float16", quantize_bits: int | None = None,
                        overwrite: bool = False) -> Path:
    """Convert a GGUF (llama/qwen2/qwen3) into an MLX directory; returns the directory.

    dtype: weight dtype on disk ("float16", "bfloat16", "float32").
    quantize_bits: also requantize to MLX affine 4/8-bit (group 64; lossy on top of GGUF's).
    Skips the work when an up-to-date conversion exists, unless `overwrite`.
    Raises FileNotFoundError, ValueError (unsupported model or dtype), ImportError (no mlx).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
    if quantize_bits not in (None, 4, 8):
        raise ValueError("quantize_bits must be 4 or 8")
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF not found: {gguf_path}")
    out = Path(out_dir) if out_dir else mlx_conversion_dir(gguf_path, dtype, quantize_bits)
    if not overwrite and is_current(out, gguf_path):
        return out

    from backends.mlx.thread import run_on_mlx_thread

    # on a thread of its own, whose MLX streams are cleared before it ends
    return run_on_mlx_thread(_convert, gguf_path, out, dtype, quantize_bits)


def _convert(gguf_path: Path, out: Path, dtype: str, quantize_bits: int | None) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from backends.mlx.loader import load_gguf

    lm = load_gguf(str(gguf_path), getattr(mx, dtype), quantize_bits=quantize_bits)
    out.parent.mkdir(parents=True, exist_ok=True)
    # write next to the target and rename, so a crash never leaves a half directory in place
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        weights = dict(tree_flatten(lm.model.parameters()))
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        specials = lm.tokenizer.specials()
        # mlx-lm's own loader stops on config.json's eos_token_id list (EOS and EOT tokens)
        config = {**lm.config, "eos_token_id": specials["eos_ids"]}
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "tokenizer.json").write_text(lm.tokenizer.to_hf_json())
        (tmp / "tandem_tokenizer.json").write_text(json.dumps(specials, indent=2))
        tokenizer_config = {"chat_template": specials["chat_template"],
                            "add_bos_token": specials["add_bos"]}
        if specials["eos_ids"]:
            tokenizer_config["eos_token"] = lm.tokenizer.token_text(specials["eos_ids"][0])
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
        (tmp / "tandem_source.json").write_text(json.dumps(_source_facts(gguf_path)))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
