"""`MLXThread`: one private thread for MLX work, whose streams are destroyed before it ends.

MLX streams are thread-local since mlx 0.31.2 (ml-explore/mlx-lm#1181), so a model must run
on the thread that loaded it. Since mlx 0.32 a thread that used MLX must call
`mx.clear_streams()` before it ends (ml-explore/mlx#4327, maintainers' answer): left to the
thread-local destructors, the cleanup can race the interpreter's finalisation and abort the
process with "terminate called without an active exception" after a successful run
(Blaizzy/mlx-vlm#1945; seen here in about 1 of 20 `tandem run` exits).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def _clear_streams() -> None:
    import mlx.core as mx

    mx.clear_streams()


class MLXThread:
    """A single worker thread; `call` runs a function on it and returns its result (or raises
    its exception); `close` clears the thread's MLX streams, then joins it. Idempotent."""

    def __init__(self, name: str = "tandem-mlx") -> None:
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name)

    def call(self, fn: Callable[..., T], *args) -> T:
        """`fn(*args)` on the thread. Raises RuntimeError once closed."""
        if self._pool is None:
            raise RuntimeError("the MLX thread is closed")
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        try:
            pool.submit(_clear_streams).result()
        finally:
            pool.shutdown(wait=True)


def run_on_mlx_thread(fn: Callable[..., T], *args) -> T:
    """`fn(*args)` on a fresh `MLXThread`, closed afterwards (for one-off work such as a
    conversion, so the caller's thread never holds MLX streams)."""
    thread = MLXThread()
    try:
        return thread.call(fn, *args)
    finally:
        thread.close()
