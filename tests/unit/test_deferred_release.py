"""A finished request's slot is released after its last output is delivered
(`Scheduler.defer_releases`, set by `AsyncEngine`), and before anything else touches the KV."""

import asyncio
import threading

from app.engine.async_engine import AsyncEngine
from app.engine.engine import EngineConfig, LLMEngine
from app.engine.scheduler import SchedulerConfig
from tests.fakes.runner import FakeRunner
from tests.unit.helpers import greedy, make, planned


def _finish_one(defer: bool):
    runner, eng = make(budget=64)
    eng.scheduler.defer_releases = defer
    eng.add_request("a", [1, 2, 3, 4, 5], greedy(3))
    outs = []
    while eng.has_work():
        outs = eng.step()
    return runner, eng, outs


def test_without_deferral_the_finishing_step_releases_the_slot():
    runner, eng, outs = _finish_one(defer=False)
    assert [(o.finished, o.token_ids) for o in outs] == [(True, [8])]
    assert runner.calls == [("release", 0, 1)]


def test_a_deferred_release_waits_for_release_finished():
    runner, eng, outs = _finish_one(defer=True)
    assert [(o.finished, o.token_ids) for o in outs] == [(True, [8])]
    assert runner.calls == []  # the slot still holds the finished request's KV
    assert eng.scheduler.slots.num_available == 7
    eng.scheduler.release_finished()
    assert runner.calls == [("release", 0, 1)]
    assert eng.scheduler.slots.num_available == 8
    eng.scheduler.release_finished()  # nothing left to release
    assert runner.calls == [("release", 0, 1)]


def test_the_next_step_releases_first_then_admits_into_the_freed_slot():
    runner, eng, _ = _finish_one(defer=True)
    eng.add_request("b", [1, 2, 3, 4, 9], greedy(1))
    eng.step()
    # released (its first block kept), then shared into the same, lowest free slot: b
    # recomputes only its last prompt token
    assert runner.calls == [("release", 0, 1), ("share", 0, [0])]
    assert planned(runner) == [(0, 4, 1, [0])]


def test_deferred_releases_happen_in_finishing_order():
    runner, eng = make(budget=64)
    eng.scheduler.defer_releases = True
    eng.add_request("short", [1, 2, 3], greedy(1))
    eng.add_request("long", [10, 11, 12, 13, 14, 15, 16, 17, 18], greedy(2))
    eng.step()  # both prefilled; short ends
    eng.step()  # long ends
    assert runner.calls == [("release", 0, 0)]  # short's, at the start of the second step
    eng.scheduler.release_finished()
    assert runner.calls == [("release", 0, 0), ("release", 1, 2)]


class _WatchedRunner(FakeRunner):
    """Records, at each release, whether the consumer already had the request's last
    output (it waits up to 2 s for it)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.delivered = threading.Event()
        self.seen_at_release: list[bool] = []

    def release(self, slot, n_keep_blocks):
        self.seen_at_release.append(self.delivered.wait(2.0))
        super().release(slot, n_keep_blocks)


async def test_the_last_output_reaches_the_consumer_before_the_slot_is_released():
    runner = _WatchedRunner(num_blocks=64, block_size=4, max_seqs=8)
    eng = LLMEngine(runner, EngineConfig(context_length=1024, scheduler=SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=64)))
    engine = AsyncEngine(eng, "fake", "fake")
    engine.arrival_gap_s = engine.arrival_window_s = 0.0
    try:
        tokens = []
        async for out in engine.submit([1, 2, 3, 4, 5], greedy(3)):
            tokens += out.token_ids
            if out.finished:
                runner.delivered.set()
        for _ in range(200):  # the step thread releases right after delivering
            if runner.seen_at_release:
                break
            await asyncio.sleep(0.01)
    finally:
        engine.shutdown()
    assert tokens == [6, 7, 8]
    assert runner.seen_at_release == [True]
    assert runner.calls == [("release", 0, 1)]
