"""`tandem two-box plan --here` measuring for real: the embedded model on this machine, then
the same figures read back from the store (tests/unit/test_planner.py checks the arithmetic
and the output with fixed figures)."""

from __future__ import annotations

from app.disagg.here import PREFILL_TOKENS, here_device, measure, model_shape


def test_here_measures_once_then_reads_the_cache(embedded_model, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))  # a fresh store for the profiles
    first = measure(embedded_model, threads=1)
    assert (first.cached, first.backend, first.threads, first.prefill_tokens) == (
        False, "llamacpp", 1, PREFILL_TOKENS)
    # a decode step is one token: faster than a 512-token prefill step
    assert 0 < first.decode_step_s < first.prefill_s
    assert len(list((tmp_path / "models" / "profiles").glob("here-*.json"))) == 1
    again = measure(embedded_model, threads=1)
    assert again.cached and (again.decode_step_s, again.prefill_s) == (
        first.decode_step_s, first.prefill_s)
    device = here_device(model_shape(embedded_model, "smollm2-135m-instruct"), again)
    assert device.fp16_tflops > 0 and device.memory_bandwidth_gbs > 0
