"""The two-box wire codec: length-prefixed, tagged frames (spec: docs/two-box.md).

Frame = prefix | header | payload | tag:
    prefix  20 bytes, little-endian `<4sBBHIQ`: magic b"TDKV", version u8, type u8,
            flags u16 (0), header_len u32, payload_len u64
    header  header_len bytes: one msgpack map (never pickle), fields fixed per type
    payload payload_len bytes: raw; only KV frames have one (K bytes then V bytes)
    tag     16 bytes: HMAC-SHA256(key, prefix | header | payload) truncated; key b"" during
            the handshake, the session key after it (`handshake.session_key`)

Every length is checked before anything of that size is allocated: the header against
`MAX_HEADER_BYTES`, the payload against the size the header implies (KV: 2 * n_tokens *
kv_heads * head_dim * 2 bytes for f16, 34 bytes per 32 values for q8_0; other types 0) and
against `max_payload`. Errors raise `ProtocolError` whose `code` names the reason (for
fallback counters).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgpack

from backends.base import KV_TRANSFER_DTYPES, kv_row_bytes

MAGIC = b"TDKV"
PROTOCOL_VERSION = 2  # 2: the QUEUE frame and q8_0 KV (docs/two-box.md, "Versions")
PREFIX = struct.Struct("<4sBBHIQ")  # magic, version, type, flags, header_len, payload_len
TAG_BYTES = 16
MAX_HEADER_BYTES = 1 << 20  # a PREFILL header carries the token ids (<= 5 bytes each)
MAX_PAYLOAD_BYTES = 64 << 20  # default KV frame limit: 8x Llama-3-8B's 2K-token layer


class FrameType(IntEnum):
    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    READY = 4
    ERROR = 5
    PREFILL = 6
    KV = 7
    DONE = 8
    CANCEL = 9
    QUEUE = 10


_INT, _STR, _BIN, _MAP, _INTS = "int", "str", "bin", "map", "ints"
# header fields per frame type, in encoding order (the msgpack map keeps this order)
SCHEMAS: dict[FrameType, dict[str, str]] = {
    FrameType.HELLO: {"nonce": _BIN, "fingerprint": _MAP},
    FrameType.CHALLENGE: {"nonce": _BIN, "fingerprint": _MAP, "proof": _BIN},
    FrameType.AUTH: {"proof": _BIN},
    FrameType.READY: {},
    FrameType.ERROR: {"code": _STR, "message": _STR},
    FrameType.PREFILL: {"request": _INT, "start": _INT, "tokens": _INTS, "chunk_tokens": _INT},
    FrameType.KV: {"request": _INT, "chunk": _INT, "layer": _INT, "first_pos": _INT,
                   "n_tokens": _INT, "dtype": _STR, "kv_heads": _INT, "head_dim": _INT},
    FrameType.DONE: {"request": _INT, "chunks": _INT, "frames": _INT, "bytes": _INT,
                     "computed": _INT, "prefill_us": _INT},
    FrameType.CANCEL: {"request": _INT},
    FrameType.QUEUE: {"request": _INT, "peers_ahead": _INT, "tokens_ahead": _INT},
}


class ProtocolError(Exception):
    """A frame or handshake the peer must not be trusted with. `code`: "magic", "version",
    "type", "length", "header", "checksum", "truncated", "auth", "fingerprint" or "peer"
    (the peer sent ERROR). `detail`: e.g. the differing fingerprint field."""

    def __init__(self, code: str, message: str, detail: str | None = None):
        super().__init__(message)
        self.code, self.detail = code, detail


@dataclass(slots=True)
class Frame:
    """A decoded frame: its type, header fields and (KV only) payload bytes."""

    type: FrameType
    header: dict[str, Any]
    payload: bytes | bytearray | memoryview = b""
    version: int = PROTOCOL_VERSION


@dataclass(slots=True)
class KVChunk:
    """One (chunk, layer) of KV in the neutral layout. k, v: `[n_tokens, kv_heads, head_dim]`
    f16 as raw little-endian bytes (numpy `.view(np.float16).reshape(...)` reads them), or
    with `dtype` "q8_0" `[n_tokens, kv_heads * head_dim / 32]` blocks of llama.cpp's
    block_q8_0 (`backends.base.Q8_0_BLOCK`; docs/two-box.md)."""

    request: int
    chunk: int
    layer: int
    first_pos: int
    n_tokens: int
    kv_heads: int
    head_dim: int
    k: bytes | bytearray | memoryview = field(repr=False)
    v: bytes | bytearray | memoryview = field(repr=False)
    dtype: str = "f16"

    def header(self) -> dict[str, Any]:
        return {"request": self.request, "chunk": self.chunk, "layer": self.layer,
                "first_pos": self.first_pos, "n_tokens": self.n_tokens, "dtype": self.dtype,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim}


def kv_payload_bytes(header: dict[str, Any]) -> int:
    """Payload size a KV header implies: K and V, `n_tokens * kv_heads * head_dim` values
    each (`backends.base.kv_row_bytes`). Raises ProtocolError("header") for an unknown
    dtype, or a q8_0 row that is not whole blocks."""
    if header["dtype"] not in KV_TRANSFER_DTYPES:
        raise ProtocolError("header", f"unknown KV dtype {header['dtype']!r}")
    try:
        row = kv_row_bytes(header["dtype"], header["kv_heads"] * header["head_dim"])
    except ValueError as e:
        raise ProtocolError("header", str(e)) from None
    return 2 * header["n_tokens"] * row


def _tag(key: bytes, parts: list) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        mac.update(p)
    return mac.digest()[:TAG_BYTES]


def encode_parts(ftype: FrameType, header: dict[str, Any], payload: list | tuple = (),
                 key: bytes = b"", version: int = PROTOCOL_VERSION) -> list:
    """A frame as buffers for `writer.writelines` (payload buffers are not copied).
    `payload`: buffers concatenated as the payload. Raises ProtocolError("header") if the
    header does not fit its schema."""
    _check_header(ftype, header)
    hdr = msgpack.packb(header, use_bin_type=True)
    n = sum(memoryview(p).nbytes for p in payload)
    prefix = PREFIX.pack(MAGIC, version, int(ftype), 0, len(hdr), n)
    parts = [prefix, hdr, *payload]
    return [*parts, _tag(key, parts)]


def encode(ftype: FrameType, header: dict[str, Any], payload: list | tuple = (),
           key: bytes = b"", version: int = PROTOCOL_VERSION) -> bytes:
    """A frame as one bytes object (see `encode_parts`)."""
    return b"".join(bytes(p) for p in encode_parts(ftype, header, payload, key, version))


def encode_kv(chunk: KVChunk, key: bytes) -> list:
    """A KV frame's buffers. Raises ProtocolError("length") if K or V is not the size the
    header implies."""
    want = kv_payload_bytes(chunk.header()) // 2
    if memoryview(chunk.k).nbytes != want or memoryview(chunk.v).nbytes != want:
        raise ProtocolError("length", f"K and V must be {want} bytes each")
    return encode_parts(FrameType.KV, chunk.header(), [chunk.k, chunk.v], key)


def decode_kv(frame: Frame) -> KVChunk:
    """The KVChunk of a decoded KV frame (K and V are views into its payload)."""
    h, m = frame.header, memoryview(frame.payload)
    half = len(m) // 2
    return KVChunk(h["request"], h["chunk"], h["layer"], h["first_pos"], h["n_tokens"],
                   h["kv_heads"], h["head_dim"], m[:half], m[half:], h["dtype"])


def parse_prefix(prefix: bytes, max_payload: int = MAX_PAYLOAD_BYTES
                 ) -> tuple[FrameType, int, int]:
    """(type, header_len, payload_len) of a 20-byte prefix. Checks magic, then version (a
    peer of another version is refused before anything else is read), type, flags and the
    size limits. Raises ProtocolError."""
    magic, version, ftype, flags, hlen, plen = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError("magic", f"not a tandem two-box peer (magic {magic!r})")
    if version != PROTOCOL_VERSION:
        raise ProtocolError("version", f"peer speaks protocol {version}, this side "
                            f"{PROTOCOL_VERSION}", detail=str(version))
    try:
        ftype = FrameType(ftype)
    except ValueError:
        raise ProtocolError("type", f"unknown frame type {ftype}") from None
    if flags:
        raise ProtocolError("header", f"unknown flags {flags:#x}")
    if hlen > MAX_HEADER_BYTES:
        raise ProtocolError("length", f"header of {hlen} bytes exceeds {MAX_HEADER_BYTES}")
    if plen > max_payload:
        raise ProtocolError("length", f"payload of {plen} bytes exceeds {max_payload}")
    return ftype, hlen, plen


def _no_ext(code, data):
    raise ValueError("msgpack ext types are not allowed")


def parse_header(ftype: FrameType, raw: bytes, payload_len: int) -> dict[str, Any]:
    """Decode and validate a header; check `payload_len` equals the size it implies.
    Raises ProtocolError("header") or ("length")."""
    try:
        # unpackb bounds every container by the input's length: no allocation beyond it
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # its malformed-input errors
        raise ProtocolError("header", f"malformed header: {e}") from None
    _check_header(ftype, header)
    want = kv_payload_bytes(header) if ftype == FrameType.KV else 0
    if payload_len != want:
        raise ProtocolError("length", f"{ftype.name} frame declares a {payload_len}-byte "
                            f"payload, its header implies {want}")
    return header


def _check_header(ftype: FrameType, header: Any) -> None:
    schema = SCHEMAS[ftype]
    if not isinstance(header, dict) or set(header) != set(schema):
        got = sorted(header) if isinstance(header, dict) else type(header).__name__
        raise ProtocolError("header", f"{ftype.name} header must have {sorted(schema)}, "
                            f"not {got}")
    for name, kind in schema.items():
        value = header[name]
        ok = {_INT: lambda x: type(x) is int and 0 <= x < 1 << 63,
              _STR: lambda x: type(x) is str,
              _BIN: lambda x: type(x) is bytes,
              _MAP: lambda x: type(x) is dict,
              _INTS: lambda x: type(x) is list and all(type(t) is int and 0 <= t < 1 << 32
                                                       for t in x)}[kind](value)
        if not ok:
            raise ProtocolError("header", f"{ftype.name}.{name} must be {kind}")


def _check_tag(key: bytes, parts: list, tag: bytes) -> None:
    if not hmac.compare_digest(_tag(key, parts), tag):
        raise ProtocolError("checksum", "frame tag mismatch (corrupted or forged)")


def decode(buf: bytes | bytearray | memoryview, key: bytes = b"",
           max_payload: int = MAX_PAYLOAD_BYTES) -> tuple[Frame, int]:
    """Decode the first frame of `buf`; returns it and the bytes consumed. Raises
    ProtocolError ("truncated" if `buf` ends inside the frame)."""
    m = memoryview(buf)
    if len(m) < PREFIX.size:
        raise ProtocolError("truncated", "frame prefix truncated")
    prefix = bytes(m[:PREFIX.size])
    ftype, hlen, plen = parse_prefix(prefix, max_payload)
    end_h = PREFIX.size + hlen
    if len(m) < end_h:
        raise ProtocolError("truncated", "frame header truncated")
    raw = bytes(m[PREFIX.size:end_h])
    header = parse_header(ftype, raw, plen)
    end = end_h + plen + TAG_BYTES
    if len(m) < end:
        raise ProtocolError("truncated", "frame payload truncated")
    payload = m[end_h:end_h + plen]
    _check_tag(key, [prefix, raw, payload], bytes(m[end - TAG_BYTES:end]))
    return Frame(ftype, header, payload), end


async def read_frame(reader: asyncio.StreamReader, key: bytes = b"",
                     max_payload: int = MAX_PAYLOAD_BYTES) -> Frame:
    """Read one frame; the payload buffer is allocated only after the header has been
    validated and implies exactly its length. Raises ProtocolError ("truncated" when the
    stream ends inside a frame, including before its first byte)."""
    try:
        prefix = await reader.readexactly(PREFIX.size)
        ftype, hlen, plen = parse_prefix(prefix, max_payload)
        raw = await reader.readexactly(hlen)
        header = parse_header(ftype, raw, plen)
        payload = await reader.readexactly(plen) if plen else b""
        tag = await reader.readexactly(TAG_BYTES)
    except asyncio.IncompleteReadError as e:
        raise ProtocolError("truncated", "the peer closed the connection" + (
            f" mid-frame ({len(e.partial)} of {e.expected} bytes)" if e.partial else "")
        ) from None
    _check_tag(key, [prefix, raw, payload], tag)
    return Frame(ftype, header, payload)


async def write_frame(writer: asyncio.StreamWriter, parts: list) -> None:
    """Send a frame's buffers (from `encode_parts`/`encode_kv`) and wait for the transport
    to drain below its high-water mark (backpressure)."""
    writer.writelines(parts)
    await writer.drain()
