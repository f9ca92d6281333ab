"""`app.bench.kv_quant`'s ceiling, llama.cpp alone (`RawDecoder`), computes what the runner
computes: the same next-token logits after the same text, per KV type, so its decode speed
is the ceiling of the runner's on the same work."""

from __future__ import annotations

import numpy as np
import pytest

from app.bench.kv_quant import _runner, _text_tokens, raw_decode
from app.bench.raw_llama import CHUNK, RawDecoder
from backends.base import BatchItem

TYPES = ["f16", "q8_0"]


@pytest.fixture(scope="module")
def runners(embedded_model_path):
    made = {t: _runner(embedded_model_path, t, 512, 2) for t in TYPES}
    yield made
    for r in made.values():
        r.close()


def test_llama_cpp_alone_gives_the_runners_logits(embedded_model_path, runners):
    tokens = _text_tokens(runners["f16"].tokenizer, 300)
    assert len(tokens) <= CHUNK  # one prefill step on both sides
    raw = RawDecoder(embedded_model_path, TYPES, 512, 2, runners["f16"].repack.repack)
    try:
        for t, runner in runners.items():
            expected = runner.execute([BatchItem(0, tokens, 0, list(range(512)),
                                                 [len(tokens) - 1])])[-1]
            runner.release(0, 0)
            got = raw.prefill(t, tokens)
            assert got.shape == (49152,)
            np.testing.assert_array_equal(got, expected)
        # and the two types differ (q8_0 is not f16 under another name)
        assert not np.array_equal(raw.prefill("f16", tokens), raw.prefill("q8_0", tokens))
    finally:
        raw.close()


def test_raw_decode_times_every_type(embedded_model_path):
    speeds = raw_decode(embedded_model_path, TYPES, list(range(100, 164)), 4, 1, 2, False)
    assert sorted(speeds) == sorted(TYPES)
    assert all(v > 0 for v in speeds.values())
