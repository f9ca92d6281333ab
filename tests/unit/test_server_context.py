"""`ServerContext`'s open streams at shutdown: ended at once, and none opened afterwards."""

import pytest

from app.server.context import ServerContext
from app.server.errors import APIError

SHUTDOWN = {"error": {"message": "The server is shutting down; the reply was cut short.",
                      "type": "server_error", "param": None, "code": "server_shutting_down"}}


class Stream:
    def __init__(self) -> None:
        self.cancelled = False
        self.ended: BaseException | None = None

    def cancel(self) -> None:
        self.cancelled = True

    def end(self, exc: BaseException) -> None:
        self.ended = exc


def test_end_streams_ends_the_open_ones_and_refuses_later_ones() -> None:
    ctx = ServerContext(engine=None, model_name="m")
    done, running, late = Stream(), Stream(), Stream()
    ctx.open([done])
    ctx.open([running])
    ctx.close([done])
    assert ctx.end_streams() == 1
    assert done.ended is None
    assert isinstance(running.ended, APIError)
    assert (running.ended.status, running.ended.body()) == (503, SHUTDOWN)
    with pytest.raises(APIError) as refused:  # a request submitted after that
        ctx.open([late])
    assert (refused.value.status, refused.value.body()) == (503, SHUTDOWN)
    assert late.cancelled and ctx.open_streams == {running}
