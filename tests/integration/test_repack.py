"""Repacked weights (backends/llamacpp/repack.py): used where the probe passes, refused with
one line where it fails, and exact either way.

The embedded model's Q4_1 has no repacked kernels, so these tests run its Q4_0 requantization
(`repacking_model`), whose matmuls take the repacked GEMM (4 or more rows) and GEMV paths.
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from app.engine.config import EngineConfig, SchedulerConfig
from app.engine.engine import LLMEngine
from app.engine.types import SamplingParams
from app.prompts import chat_prompt_ids
from backends.llamacpp import repack
from backends.llamacpp.runner import LlamaCppRunner
from tests.integration.test_spec_model import edit_prompt, generate

SIGILL_PROBE = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]


@pytest.fixture
def probe_store(tmp_path, monkeypatch):
    """A model store of its own, so the probe verdicts start uncached."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    return tmp_path / "models" / "probes"


def small_runner(path, **kw) -> LlamaCppRunner:
    return LlamaCppRunner(path, max_seqs=2, seq_tokens=256, kv_layout="split", n_threads=2,
                          **kw)


def test_runner_repacks_where_the_probe_passes(repacking_model, probe_store, caplog):
    with caplog.at_level(logging.WARNING, logger="tandem"):
        runner = small_runner(repacking_model)
    try:
        assert runner.repack == repack.RepackVerdict(
            True, "probe passed (CPU_REPACK)", cached=False,
            weight_buffers={"CPU_Mapped": 85.3, "CPU_REPACK": 56.95})
        assert runner.weight_buffers == {"CPU_Mapped": 85.3, "CPU_REPACK": 56.95}
    finally:
        runner.close()
    assert caplog.records == []
    assert len(list(probe_store.glob("repack-*.json"))) == 1
    again = repack.repack_verdict(repacking_model)
    assert (again.repack, again.cached) == (True, True)


def test_a_failing_probe_loads_without_repacking_and_says_so(repacking_model, probe_store,
                                                             monkeypatch, caplog):
    monkeypatch.setattr(repack, "probe_command", lambda path: SIGILL_PROBE)
    line = ("tandem: repacked weights off for smollm2-135m-q4_0.gguf: the probe died with "
            "SIGILL (Illegal instruction); loading without them (slower decode)")
    with caplog.at_level(logging.WARNING, logger="tandem"):
        runner = small_runner(repacking_model)
    try:
        assert runner.repack == repack.RepackVerdict(
            False, "the probe died with SIGILL (Illegal instruction)")
        assert runner.weight_buffers == {"CPU_Mapped": 85.77}
    finally:
        runner.close()
    assert [r.getMessage() for r in caplog.records] == [line]
    # cached: the next load does not probe again, and says it again
    caplog.clear()
    monkeypatch.setattr(repack, "probe_command", lambda path: pytest.fail("probed twice"))
    with caplog.at_level(logging.WARNING, logger="tandem"):
        verdict = repack.repack_verdict(repacking_model)
    assert (verdict.repack, verdict.cached) == (False, True)
    assert [r.getMessage() for r in caplog.records] == [line]


def test_explicit_modes_skip_the_probe(repacking_model, probe_store, monkeypatch):
    monkeypatch.setattr(repack, "probe_command", lambda path: pytest.fail("probed"))
    off = small_runner(repacking_model, repack="off")
    try:
        assert off.weight_buffers == {"CPU_Mapped": 85.77}
        assert off.repack == repack.RepackVerdict(False, "--repack off")
    finally:
        off.close()
    with pytest.raises(ValueError, match="repack must be one of auto, on, off, not 'yes'"):
        repack.repack_verdict(repacking_model, "yes")
    assert not probe_store.exists()


# -- exactness with repacked weights ------------------------------------------------------


@pytest.fixture(scope="module")
def repacked_runner(repacking_model):
    r = LlamaCppRunner(repacking_model, max_seqs=16, seq_tokens=512, kv_layout="split",
                       n_threads=2, flash_attn="on", repack="on")
    assert "CPU_REPACK" in r.weight_buffers
    yield r
    r.close()


TOPICS = ["the sea", "a red fox", "winter", "bread", "a clock", "rain", "mountains", "a cat",
          "the moon", "coffee", "trains", "a garden", "snow", "a library", "the wind", "fire"]


def test_sixteen_concurrent_greedy_equal_each_alone_with_repacked_weights(repacked_runner):
    """16 rows take the repacked GEMM kernels, one row the GEMV ones: same tokens."""
    prompts = [chat_prompt_ids(repacked_runner.tokenizer, [
        {"role": "user", "content": f"Write a short poem about {t}."}]) for t in TOPICS]
    params = [SamplingParams(temperature=0, max_tokens=96)] * len(prompts)
    together, _, _ = generate(repacked_runner, prompts, params, None, max_seqs=16)
    alone = [generate(repacked_runner, [p], [params[0]], None)[0][0] for p in prompts]
    assert together == alone
    assert sum(map(len, together)) > 16 * 40  # real replies, not early stops


def test_a_prompt_from_the_prefix_cache_equals_it_computed(repacking_model):
    """With prefill on the plain weights, a repeated prompt restored from the prefix cache
    (all but its last token) gives the tokens it gave computed cold: the last prompt token
    is computed on the repacked weights either way. A runner of its own: saved prefixes
    are keyed by the block ids of the engine that made them."""
    repacked_runner = LlamaCppRunner(repacking_model, max_seqs=4, seq_tokens=512,
                                     kv_layout="split", n_threads=2, flash_attn="on",
                                     repack="on")
    try:
        _cache_hit_equals_cold(repacked_runner)
    finally:
        repacked_runner.close()


def _cache_hit_equals_cold(repacked_runner) -> None:
    prompts = [edit_prompt(repacked_runner, "Rename the variable subtotal to net in this code."),
               edit_prompt(repacked_runner, "Add a docstring to this function.")]
    assert min(map(len, prompts)) >= 32
    engine = LLMEngine(repacked_runner, EngineConfig(
        context_length=512, scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512)))

    def run(tag: str) -> list[list[int]]:
        out: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            engine.add_request(f"{tag}{i}", p, SamplingParams(temperature=0, max_tokens=64))
        while engine.has_work():
            for o in engine.step():
                out.setdefault(o.request_id, []).extend(o.token_ids)
        return [out[f"{tag}{i}"] for i in range(len(prompts))]

    before = repacked_runner.plain_prefill.chunks
    cold = run("cold")
    chunks = repacked_runner.plain_prefill.chunks
    warm = run("warm")
    assert warm == cold
    assert chunks - before == 2  # one chunk per prompt, its last token excepted
    assert repacked_runner.plain_prefill.chunks == chunks  # warm: from the prefix cache


# -- prefill on the plain weights (backends/llamacpp/plain_prefill.py) ---------------------


@pytest.fixture(scope="module")
def repacked_and_plain(repacking_model):
    """The Q4_0 model twice: repacked (with its plain prefill path) and plain."""
    runners = [LlamaCppRunner(repacking_model, max_seqs=2, seq_tokens=1024, kv_layout="split",
                              n_threads=2, flash_attn="on", repack=mode)
               for mode in ("on", "off")]
    yield runners
    for r in runners:
        r.close()


def _item(slot, tokens, start, logits=True):
    from backends.base import BatchItem

    return BatchItem(slot, tokens, start, list(range(start + len(tokens))),
                     [len(tokens) - 1] if logits else [])


def _same_kv(runners, slot, n):
    kv_on, kv_off = (r.export_kv(slot, list(range(n)), 0, n) for r in runners)
    for (k1, v1), (k2, v2) in zip(kv_on, kv_off, strict=True):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(v1, v2)


def test_large_prefill_chunks_run_on_the_plain_weights(repacked_and_plain):
    """A repacked runner computes chunks of 32+ tokens on the plain weights (the same KV in
    the slot as a runner that never repacked), except a prompt's last token, which it
    computes on the repacked weights like a decode."""
    on, off = repacked_and_plain
    assert on.plain_prefill is not None and off.plain_prefill is None
    text = " ".join(f"{t} is a word about {t}." for t in TOPICS) * 3
    prompt = on.tokenizer.encode(text)[:300]
    for r in (on, off):
        r.release(0, 0)
        r.release(1, 0)
    # a middle chunk, then the last one, which continues in the plain context
    for r in (on, off):
        assert r.execute([_item(0, prompt[:200], 0, logits=False)]).shape == (0, r.info.n_vocab)
    last = [r.execute([_item(0, prompt[200:], 200)]) for r in (on, off)]
    assert on.plain_prefill.chunks == 2
    _same_kv((on, off), 0, 299)
    assert not np.array_equal(last[0], last[1])  # position 299: repacked against plain
    # the last token alone on the repacked weights gives the same logits: as after a
    # prefix-cache hit that leaves one token to compute
    on.truncate(0, 299)
    again = on.execute([_item(0, prompt[299:], 299)])
    np.testing.assert_array_equal(again, last[0])
    # one step: slot 1's prompt on the plain weights beside slot 0's decode
    nxt = int(last[0][-1].argmax())
    mixed = [r.execute([_item(0, [nxt], 300), _item(1, prompt[:120], 0)]) for r in (on, off)]
    assert mixed[0].shape == (2, on.info.n_vocab)
    assert on.plain_prefill.chunks == 3
    _same_kv((on, off), 1, 119)
    # a short chunk stays on the repacked weights
    on.execute([_item(1, prompt[120:150], 120)])
    assert on.plain_prefill.chunks == 3
