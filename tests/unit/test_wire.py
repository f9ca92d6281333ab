"""app/disagg/wire.py and handshake.py: golden bytes, and every malformed input refused with
its reason: forged lengths (before any allocation), bad tags, version mismatch, wrong secret,
different model, truncation, garbage."""

from __future__ import annotations

import asyncio
import struct

import numpy as np
import pytest

from app.disagg import handshake as hs
from app.disagg import wire
from app.disagg.wire import FrameType, KVChunk, ProtocolError
from backends.base import Q8_0_BLOCK
from models.fingerprint import ModelFingerprint

KEY = b"k" * 32
K = np.array([1.0, 2.0], np.float16).tobytes()  # 00 3c 00 40
V = np.array([-1.0, -2.0], np.float16).tobytes()  # 00 bc 00 c0
CHUNK = KVChunk(request=7, chunk=1, layer=2, first_pos=16, n_tokens=1, kv_heads=1,
                head_dim=2, k=K, v=V)
# prefix: magic "TDKV", version 2, type 7, flags 0, header 75 bytes, payload 8 bytes
GOLDEN_KV = bytes.fromhex(
    "54444b5602070000" "4b000000" "0800000000000000"
    "88a77265717565737407a56368756e6b01a56c6179657202a966697273745f706f7310a86e5f746f6b656e"
    "7301a56474797065a3663136a86b765f686561647301a8686561645f64696d02"
    "003c0040" "00bc00c0"
    "bfd81021982a39783cb0bcd6c92699f0")
GOLDEN_READY = bytes.fromhex("54444b5602040000" "01000000" "0000000000000000" "80"
                             "6edb57cd205e732bb205d673a49a667b")


def _join(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


# QUEUE {request 7, peers_ahead 1, tokens_ahead 300}: type 10, header 39 bytes, no payload
GOLDEN_QUEUE = bytes.fromhex(
    "54444b56020a0000" "27000000" "0000000000000000"
    "83a77265717565737407ab70656572735f616865616401ac746f6b656e735f6168656164cd012c"
    "d54862d35a9bb98b786c11b4dcf0cdf6")


def test_golden_vectors():
    assert _join(wire.encode_kv(CHUNK, KEY)) == GOLDEN_KV
    assert wire.encode(FrameType.READY, {}, key=KEY) == GOLDEN_READY
    queue = {"request": 7, "peers_ahead": 1, "tokens_ahead": 300}
    assert wire.encode(FrameType.QUEUE, queue, key=KEY) == GOLDEN_QUEUE
    frame, used = wire.decode(GOLDEN_QUEUE, KEY)
    assert (frame.type, frame.header, used) == (FrameType.QUEUE, queue, len(GOLDEN_QUEUE))
    frame, used = wire.decode(GOLDEN_KV + b"next", KEY)
    assert used == len(GOLDEN_KV)
    got = wire.decode_kv(frame)
    assert got.header() == CHUNK.header()
    assert bytes(got.k) == K and bytes(got.v) == V
    assert np.frombuffer(got.v, np.float16).tolist() == [-1.0, -2.0]


# q8_0: one token, one KV head of 32 dims = one llama.cpp block_q8_0 each for K and V (f16 d,
# then 32 int8): K d = 0.5, quants 0..31; V d = -0.25, quants 0, -1, ..., -31. Header 76 bytes
# (dtype "q8_0"), payload 2 x 34 bytes.
GOLDEN_KV_Q8_0 = bytes.fromhex(
    "54444b5602070000" "4c000000" "4400000000000000"
    "88a77265717565737407a56368756e6b01a56c6179657202a966697273745f706f7310a86e5f746f6b656e"
    "7301a56474797065a471385f30a86b765f686561647301a8686561645f64696d20"
    "0038" "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    "00b4" "00fffefdfcfbfaf9f8f7f6f5f4f3f2f1f0efeeedecebeae9e8e7e6e5e4e3e2e1"
    "6cc0d09e99bf0db4223ce473f6fdea77")


def test_golden_q8_0_kv_frame():
    k, v = np.zeros(1, Q8_0_BLOCK), np.zeros(1, Q8_0_BLOCK)
    k["d"], k["qs"], v["d"], v["qs"] = 0.5, np.arange(32), -0.25, -np.arange(32)
    chunk = KVChunk(7, 1, 2, 16, 1, 1, 32, k.tobytes(), v.tobytes(), "q8_0")
    assert _join(wire.encode_kv(chunk, KEY)) == GOLDEN_KV_Q8_0
    got = wire.decode_kv(wire.decode(GOLDEN_KV_Q8_0, KEY)[0])
    assert got.dtype == "q8_0"
    back = np.frombuffer(got.v, Q8_0_BLOCK)
    assert (float(back["d"][0]), back["qs"][0].tolist()) == (-0.25, (-np.arange(32)).tolist())
    with pytest.raises(ProtocolError, match="K and V must be 34 bytes each"):
        wire.encode_kv(KVChunk(7, 1, 2, 16, 1, 1, 32, K, V, "q8_0"), KEY)
    header = {**chunk.header(), "head_dim": 48}  # not whole blocks
    with pytest.raises(ProtocolError, match="q8_0 KV needs kv_heads \\* head_dim divisible "
                                            "by 32, not 48"):
        wire.parse_header(FrameType.KV, wire.msgpack.packb(header), 2 * 51)


def _forge_payload_len(frame: bytes, n: int) -> bytes:
    return frame[:12] + struct.pack("<Q", n) + frame[20:]


async def _read(data: bytes, key=KEY, max_payload=wire.MAX_PAYLOAD_BYTES, eof=True):
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return await wire.read_frame(reader, key, max_payload)


@pytest.mark.parametrize("declared", [7, 9, 0, 2**40])
async def test_forged_payload_length_is_refused_before_reading_it(declared):
    # only the prefix and header arrive and the stream stays open: a reader that trusted
    # the length would wait for (or allocate) the payload instead of refusing
    forged = _forge_payload_len(GOLDEN_KV, declared)[:20 + 75]
    with pytest.raises(ProtocolError) as e:
        await asyncio.wait_for(_read(forged, eof=False), 2)
    assert e.value.code == "length"
    with pytest.raises(ProtocolError, match="implies 8|exceeds"):
        wire.decode(forged, KEY)


async def test_payload_over_the_maximum_frame_size_is_refused():
    with pytest.raises(ProtocolError, match="exceeds 4") as e:
        await _read(GOLDEN_KV[:20], max_payload=4, eof=False)
    assert e.value.code == "length"
    huge_header = GOLDEN_KV[:8] + struct.pack("<I", wire.MAX_HEADER_BYTES + 1) + GOLDEN_KV[12:20]
    with pytest.raises(ProtocolError, match="header of") as e:
        await _read(huge_header, eof=False)
    assert e.value.code == "length"


def test_encoder_refuses_k_of_the_wrong_size():
    bad = KVChunk(7, 1, 2, 16, 2, 1, 2, K, V)  # 2 tokens declared, 1 given
    with pytest.raises(ProtocolError, match="8 bytes each"):
        wire.encode_kv(bad, KEY)


@pytest.mark.parametrize("at", [20, 30, 20 + 75 + 1, len(GOLDEN_KV) - 1])
async def test_flipped_bit_or_wrong_key_fails_the_tag(at):
    corrupt = bytearray(GOLDEN_KV)
    corrupt[at] ^= 0x01
    with pytest.raises(ProtocolError) as e:
        await _read(bytes(corrupt))
    # a flip inside the msgpack header may break its syntax or schema first
    assert e.value.code in (("checksum",) if at >= 95 else ("checksum", "header"))
    with pytest.raises(ProtocolError, match="tag mismatch"):
        await _read(GOLDEN_KV, key=b"other key")


async def test_version_mismatch_is_refused_first():
    v1 = GOLDEN_KV[:4] + b"\x01" + b"\xff" * 40  # the rest is not v2 and is not read
    with pytest.raises(ProtocolError) as e:
        await _read(v1)
    assert (e.value.code, e.value.detail) == ("version", "1")
    assert str(e.value) == "peer speaks protocol 1, this side 2"


@pytest.mark.parametrize("cut", [0, 1, 19, 20, 94, 95, 102, len(GOLDEN_KV) - 1])
async def test_truncated_frames(cut):
    with pytest.raises(ProtocolError) as e:
        await _read(GOLDEN_KV[:cut])
    assert e.value.code == "truncated"
    with pytest.raises(ProtocolError) as e:
        wire.decode(GOLDEN_KV[:cut], KEY)
    assert e.value.code == "truncated"


@pytest.mark.parametrize("data, code", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "magic"),
    (b"TDKV\x02\x63" + bytes(14), "type"),
    (b"TDKV\x02\x04\x01\x00" + bytes(12), "header"),  # unknown flags
])
async def test_garbage_is_refused(data, code):
    with pytest.raises(ProtocolError) as e:
        await _read(data)
    assert e.value.code == code


@pytest.mark.parametrize("header, match", [
    ({"request": 1}, "must have"),
    ({"request": -1, "chunks": 0, "frames": 0, "bytes": 0, "computed": 0, "prefill_us": 0},
     "request must be int"),
    ({"request": True, "chunks": 0, "frames": 0, "bytes": 0, "computed": 0, "prefill_us": 0},
     "request must be int"),
    ({"request": 1, "chunks": 0, "frames": 0, "bytes": 0, "computed": 0, "prefill_us": 0,
      "extra": 1}, "must have"),
])
def test_header_schema(header, match):
    with pytest.raises(ProtocolError, match=match):
        wire.encode(FrameType.DONE, header)
    raw = wire.msgpack.packb(header)
    with pytest.raises(ProtocolError, match=match):
        wire.parse_header(FrameType.DONE, raw, 0)


def test_malformed_msgpack_and_unknown_dtype():
    with pytest.raises(ProtocolError, match="malformed header"):
        wire.parse_header(FrameType.READY, b"\xc1", 0)  # 0xc1 is never used in msgpack
    with pytest.raises(ProtocolError, match="malformed header"):
        wire.parse_header(FrameType.READY, b"\x80\x80", 0)  # trailing data
    header = {**CHUNK.header(), "dtype": "q8"}
    with pytest.raises(ProtocolError, match="unknown KV dtype"):
        wire.parse_header(FrameType.KV, wire.msgpack.packb(header), 8)


# -- handshake over loopback TCP --------------------------------------------------------------

FP = ModelFingerprint("llama", 30, 3, 64, 100000.0, "none", "a" * 64, "b" * 64)


async def _pair(client_secret, server_secret, client_fp=FP, server_fp=FP, hello=None,
                kv_types=("f16", "f16"), exact=(False, False)):
    """Run both sides (`kv_types`, `exact`: the client's and the server's KV cache types and
    exact modes); returns (client result, server result), exceptions as values."""
    done: asyncio.Future = asyncio.get_running_loop().create_future()

    async def serve(reader, writer):
        try:
            done.set_result(await hs.server_handshake(reader, writer, server_secret, server_fp,
                                                      kv_cache_type=kv_types[1],
                                                      exact=exact[1]))
        except Exception as e:
            done.set_result(e)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if hello is not None:  # a raw peer: send bytes, return what comes back
            writer.write(hello)
            await writer.drain()
            client = await wire.read_frame(reader)
        else:
            client = await hs.client_handshake(reader, writer, client_secret, client_fp,
                                               kv_cache_type=kv_types[0], exact=exact[0])
    except Exception as e:
        client = e
    writer.close()
    result = (client, await asyncio.wait_for(done, 5))
    server.close()
    await server.wait_closed()
    return result


async def test_handshake_succeeds_with_one_session_key():
    client, server = await _pair(b"s" * 32, b"s" * 32)
    assert isinstance(client, hs.Session) and isinstance(server, hs.Session)
    assert client.key == server.key and len(client.key) == 32
    assert client.peer == FP


async def test_wrong_secret_fails_on_both_sides():
    client, server = await _pair(b"s" * 32, b"t" * 32)
    assert isinstance(client, ProtocolError) and client.code == "auth"
    assert isinstance(server, ProtocolError) and server.code == "peer"


async def test_kv_cache_types_must_match():
    client, server = await _pair(b"s" * 32, b"s" * 32, kv_types=("q8_0", "q8_0"))
    assert isinstance(client, hs.Session) and client.key == server.key
    client, server = await _pair(b"s" * 32, b"s" * 32, kv_types=("f16", "q8_0"))
    assert (client.code, client.detail, str(client)) == (
        "fingerprint", "kv_cache_type", "KV cache types differ: here f16, peer q8_0 (run both "
        "with the same --kv-cache-type)")
    assert (server.code, server.detail) == ("peer", "fingerprint")
    # an f16 side sends the model's fields alone, as before q8_0 existed (older peers agree)
    assert hs._fingerprint_map(FP, None, "f16", False) == FP.to_dict()
    assert hs._fingerprint_map(FP, 2, "q8_0", False) == {**FP.to_dict(), "threads": 2,
                                                          "kv_cache_type": "q8_0"}


async def test_exact_modes_must_match():
    client, server = await _pair(b"s" * 32, b"s" * 32, exact=(True, True))
    assert isinstance(client, hs.Session) and client.key == server.key
    client, server = await _pair(b"s" * 32, b"s" * 32, exact=(False, True))
    assert (client.code, client.detail, str(client)) == (
        "fingerprint", "exact", "exact mode differs: here off, peer on (run both with "
        "--exact, or neither)")
    assert (server.code, server.detail) == ("peer", "fingerprint")
    client, server = await _pair(b"s" * 32, b"s" * 32, exact=(True, False))
    assert (client.code, client.detail) == ("fingerprint", "exact")
    # a side not in exact mode sends no key (older peers see the handshake as before)
    assert hs._fingerprint_map(FP, None, "f16", True) == {**FP.to_dict(), "exact": True}


async def test_different_model_names_the_field():
    other = ModelFingerprint("llama", 30, 3, 64, 500000.0, "none", "c" * 64, "b" * 64)
    client, server = await _pair(b"s" * 32, b"s" * 32, server_fp=other)
    assert isinstance(client, ProtocolError)
    assert (client.code, client.detail) == ("fingerprint", "rope_base")
    assert "rope_base" in str(client) and "100000.0" in str(client)
    assert isinstance(server, ProtocolError) and server.detail == "fingerprint"


async def test_version_mismatch_and_garbage_get_an_error_frame():
    hello = wire.encode(FrameType.HELLO, {"nonce": b"n" * 32, "fingerprint": FP.to_dict()},
                        version=1)  # a tandem from before the QUEUE frame
    reply, server = await _pair(b"", b"", hello=hello)
    assert reply.type == FrameType.ERROR and reply.header["code"] == "version"
    assert server.code == "version"
    reply, server = await _pair(b"", b"", hello=b"\x16\x03\x01 not a tandem peer.....")
    assert reply.type == FrameType.ERROR and reply.header["code"] == "protocol"
    assert server.code == "magic"


def test_proofs_bind_role_nonces_and_fingerprints():
    fp = FP.to_dict()
    base = hs.proof(b"s", b"client", b"1" * 32, b"2" * 32, fp, fp)
    assert base != hs.proof(b"s", b"server", b"1" * 32, b"2" * 32, fp, fp)
    assert base != hs.proof(b"s", b"client", b"2" * 32, b"1" * 32, fp, fp)
    assert base != hs.proof(b"s", b"client", b"1" * 32, b"2" * 32, fp, {**fp, "n_layers": 31})
    assert hs.session_key(b"s", b"1" * 32, b"2" * 32).hex()[:16] == \
        hs.session_key(b"s", b"1" * 32, b"2" * 32).hex()[:16]


async def test_server_refuses_a_client_that_cannot_prove_the_secret():
    """A client that skips checking the server (or replays an old proof) still fails: the
    server checks the AUTH proof itself."""
    result: asyncio.Future = asyncio.get_running_loop().create_future()

    async def serve(reader, writer):
        try:
            result.set_result(await hs.server_handshake(reader, writer, b"s" * 32, FP))
        except Exception as e:
            result.set_result(e)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.sockets[0].getsockname()[1])
    await wire.write_frame(writer, wire.encode_parts(
        FrameType.HELLO, {"nonce": b"n" * 32, "fingerprint": FP.to_dict()}))
    challenge = await wire.read_frame(reader)
    assert challenge.type == FrameType.CHALLENGE
    forged = hs.proof(b"guess", b"client", b"n" * 32, challenge.header["nonce"],
                      FP.to_dict(), FP.to_dict())
    await wire.write_frame(writer, wire.encode_parts(FrameType.AUTH, {"proof": forged}))
    reply = await wire.read_frame(reader)
    assert reply.type == FrameType.ERROR and reply.header["code"] == "auth"
    err = await asyncio.wait_for(result, 5)
    assert isinstance(err, ProtocolError) and err.code == "auth"
    writer.close()
    server.close()
    await server.wait_closed()
