"""`app.bench.step_context`: what it asks the runner to compute, and what it reports."""

from app.bench.step_context import POINTS, step_times
from tests.fakes.runner import FakeRunner


def test_each_context_prefilled_on_the_last_then_every_point_rolled_back():
    runner = FakeRunner(num_blocks=256, block_size=4)
    rows = step_times(runner, [600, 300], repeats=1)
    assert [r["context"] for r in rows] == [300, 600]
    assert [(s[0].start_pos, len(s[0].tokens), s[0].logits_indices[-1]) for s in runner.steps] == [
        (0, 256, 255), (256, 44, 43),  # prefill to 300, in chunks
        (300, 1, 0), (300, 2, 1), (300, 4, 3), (300, 8, 7), (300, 16, 15),
        (300, 256, 255), (556, 44, 43),  # then on to 600
        (600, 1, 0), (600, 2, 1), (600, 4, 3), (600, 8, 7), (600, 16, 15)]
    # every timed step rolled back to its context; the slot emptied at the end
    assert runner.calls == ([("truncate", 0, 300)] * 5 + [("truncate", 0, 600)] * 5
                            + [("truncate", 0, 0), ("release", 0, 0)])
    assert all(list(r["t_ms"]) == list(POINTS) and r["ratio"][1] == 1.0 for r in rows)
