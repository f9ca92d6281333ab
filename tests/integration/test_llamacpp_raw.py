"""`app.bench.kv_quant`'s reference, llama.cpp alone (`app.bench.llamacpp_raw`), computes
what the runner computes for each KV cache type on the embedded model: the same logits after
the prompt and after each decode step, so its decode speed is measured on the same work."""

from __future__ import annotations

import llama_cpp as L
import numpy as np
import pytest

from app.bench.kv_quant import CHUNK, _runner, _text_tokens
from app.bench.llamacpp_raw import (
    decode,
    kv_context,
    kv_decode_tok_s_subprocess,
    last_logits,
    prefill,
    raw_decode_tok_s_subprocess,
)
from backends.base import BatchItem
from backends.llamacpp.repack import load_model_like_runner

TYPES = ["f16", "q8_0"]


@pytest.fixture(scope="module")
def runners(embedded_model_path):
    made = {t: _runner(embedded_model_path, t, 512, 2) for t in TYPES}
    yield made
    for r in made.values():
        r.close()


def test_llama_cpp_alone_gives_the_runners_logits(embedded_model_path, runners):
    tokens = _text_tokens(runners["f16"].tokenizer, 300)
    table = list(range(512))
    model = load_model_like_runner(embedded_model_path)
    try:
        last = {}
        for t, runner in runners.items():
            assert runner.flash_attn == {"f16": "auto", "q8_0": "on"}[t]
            ctx = kv_context(model, t, runner.flash_attn, 512, CHUNK, 2)
            try:
                expected = runner.execute([BatchItem(0, tokens, 0, table, [len(tokens) - 1])])
                prefill(ctx, tokens, CHUNK)
                np.testing.assert_array_equal(last_logits(ctx, 49152), expected[-1])
                for k in range(3):  # decode steps, the token the runner's logits pick
                    token, pos = int(np.argmax(expected[-1])), len(tokens) + k
                    expected = runner.execute([BatchItem(0, [token], pos, table, [0])])
                    decode(ctx, [(token, pos, 0, True)])
                    np.testing.assert_array_equal(last_logits(ctx, 49152), expected[-1])
                last[t] = expected[-1].copy()
            finally:
                runner.release(0, 0)
                L.llama_free(ctx)
    finally:
        L.llama_model_free(model)
    assert not np.array_equal(last["f16"], last["q8_0"])  # q8_0 is not f16 by another name


def test_kv_decode_speeds_come_back_from_a_child_process(embedded_model_path):
    speeds = kv_decode_tok_s_subprocess(
        model_path=embedded_model_path, kv_types=TYPES, flash_attn=["auto", "on"],
        tokens=list(range(100, 164)), decode_tokens=4, rounds=1, threads=2, n_batch=CHUNK)
    assert list(speeds) == TYPES
    assert all(v > 0 for v in speeds.values())


def test_batch_decode_speeds_come_back_from_a_child_process(embedded_model_path):
    # `tandem bench --baseline raw`'s ceiling, keyed by batch size
    speeds = raw_decode_tok_s_subprocess(embedded_model_path, [1, 2], threads=2)
    assert list(speeds) == [1, 2]
    assert all(v > 0 for v in speeds.values())
