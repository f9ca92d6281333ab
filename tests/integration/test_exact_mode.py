"""Exact mode on the embedded model (issue 31): every grouping gives bit-identical logits.

Each check runs in its own process, because the exact llama.cpp library is chosen when
llama_cpp is first imported and this test process has loaded the default one:
- the invariance table (`app.bench.invariance --exact`): every row 0.0;
- the comparison suite (`app.bench.exactness --exact`) on 24 generated prompts: every
  prefix-cache hit length (stride 5), speculation fixed:1..8 and wrong drafts, 16 batched,
  two-box chunks, all bit-identical to the reference; the same suite on the default
  settings finds differences (so the suite can fail);
- through the engine (`app.bench.exactness_engine --exact`), greedy and seeded: batched,
  cached and predicted outputs give the reference's tokens and log-probs exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backends.llamacpp.exact import installed

ROOT = Path(__file__).resolve().parents[2]

# install.sh --dev builds it on CPU llama.cpp builds (not Metal or CUDA ones)
pytestmark = pytest.mark.skipif(not installed(),
                                reason="no exact llama.cpp library (install.sh --exact)")


def bench(module: str, *args: str, timeout: float = 900) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_invariance_table_is_all_zero() -> None:
    rows = bench("app.bench.invariance", "--exact", "--prompt-tokens", "96", "--threads", "2")
    assert [r["grouping"] for r in rows] == [
        "96 again (control)", "48 + 48", "48 + 48", "95 + 1", "89 + 7", "8 single tokens + 88",
        "4-token verify step vs 4 one-token steps", "4-token verify step vs 4 one-token steps",
        "8-token verify step vs 8 one-token steps", "8-token verify step vs 8 one-token steps",
        "a decode step alone vs beside 15 sequences"]
    assert {r["max_abs_delta"] for r in rows} == {0.0}
    assert {(r["flash_attn"], r["repack"], r["exact"]) for r in rows} == {("off", "off", True)}


SUITE = ("--prompts", "24", "--generate", "8", "--max-words", "40", "--hit-stride", "5",
         "--threads", "2")
COMPARISONS = ["prefix_hit", *(f"spec_fixed_{k}" for k in range(1, 9)), "spec_wrong_drafts",
               "two_box", "batched"]


def test_every_grouping_is_bit_identical_on_24_prompts() -> None:
    rows = bench("app.bench.exactness", "--exact", *SUITE)
    head, *comparisons, summary = rows
    assert head["prompts"] == 24 and head["exact"] is True
    assert [r["comparison"] for r in comparisons] == COMPARISONS
    for r in comparisons:
        assert (r["comparison"], r["prompts"], r["identical"], r["same_greedy_tokens"],
                r["max_abs_delta"]) == (r["comparison"], 24, 24, 24, 0.0)
    assert summary == {"summary": True, "all_identical": True, "comparisons": 12}


def test_the_suite_finds_the_default_settings_inexact() -> None:
    """The control: flash attention on, the default library. Prefix hits and verify steps
    move logits there (README, "Grouping invariance"), so the suite must say so."""
    rows = bench("app.bench.exactness", *SUITE[:1], "8", *SUITE[2:])
    by_name = {r["comparison"]: r for r in rows if "comparison" in r}
    assert by_name["prefix_hit"]["identical"] < 8
    assert by_name["spec_fixed_4"]["max_abs_delta"] > 0
    assert rows[-1]["all_identical"] is False


def test_engine_gives_the_same_tokens_and_logprobs() -> None:
    rows = bench("app.bench.exactness_engine", "--exact", "--prompts", "24", "--generate", "8",
                 "--max-words", "40", "--threads", "2")
    got = {(r["comparison"], r["sampling"]): (r["prompts"], r["identical"]) for r in rows}
    names = ["batched", "cached", "prediction_fixed_2", "prediction_fixed_5",
             "prediction_fixed_8"]
    assert got == {(n, s): (24, 24) for s in ("greedy", "seeded") for n in names}
    # what makes the comparisons mean something: every prompt of the second pass from the
    # prefix cache (at least its chat template's opening), and drafts both accepted and
    # rejected (a prediction wrong every fourth token)
    for r in rows:
        if r["comparison"] == "cached":
            assert r["cached_tokens"] >= 24 * 10
        if r["comparison"].startswith("prediction"):
            assert r["num_draft_tokens"] >= r["num_accepted_tokens"] > 0
        if r["comparison"] in ("prediction_fixed_5", "prediction_fixed_8"):
            # k = 2 can step over every wrong token; 5 and 8 reach one
            assert r["num_draft_tokens"] > r["num_accepted_tokens"]


def test_two_box_cli_equals_one_box_and_refuses_a_mixed_pair(tmp_path) -> None:
    """`tandem run --exact` with its prompt prefilled by `prefill-worker --exact` prints
    the single box's text; a decode box not in exact mode is refused in the handshake
    (field `exact`) and prefills locally."""
    from app.bench.worker_process import WorkerProcess

    prompt = "Summarize these notes. " + " ".join(
        f"note {i}: crate {i * 7} arrived late at dock {i % 5}." for i in range(12))
    run = [sys.executable, "-m", "app.cli", "run", "--threads", "1", "--temperature", "0",
           "--repetition-penalty", "1", "--max-tokens", "16", prompt]
    worker = WorkerProcess(tmp_path, "--threads", "1", "--ctx-size", "2048", "--exact")
    peer = ["--prefill-peer", f"127.0.0.1:{worker.port}", "--prefill-policy", "always"]
    try:
        one, two, mixed = (subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                          timeout=300)
                           for cmd in (run + ["--exact"], run + ["--exact"] + peer, run + peer))
        log = worker.log()
    finally:
        worker.stop()
    assert one.returncode == two.returncode == mixed.returncode == 0
    assert one.stdout and two.stdout == one.stdout
    assert "prefilled remotely (--prefill-policy always: " in two.stderr
    assert ("tandem: remote prefill failed (fingerprint): exact mode differs: here off, peer "
            "on (run both with --exact, or neither); prefilling locally") in mixed.stderr
    assert log.count("done: ") == 1 and "peer refused: fingerprint: exact" in log
