"""`tandem run`: the model's recommended sampling settings unless a flag says otherwise, and
the stats line on stderr starts on its own line (issue 14.4)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from app.commands import run as run_cmd
from app.commands.sampling_flags import add_sampling_args, sampling_values
from app.engine.async_engine import AsyncEngine
from app.engine.engine import EngineConfig, LLMEngine
from tests.fakes.runner import ScriptedRunner


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m-instruct")
    add_sampling_args(p)
    return p.parse_args(list(argv))


def test_flags_override_the_models_recommended_settings():
    assert sampling_values(_args()) == {"temperature": 0.2, "top_p": 0.9, "top_k": 0,
                                        "min_p": 0.0, "repetition_penalty": 1.05,
                                        "repeat_last_n": 64}
    assert sampling_values(_args("--temperature", "0", "--repetition-penalty", "1",
                                 "--repeat-last-n", "-1")) == {
        "temperature": 0.0, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
        "repeat_last_n": -1}
    assert sampling_values(_args("--model", "other.gguf")) == {
        "temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.0,
        "repeat_last_n": 64}


def test_repeat_last_n_below_minus_one_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        _args("--repeat-last-n", "-2")
    assert "argument --repeat-last-n: expected an integer >= -1, got '-2'" in (
        capsys.readouterr().err)


@pytest.mark.parametrize(("reply", "stdout"), [("Paris.", "Paris.\n"), ("Paris.\n", "Paris.\n")])
def test_stats_line_starts_on_its_own_line(monkeypatch, capsys, reply, stdout):
    runner = ScriptedRunner([reply], name="fake")
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(context_length=512)), "fake", "fake")
    monkeypatch.setattr(run_cmd, "load_engine", lambda *a, **k: engine)
    args = _args("--model", "fake.gguf", "--temperature", "0")
    args.raw, args.system = True, None
    assert asyncio.run(run_cmd._run(args, "hi")) == 0
    out = capsys.readouterr()
    assert out.out == stdout  # one newline after the reply, never a blank line
    assert out.err.startswith("TTFT ")
