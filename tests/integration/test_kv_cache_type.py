"""`--kv-cache-type q8_0 | q4_0` on llama.cpp with the embedded model: the type reaches every
context the runner creates (read back from llama.cpp's own state blobs: their per-layer K/V
type and exact bytes), flash attention is turned on for it, greedy output for a fixed prompt,
the plain-prefill copy of quantized KV, and `tandem run --kv-cache-type` as a user runs it."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backends.base import BatchItem
from backends.llamacpp.runner import LlamaCppRunner

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
GGML_F16, GGML_Q4_0, GGML_Q8_0 = 1, 2, 8


def small_runner(path, kv_cache_type: str, **kw) -> LlamaCppRunner:
    return LlamaCppRunner(path, max_seqs=2, seq_tokens=256, kv_layout="split", n_threads=2,
                          kv_cache_type=kv_cache_type, **kw)


def greedy(runner: LlamaCppRunner, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens after `prompt` in slot 0 (emptied first and after)."""
    runner.release(0, 0)
    table = list(range(len(prompt) + n + 1))
    logits = runner.execute([BatchItem(0, prompt, 0, table, [len(prompt) - 1])])
    out = []
    for pos in range(len(prompt), len(prompt) + n):
        out.append(int(np.argmax(logits[-1])))
        logits = runner.execute([BatchItem(0, [out[-1]], pos, table, [0])])
    runner.release(0, 0)
    return out


def layer_types(blob) -> list[tuple[int, int]]:
    """(K type, V type) of each layer of a one-stream-with-cells llama.cpp state blob
    (V untransposed: flash attention on)."""
    buf = memoryview(blob).cast("B")
    _, _, n_stream = struct.unpack_from("<IiI", buf, 0)
    off = 12
    later = n_stream  # streams after the one with cells: a zero count each
    for _ in range(n_stream):
        (cells,) = struct.unpack_from("<I", buf, off)
        off += 4
        later -= 1
        if cells:
            break
    off += 12 * cells
    v_trans, n_layer = struct.unpack_from("<II", buf, off)
    assert v_trans == 0
    off += 8
    types = []
    for _ in range(2 * n_layer):
        t, row = struct.unpack_from("<iQ", buf, off)
        types.append(t)
        off += 12 + cells * row
    assert off + 4 * later == len(buf)
    return list(zip(types[:n_layer], types[n_layer:], strict=True))


@pytest.fixture(scope="module")
def runners(embedded_model):
    made = {t: small_runner(embedded_model, t) for t in ("f16", "q8_0")}
    yield made
    for r in made.values():
        r.close()


def test_the_type_reaches_llama_cpp(runners):
    """SmolLM2-135M: 30 layers, K/V rows of 3 heads x 64 values: f16 384 bytes, q8_0 6
    blocks of 34 = 204. A sequence of n tokens saves 12 + 8 (two streams) + 8 + 30 x 2 x 12
    header bytes and, per cell, 12 + 30 x 2 x row bytes."""
    f16, q8 = runners["f16"], runners["q8_0"]
    prompt = f16.tokenizer.encode(PROMPT)
    n = len(prompt)
    assert n == 31
    blobs = {}
    for t, r in runners.items():
        r.release(0, 0)
        r.execute([BatchItem(0, prompt, 0, list(range(n)), [])])
        blobs[t] = bytes(r._memory.state_get(0))
        r.release(0, 0)
    assert layer_types(blobs["f16"]) == [(GGML_F16, GGML_F16)] * 30
    assert layer_types(blobs["q8_0"]) == [(GGML_Q8_0, GGML_Q8_0)] * 30
    assert len(blobs["f16"]) == 748 + n * (12 + 30 * 2 * 384) == 715360
    assert len(blobs["q8_0"]) == 748 + n * (12 + 30 * 2 * 204) == 380560
    # what the runner allocated (and serve's start-up line shows): 2 x 256 cells
    assert (f16.kv_bytes, q8.kv_bytes) == (512 * 23040, 512 * 12240) == (11796480, 6266880)
    # a quantized V needs flash attention: "auto" became "on"; f16 left it alone
    assert (f16.flash_attn, f16.flash_attn_forced) == ("auto", False)
    assert (q8.flash_attn, q8.flash_attn_forced) == ("on", True)
    # KV transfer (two-box mode) carries f16 and q8_0, not q4_0 (test_q4_0_rows)
    assert (f16.capabilities.kv_transfer, q8.capabilities.kv_transfer) == (True, True)


def test_q4_0_rows(embedded_model):
    r = small_runner(embedded_model, "q4_0")
    try:
        prompt = r.tokenizer.encode(PROMPT)
        r.execute([BatchItem(0, prompt, 0, list(range(len(prompt))), [])])
        blob = r._memory.state_get(0)
        assert layer_types(blob) == [(GGML_Q4_0, GGML_Q4_0)] * 30
        assert len(blob) == 748 + 31 * (12 + 30 * 2 * 108)  # 6 blocks of 18 bytes a row
        assert r.kv_bytes == 512 * 6480
        assert r.capabilities.kv_transfer is False
        with pytest.raises(ValueError, match="^KV transfer takes an f16 or q8_0 KV cache; "
                                             "this runner's is q4_0$"):
            r.export_kv(0, [0], 0, 1)
    finally:
        r.close()


def test_q8_0_greedy_output_for_a_fixed_prompt(runners):
    """q8_0's greedy continuation of the fixed prompt, exact; on this prompt it equals
    f16's (q4_0's differs from the fifth token: 'The quick brown fox is not a dog.')."""
    prompt = runners["f16"].tokenizer.encode(PROMPT)
    out = {t: r.tokenizer.decode(greedy(r, prompt, 10)) for t, r in runners.items()}
    assert out["q8_0"] == "\nThe quick brown fox jumps over the lazy dog"
    assert out["q8_0"] == out["f16"]


def test_flash_attention_off_is_refused_before_loading(embedded_model):
    with pytest.raises(ValueError) as err:
        small_runner(embedded_model, "q8_0", flash_attn="off")
    assert str(err.value) == ("--kv-cache-type q8_0 needs flash attention (llama.cpp "
                              "quantizes the V cache only with it), which is off")


def test_plain_prefill_copies_quantized_kv_into_the_slot(repacking_model):
    """Repacked weights send prefill chunks to a plain-weights context whose KV is copied
    into the slot as is: it must be q8_0 too. The slot then holds the bytes a runner that
    never repacked computes."""
    on, off = (LlamaCppRunner(repacking_model, max_seqs=2, seq_tokens=256, kv_layout="split",
                              n_threads=2, kv_cache_type="q8_0", repack=mode)
               for mode in ("on", "off"))
    try:
        assert on.plain_prefill is not None and off.plain_prefill is None
        prompt = on.tokenizer.encode(PROMPT * 3)[:120]
        for r in (on, off):
            r.execute([BatchItem(1, prompt, 0, list(range(120)), [])])
        assert on.plain_prefill.chunks == 1
        blob = on._memory.state_get(1)
        assert layer_types(blob) == [(GGML_Q8_0, GGML_Q8_0)] * 30
        assert bytes(blob) == bytes(off._memory.state_get(1))
    finally:
        on.close()
        off.close()


def test_tandem_run_with_q8_0(embedded_model):
    """As a user runs it: the note on stderr, the greedy reply on stdout."""
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "run", "--model", str(embedded_model),
         "--kv-cache-type", "q8_0", "--max-tokens", "12", "--temperature", "0", "--spec",
         "off", "--threads", "1", "What is the capital of France?"],
        cwd=ROOT, text=True, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == ("tandem: note: --kv-cache-type q8_0 needs flash "
                                        "attention for its V cache; turned it on")
    assert r.stdout == "L'Étoile, la Marseillaise,\n"  # as f16 (SmolLM2-135M's answer)


def test_serve_start_up_lines(embedded_model):
    """`tandem serve --kv-cache-type q8_0`: the KV line in the type's bytes (4 x 8192 tokens
    of SmolLM2: 0.37 GiB in q8_0, 0.70 GiB in f16) and the flash attention note."""
    from app.bench.server_process import free_port
    from backends.llamacpp.kv_plan import kv_budget_bytes
    from backends.llamacpp.runtime import physical_memory_bytes

    budget = kv_budget_bytes(physical_memory_bytes()) / 2**30
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--model", str(embedded_model), "--port",
         str(free_port()), "--spec", "off", "--threads", "1", "--max-concurrency", "4",
         "--kv-cache-type", "q8_0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:
            if line.startswith("tandem: serving "):
                break
            lines.append(line.rstrip("\n"))
        assert lines[0] == ("tandem: split KV (q8_0): 4 sequences x 8192 tokens, 0.4 GiB "
                            f"(budget {budget:.1f} GiB, 1/8 of memory)")
        assert 4 * 8192 * 12240 / 2**30 == pytest.approx(0.3735, abs=1e-4)
    finally:
        proc.kill()
        stderr = proc.stderr.read()
        proc.wait()
    assert stderr.splitlines()[0] == ("tandem: note: --kv-cache-type q8_0 needs flash "
                                      "attention for its V cache; turned it on")
