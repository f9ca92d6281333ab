"""Run a server with `llama_cpp.llama_decode` timed: how far apart its decodes are.

    python -m app.bench.decode_probe OUT.json MODULE [ARGS...]

runs `MODULE.main(ARGS)` (`app.cli` for `tandem serve`, `app.bench.python_floor`) with every
`llama_decode` call timed, and when it stops (SIGTERM: uvicorn shuts down) writes OUT.json:
`{"decodes": n, "decode_us_p50": ..., "gaps": n, "gap_us_p50": ...}`. A gap is the time
from the end of one one-token decode to the start of the one that continues it (same
sequence, next position): at one user, all that the server does per token outside llama.cpp
(sampling, bookkeeping, handing the token to the event loop, and whatever the event loop does
meanwhile while it holds the GIL). Steps of more tokens (prefills, verifications), the gaps
around them and the waits between requests are left out (`DecodeTimes`).
`app.bench.peer_paired --decode-gaps` runs tandem and the Python floor under it.
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from app.bench.stats import median


class DecodeTimes:
    """Durations of decodes and the gaps between consecutive one-token decodes (seconds).

    A gap counts only when the decode continues the previous one: one token each, the same
    sequence, the next position. The wait between two requests (even one whose uncached
    prompt is a single token) is no gap; neither are steps of more tokens, nor the time
    around a failed decode, which is not timed either.
    """

    def __init__(self) -> None:
        self.decodes: list[float] = []
        self.gaps: list[float] = []
        self._last: tuple[int, int, float] | None = None  # (sequence, position, end)

    def wrap(self, decode: Callable[[Any, Any], int]) -> Callable[[Any, Any], int]:
        """`decode(ctx, batch)` timed; `batch` is a `llama_batch` (`n_tokens`, `pos`,
        `seq_id`)."""

        def timed(ctx: Any, batch: Any) -> int:
            one = batch.n_tokens == 1
            here = (batch.seq_id[0][0], batch.pos[0]) if one else None
            last, self._last = self._last, None
            start = time.perf_counter()
            rc = decode(ctx, batch)
            end = time.perf_counter()
            self.decodes.append(end - start)
            if here is not None:
                if last is not None and here == (last[0], last[1] + 1):
                    self.gaps.append(start - last[2])
                self._last = (*here, end)
            return rc

        return timed

    def summary(self) -> dict[str, float | int | None]:
        """Counts and medians in microseconds (None where there is nothing to take one of)."""
        def us(xs: list[float]) -> float | None:
            return median([x * 1e6 for x in xs], 1) if xs else None

        return {"decodes": len(self.decodes), "decode_us_p50": us(self.decodes),
                "gaps": len(self.gaps), "gap_us_p50": us(self.gaps)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, module, args = argv[0], argv[1], argv[2:]
    import llama_cpp

    run = importlib.import_module(module).main
    times = DecodeTimes()
    # the runner and the floor look `llama_decode` up on the module at each call
    llama_cpp.llama_decode = times.wrap(llama_cpp.llama_decode)
    # uvicorn raises the SIGTERM it stopped on again once shut down: exit through `finally`
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        return run(args) or 0
    finally:
        with open(out, "w") as f:
            json.dump(times.summary(), f)


if __name__ == "__main__":
    sys.exit(main())
