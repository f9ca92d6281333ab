"""`AsyncEngine` over the fake runner: arrivals at an idle engine are prefilled together."""

import asyncio
import time

from app.engine.async_engine import AsyncEngine
from tests.unit.helpers import greedy, make, planned


async def _run(engine: AsyncEngine, prompts: list[list[int]], apart_s: float) -> list[list[int]]:
    streams = []
    for p in prompts:
        streams.append(engine.submit(p, greedy(2)))
        await asyncio.sleep(apart_s)  # long enough for the step thread to wake

    async def tokens(stream) -> list[int]:
        return [t async for out in stream for t in out.token_ids]

    return await asyncio.gather(*(tokens(s) for s in streams))


async def test_requests_arriving_together_share_the_first_step():
    runner, eng = make(budget=64)
    engine = AsyncEngine(eng, "fake", "fake")
    engine.arrival_gap_s, engine.arrival_window_s = 0.5, 2.0  # generous for loaded machines
    try:
        outs = await _run(engine, [[1, 2, 3], [10, 11, 12, 13], [20, 21]], apart_s=0.02)
    finally:
        engine.shutdown()
    assert outs == [[4, 5], [14, 15], [22, 23]]
    # one prefill step with all three prompts, then one decode step with all three
    assert planned(runner, 0) == [(0, 0, 3, [2]), (1, 0, 4, [3]), (2, 0, 2, [1])]
    assert planned(runner, 1) == [(0, 3, 1, [0]), (1, 4, 1, [0]), (2, 2, 1, [0])]
    assert len(runner.steps) == 2



async def test_a_cancellation_ends_the_arrival_wait():
    runner, eng = make(budget=64)
    engine = AsyncEngine(eng, "fake", "fake")
    engine.arrival_gap_s, engine.arrival_window_s = 2.0, 10.0  # without the early end: >= 2 s
    loop = asyncio.get_running_loop()
    try:
        kept = engine.submit([1, 2, 3], greedy(2))
        dropped = engine.submit([10, 11], greedy(2))
        start = loop.time()
        dropped.cancel()
        ends = [out async for out in dropped]
        waited = loop.time() - start
        tokens = [t async for out in kept for t in out.token_ids]
    finally:
        engine.shutdown()
    assert [(o.finish_reason, o.token_ids) for o in ends] == [("abort", [])]
    assert waited < 1.0
    assert tokens == [4, 5]
    assert planned(runner, 0) == [(0, 0, 3, [2])]


async def test_a_busy_consumer_holds_the_engine_one_step_ahead_at_most():
    runner, eng = make(budget=64)
    engine = AsyncEngine(eng, "fake", "fake")
    engine.arrival_gap_s = engine.arrival_window_s = 0.0
    engine.consumer_wait_s = 30.0  # far longer than the test: the wait must end on delivery
    try:
        stream = engine.submit([1, 2, 3], greedy(6))
        await asyncio.sleep(0.3)  # the loop is free: the whole request runs
        assert len(runner.steps) == 6
        first = [out.token_ids async for out in stream]
        assert first == [[4], [5], [6], [7], [8], [9]]

        stream = engine.submit([20, 21], greedy(6))
        await asyncio.sleep(0)  # the submit reaches the step thread; then block the loop
        time.sleep(0.5)  # nobody handles outputs: step 1's are posted, step 2's wait
        assert len(runner.steps) == 8  # 6 before, then 2 steps of this request
        tokens = [t async for out in stream for t in out.token_ids]
        await asyncio.sleep(0.1)
    finally:
        engine.shutdown()
    assert tokens == [22, 23, 24, 25, 26, 27]
    assert len(runner.steps) == 12


async def test_outputs_of_several_streams_are_handled_before_the_next_step():
    runner, eng = make(budget=64)
    engine = AsyncEngine(eng, "fake", "fake")
    engine.arrival_gap_s, engine.arrival_window_s = 0.2, 1.0  # both start in one step
    engine.consumer_wait_s = 30.0
    try:
        streams = [engine.submit([1, 2, 3], greedy(4)), engine.submit([20, 21], greedy(4))]
        await asyncio.sleep(0)
        time.sleep(1.5)  # nobody handles outputs: the first step's block the second
        assert len(runner.steps) == 1
        tokens = [[t async for out in s for t in out.token_ids] for s in streams]
        await asyncio.sleep(0.1)  # the loop marks the last outputs handled
    finally:
        engine.shutdown()
    assert tokens == [[4, 5, 6, 7], [22, 23, 24, 25]]
    assert len(runner.steps) == 4


async def test_end_reaches_the_consumer_while_a_step_computes():
    # the server's shutdown ends streams this way: a long step (a prefill chunk) must not
    # hold back their error events; the request is aborted once the step is over
    from app.engine.engine import EngineConfig, LLMEngine
    from app.engine.scheduler import SchedulerConfig
    from tests.fakes.runner import ScriptedRunner

    runner = ScriptedRunner(default="a long reply, long enough", max_seqs=2)
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(
        context_length=256, scheduler=SchedulerConfig(max_num_seqs=2))), "fake", "fake")
    runner.hold(after_tokens=1)
    try:
        stream = engine.submit([1, 2, 3], greedy(20))
        first = await anext(stream)
        assert await asyncio.to_thread(runner.holding.wait, 30)  # the next step is held
        stream.end(ConnectionAbortedError("shutting down"))
        try:
            await asyncio.wait_for(anext(stream), 30)
        except ConnectionAbortedError as exc:
            ended = str(exc)
        assert engine.stats().running == 1  # the held step still runs the request
        runner.release()
        for _ in range(600):  # the abort is applied after the held step
            if engine.stats().running == 0 and not engine.engine.requests:
                break
            await asyncio.sleep(0.05)
    finally:
        runner.release()
        engine.shutdown()
    assert (len(first.token_ids), ended) == (1, "shutting down")
    assert (engine.stats().running, engine.stats().kv_blocks_used) == (0, 0)
    assert [out async for out in stream] == []  # ended: nothing more comes
