"""MLX runner vs llama.cpp on the same GGUF: next-token logits and greedy continuations.

Q4_1 weights are dequantized to f32 on the MLX side, while llama.cpp quantizes activations to
Q8_1 for its Q4_1 dot products and keeps an f16 KV cache, so logits differ by a fraction of a
unit (llama.cpp with an f32 instead of f16 KV cache moves by 0.9 itself on this model); the
ranking at the top must agree and greedy runs may split only at near-ties.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from backends.base import BatchItem  # noqa: E402

PROMPTS = [
    ("The capital of France is", False),
    ("def add(a, b):\n    return", False),
    ("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", True),
]
N_GREEDY = 16


def _blocks(slot: int) -> list[int]:
    return list(range(slot * 8, slot * 8 + 8))  # 8 blocks of 16 tokens per slot


def test_next_token_logits_match_llamacpp(mlx_runner, llama_ref):
    tok = mlx_runner.tokenizer
    prompts = [tok.encode(p, parse_special=s) for p, s in PROMPTS]
    items = [BatchItem(slot, ids, 0, _blocks(slot), [len(ids) - 1])
             for slot, ids in enumerate(prompts)]
    ours = mlx_runner.execute(items)
    assert ours.shape == (len(prompts), mlx_runner.info.n_vocab)
    assert ours.dtype == np.float32
    for (text, _), ids, row in zip(PROMPTS, prompts, ours, strict=True):
        ref = llama_ref.logits(ids)
        top5_ours, top5_ref = np.argsort(-row)[:5], np.argsort(-ref)[:5]
        overlap = len(set(top5_ours) & set(top5_ref))
        diff = float(np.abs(row - ref).max())
        print(f"\nparity {text[:24]!r}: n={len(ids)} top1 {top5_ours[0]}/{top5_ref[0]} "
              f"top5 overlap {overlap}/5 max|dlogit| {diff:.4f} "
              f"(logit range {ref.min():.1f}..{ref.max():.1f})")
        assert top5_ours[0] == top5_ref[0]
        assert overlap >= 4
        assert diff < 2.0


def test_greedy_continuations_match_llamacpp(mlx_runner, llama_ref):
    tok = mlx_runner.tokenizer
    prompts = [tok.encode(p, parse_special=s) for p, s in PROMPTS]
    logits = mlx_runner.execute([BatchItem(s, ids, 0, _blocks(s), [len(ids) - 1])
                                 for s, ids in enumerate(prompts)])
    outs = [[int(np.argmax(row))] for row in logits]
    for _ in range(N_GREEDY - 1):  # batched decode: one token per row per step
        logits = mlx_runner.execute([
            BatchItem(s, [out[-1]], len(ids) + len(out) - 1, _blocks(s), [0])
            for s, (ids, out) in enumerate(zip(prompts, outs, strict=True))])
        for out, row in zip(outs, logits, strict=True):
            out.append(int(np.argmax(row)))
    for (text, _), ids, out in zip(PROMPTS, prompts, outs, strict=True):
        ref = llama_ref.greedy(ids, N_GREEDY)
        same = next((i for i, (a, b) in enumerate(zip(out, ref, strict=True)) if a != b),
                    N_GREEDY)
        print(f"\ngreedy {text[:24]!r}: first {same}/{N_GREEDY} tokens agree; "
              f"mlx {tok.decode(out)!r} llama.cpp {tok.decode(ref)!r}")
        assert same >= 3
        if same < N_GREEDY:
            # A divergence must be a near-tie for llama.cpp itself: its own logits move by
            # ~0.9 between an f16 and an f32 KV cache on this model (measured), so a gap
            # inside that band is noise, not a conversion error.
            at = llama_ref.logits(ids + out[:same])
            gap = float(at.max() - at[out[same]])
            print(f"  diverged at {same}: llama.cpp logit gap to MLX's token {gap:.3f}")
            assert gap < 1.0


def test_logits_match_independent_numpy_forward(mlx_runner, gguf_path):
    """Tight parity (same f32 arithmetic, no activation quantization): checks the GGUF
    loader's tensor mapping and Q/K un-permutation and the paged attention path."""
    from tests.mlx.numpy_ref import llama_next_token_logits

    ids = mlx_runner.tokenizer.encode("Paged attention in eight tokens!")[:8]
    ours = mlx_runner.execute([BatchItem(0, ids, 0, _blocks(0), [len(ids) - 1])])[0]
    ref = llama_next_token_logits(gguf_path, ids)
    diff = float(np.abs(ours - ref).max())
    print(f"\nnumpy f32 reference: max|dlogit| {diff:.2e}")
    assert int(np.argmax(ours)) == int(np.argmax(ref))
    assert diff < 1e-2
