"""The two-box handshake: protocol version, mutual HMAC challenge-response over a shared
secret (which never crosses the wire), and the model fingerprint compared field by field.
Spec: docs/two-box.md.

    client -> HELLO     {nonce: 32 random bytes, fingerprint}
    server -> CHALLENGE {nonce: 32 random bytes, fingerprint, proof: mac("server")}
    client -> AUTH      {proof: mac("client")}
    server -> READY     {}            (tagged with the session key: it proves the key too)
    mac(role) = HMAC-SHA256(secret, b"tandem-kv/1 " + role + nonce_c + nonce_s
                            + sha256(msgpack(fp_c)) + sha256(msgpack(fp_s)))
    session key = HMAC-SHA256(secret, b"tandem-kv/1 session" + nonce_c + nonce_s)

A fingerprint map may carry three keys more than the model's fields: "threads", the
sender's CPU threads (int), so that a decode box on the same machine as its worker can tell
when the two over-subscribe the cores; "kv_cache_type" ("q8_0"; absent means "f16"), the KV
dtype the worker sends and the decode box loads; and "exact" (true; absent means false),
whether the side runs exact mode (`--exact`: the decode box's logits equal one box's only if
the worker's KV came out of the same kernels). The last two must be equal on both sides. A
peer that does not know them ignores them (`from_dict` reads only the model's fields, and the
proofs cover the map as sent); an f16 peer not in exact mode omits both, so its handshake is
as before.

Either side that finds a problem sends ERROR {code, message} (tag key b"") and raises
`ProtocolError`: "version", "auth" (wrong proof), "fingerprint" (`detail` = first differing
field, "kv_cache_type" or "exact"). Both proofs cover both nonces and both fingerprints, so
neither a replayed proof nor a fingerprint altered in transit passes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from dataclasses import dataclass

import msgpack

from app.disagg.wire import Frame, FrameType, ProtocolError, encode_parts, read_frame, write_frame
from backends.base import KV_CACHE_TYPES
from models.fingerprint import ModelFingerprint, first_difference

NONCE_BYTES = 32
_LABEL = b"tandem-kv/1 "


@dataclass(frozen=True, slots=True)
class Session:
    """An authenticated connection's state: `key` tags every later frame."""

    key: bytes
    peer: ModelFingerprint
    peer_threads: int | None = None  # the peer's CPU threads, if it sent them


def _fingerprint_map(fingerprint: ModelFingerprint, threads: int | None,
                     kv_cache_type: str, exact: bool) -> dict:
    fp = fingerprint.to_dict()
    if threads:
        fp["threads"] = int(threads)
    if kv_cache_type != "f16":
        fp["kv_cache_type"] = kv_cache_type
    if exact:
        fp["exact"] = True
    return fp


def _check_settings(kv_cache_type: str, exact: bool, fp: dict) -> None:
    """Raises ProtocolError "header" (malformed) or "fingerprint" (differs) unless the peer's
    KV cache type and exact mode equal these."""
    _check_kv_cache_type(kv_cache_type, fp)
    theirs = fp.get("exact", False)
    if type(theirs) is not bool:
        raise ProtocolError("header", f"exact must be true or false, not {theirs!r}")
    if theirs != exact:
        word = {True: "on", False: "off"}
        raise ProtocolError("fingerprint", f"exact mode differs: here {word[exact]}, peer "
                            f"{word[theirs]} (run both with --exact, or neither)",
                            detail="exact")


def _check_kv_cache_type(mine: str, fp: dict) -> None:
    """Raises ProtocolError "header" (malformed) or "fingerprint" (differs) unless the peer's
    KV cache type equals `mine`."""
    theirs = fp.get("kv_cache_type", "f16")
    if theirs not in KV_CACHE_TYPES:
        raise ProtocolError("header", f"unknown kv_cache_type {theirs!r}")
    if theirs != mine:
        raise ProtocolError("fingerprint", f"KV cache types differ: here {mine}, peer {theirs} "
                            "(run both with the same --kv-cache-type)", detail="kv_cache_type")


def _threads(fp: dict) -> int | None:
    n = fp.get("threads")
    return n if type(n) is int and n > 0 else None


def fingerprint_digest(fp: dict) -> bytes:
    """sha256 of a fingerprint dict's msgpack encoding (field order as given)."""
    return hashlib.sha256(msgpack.packb(fp, use_bin_type=True)).digest()


def proof(secret: bytes, role: bytes, nonce_c: bytes, nonce_s: bytes, fp_c: dict,
          fp_s: dict) -> bytes:
    """A side's 32-byte proof that it knows `secret`, bound to this exchange."""
    msg = (_LABEL + role + nonce_c + nonce_s + fingerprint_digest(fp_c)
           + fingerprint_digest(fp_s))
    return hmac.new(secret, msg, hashlib.sha256).digest()


def session_key(secret: bytes, nonce_c: bytes, nonce_s: bytes) -> bytes:
    """The key tagging every frame after the handshake (32 bytes)."""
    return hmac.new(secret, _LABEL + b"session" + nonce_c + nonce_s, hashlib.sha256).digest()


def _expect(frame: Frame, ftype: FrameType) -> dict:
    if frame.type == FrameType.ERROR:
        raise ProtocolError("peer", f"peer refused: {frame.header['code']}: "
                            f"{frame.header['message']}", detail=frame.header["code"])
    if frame.type != ftype:
        raise ProtocolError("type", f"expected {ftype.name}, got {frame.type.name}")
    if "nonce" in frame.header and len(frame.header["nonce"]) != NONCE_BYTES:
        raise ProtocolError("header", f"nonce must be {NONCE_BYTES} bytes")
    return frame.header


async def _fail(writer: asyncio.StreamWriter, err: ProtocolError) -> None:
    code = err.code if err.code in ("version", "auth", "fingerprint") else "protocol"
    message = str(err) if err.detail is None or code != "fingerprint" else err.detail
    try:
        await write_frame(writer, encode_parts(FrameType.ERROR,
                                               {"code": code, "message": message}))
    except (ConnectionError, OSError):
        pass  # the peer is gone: the error raised below is what matters
    raise err


def _compare(mine: ModelFingerprint, theirs: dict) -> ModelFingerprint:
    """The peer's fingerprint, checked equal to `mine`. Raises ProtocolError: "header" when
    it is malformed (a field missing, of a wrong type, infinite), "fingerprint" when a field
    differs."""
    try:
        peer = ModelFingerprint.from_dict(theirs)
    except ValueError as e:
        raise ProtocolError("header", str(e)) from None
    differ = first_difference(mine, peer)
    if differ is not None:
        raise ProtocolError("fingerprint", f"models differ in {differ}: here "
                            f"{getattr(mine, differ)!r}, peer {getattr(peer, differ)!r}",
                            detail=differ)
    return peer


async def client_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           secret: bytes, fingerprint: ModelFingerprint,
                           threads: int | None = None, kv_cache_type: str = "f16",
                           exact: bool = False) -> Session:
    """The decode box's side (`threads`: its CPU threads, sent if given; `kv_cache_type`: the
    KV dtype it loads; `exact`: whether it runs exact mode). Raises ProtocolError (code as
    in the module docstring)."""
    fp_c = _fingerprint_map(fingerprint, threads, kv_cache_type, exact)
    nonce_c = secrets.token_bytes(NONCE_BYTES)
    await write_frame(writer, encode_parts(FrameType.HELLO,
                                           {"nonce": nonce_c, "fingerprint": fp_c}))
    h = _expect(await read_frame(reader), FrameType.CHALLENGE)
    nonce_s, fp_s = h["nonce"], h["fingerprint"]
    try:
        want = proof(secret, b"server", nonce_c, nonce_s, fp_c, fp_s)
        if not hmac.compare_digest(want, h["proof"]):
            raise ProtocolError("auth", "the peer does not know the shared secret")
        peer = _compare(fingerprint, fp_s)
        _check_settings(kv_cache_type, exact, fp_s)
    except ProtocolError as err:
        await _fail(writer, err)
    await write_frame(writer, encode_parts(
        FrameType.AUTH, {"proof": proof(secret, b"client", nonce_c, nonce_s, fp_c, fp_s)}))
    key = session_key(secret, nonce_c, nonce_s)
    _expect(await read_frame(reader, key), FrameType.READY)
    return Session(key, peer, _threads(fp_s))


async def server_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           secret: bytes, fingerprint: ModelFingerprint,
                           threads: int | None = None, kv_cache_type: str = "f16",
                           exact: bool = False) -> Session:
    """The prefill worker's side (`threads`: its CPU threads, sent if given; `kv_cache_type`:
    the KV dtype it sends; `exact`: whether it runs exact mode). Raises ProtocolError after
    telling the peer why."""
    try:
        h = _expect(await read_frame(reader), FrameType.HELLO)
    except ProtocolError as err:
        await _fail(writer, err)
    fp_s = _fingerprint_map(fingerprint, threads, kv_cache_type, exact)
    nonce_c, fp_c = h["nonce"], h["fingerprint"]
    nonce_s = secrets.token_bytes(NONCE_BYTES)
    await write_frame(writer, encode_parts(FrameType.CHALLENGE, {
        "nonce": nonce_s, "fingerprint": fp_s,
        "proof": proof(secret, b"server", nonce_c, nonce_s, fp_c, fp_s)}))
    try:
        a = _expect(await read_frame(reader), FrameType.AUTH)
        if not hmac.compare_digest(proof(secret, b"client", nonce_c, nonce_s, fp_c, fp_s),
                                   a["proof"]):
            raise ProtocolError("auth", "the peer does not know the shared secret")
        peer = _compare(fingerprint, fp_c)
        _check_settings(kv_cache_type, exact, fp_c)
    except ProtocolError as err:
        if err.code == "peer":
            raise
        await _fail(writer, err)
    key = session_key(secret, nonce_c, nonce_s)
    await write_frame(writer, encode_parts(FrameType.READY, {}, key=key))
    return Session(key, peer, _threads(fp_c))
