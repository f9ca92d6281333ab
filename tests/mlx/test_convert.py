"""`backends.mlx.convert`: a GGUF converted to an MLX directory loads and computes the same logits."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from backends.base import BatchItem  # noqa: E402


def test_converted_dir_matches_gguf(gguf_path, mlx_runner, tmp_path):
    from backends.mlx.convert import convert_gguf_to_mlx, is_current
    from backends.mlx.runner import MLXRunner

    out = convert_gguf_to_mlx(gguf_path, tmp_path / "smol", dtype="float32")
    assert is_current(out, gguf_path)
    assert convert_gguf_to_mlx(gguf_path, out, dtype="float32") == out  # up to date: no work
    # mlx-lm's own loader stops on these (EOS/EOT of SmolLM2: <|endoftext|>, <|im_end|>, ...)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == [0, 2, 4]
    assert json.loads((out / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    runner = MLXRunner(str(out), max_seqs=1, num_blocks=2, block_size=16)
    try:
        text = "<|im_start|>user\nHi 👋<|im_end|>"
        ids = mlx_runner.tokenizer.encode(text, parse_special=True)
        assert runner.tokenizer.encode(text, parse_special=True) == ids
        assert runner.tokenizer.encode(text) == mlx_runner.tokenizer.encode(text)
        assert runner.tokenizer.eos_ids == mlx_runner.tokenizer.eos_ids
        assert runner.tokenizer.chat_template == mlx_runner.tokenizer.chat_template
        assert runner.info.n_layers == mlx_runner.info.n_layers
        got = runner.execute([BatchItem(0, ids, 0, [0], [len(ids) - 1])])[0]
        want = mlx_runner.execute([BatchItem(0, ids, 0, [30], [len(ids) - 1])])[0]
        np.testing.assert_allclose(got, want, atol=1e-3)
    finally:
        runner.close()


def test_refuses_unsupported_architecture(tmp_path):
    from backends.mlx.loader import load

    (tmp_path / "config.json").write_text('{"model_type": "gemma3"}')
    with pytest.raises(ValueError, match="not supported by the MLX backend"):
        load(str(tmp_path))
