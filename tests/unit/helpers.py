"""Shared setup for engine tests over `FakeRunner`: an engine, greedy params, the step plan,
the step-time curve measured on this project's CPU."""

from app.engine.engine import EngineConfig, LLMEngine
from app.engine.scheduler import SchedulerConfig
from app.engine.spec_decode.controller import StepTimeCurve
from app.engine.types import SamplingParams
from tests.fakes.runner import FakeRunner

# the embedded model's step-time profile as `tandem` measured it on this project's CPU
MEASURED_CPU = StepTimeCurve({1: 1.0, 2: 1.918, 3: 2.354, 4: 2.887, 5: 3.762, 6: 4.309,
                              8: 5.292, 16: 9.371})


def make(num_blocks=64, block_size=4, budget=8, max_seqs=4, slots=8):
    runner = FakeRunner(num_blocks=num_blocks, block_size=block_size, max_seqs=slots)
    cfg = EngineConfig(context_length=1024, scheduler=SchedulerConfig(
        max_num_seqs=max_seqs, max_num_batched_tokens=budget))
    return runner, LLMEngine(runner, cfg)


def greedy(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def planned(runner, step=-1):
    """What `runner` was asked to compute in a step: (slot, start_pos, n_tokens, logits_indices)."""
    return [(i.slot, i.start_pos, len(i.tokens), i.logits_indices) for i in runner.steps[step]]


def run_all(engine):
    outs = {}
    while engine.has_work():
        for o in engine.step():
            outs.setdefault(o.request_id, []).extend(o.token_ids)
    return outs
