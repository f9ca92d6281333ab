"""TCP keepalive on two-box sockets: on, with the module's timings where the platform has
the options."""

import asyncio
import socket

from app.disagg import keepalive


def test_keepalive_options_are_set():
    with socket.socket() as s:
        keepalive.set_keepalive(s)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux
            assert [s.getsockopt(socket.IPPROTO_TCP, o) for o in (
                socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT)] == [15, 5, 3]


async def test_keepalive_on_an_asyncio_transport_socket():
    async def handle(reader, writer):
        keepalive.set_keepalive(writer.get_extra_info("socket"))
        seen.set_result(writer.get_extra_info("socket").getsockopt(socket.SOL_SOCKET,
                                                                    socket.SO_KEEPALIVE))
        writer.close()

    seen = asyncio.get_running_loop().create_future()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        _, w = await asyncio.open_connection(*server.sockets[0].getsockname())
        assert await asyncio.wait_for(seen, 5) == 1
        w.close()
