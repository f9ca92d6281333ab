"""Fuzz the two-box wire against a live prefill worker: each frame a decode box sends, at
each stage of the protocol, mutated, then an honest decode box served after.

    python -m app.bench.wire_fuzz --mutations 5000     # starts `tandem prefill-worker`
    python -m app.bench.wire_fuzz --port 7777 --model PATH --secret-file F --mutations 500

A session runs the protocol honestly (`app.disagg.handshake`, docs/two-box.md) up to its
stage, sends one mutated frame there instead of the honest one, half-closes, and reads what
the worker answers until it closes. Stages (`STAGES`): `hello` (HELLO), `auth` (AUTH, after
the CHALLENGE), `prefill` (PREFILL, after READY), `stream` (a frame sent while KV streams
back, instead of nothing or CANCEL). Mutations (`MUTATIONS`): `bitflip` (1 to 8 bits
anywhere), `truncate` (the frame cut anywhere), `length` (the prefix's header or payload
length rewritten: 0, short, long, the maximum), `type` (one header field given a value of
another type: string, bytes, negative, 2**64, float, NaN, infinity, list, map, nil),
`fields` (a field dropped or one added), `oversized` (a 1 MiB header, a payload past the
limit, a PREFILL of more tokens than the context), `order` (a well-formed, correctly tagged
frame of another type), `garbage` (random bytes), `semantic` (well-formed, correctly
tagged and authenticated values the worker must refuse: a PREFILL `start` past the prompt,
`chunk_tokens` 0, token ids outside the vocabulary, an empty prompt, a fingerprint whose
fields have wrong types or infinite values).

Each session must end cleanly: the worker answers only well-formed frames (an ERROR frame,
or the protocol's next frames) and closes within `--close-timeout` s of the half-close. After
every `--honest-every` sessions, and at the end, an honest decode box must be served: its
KV frames cover the prompt in order and match byte for byte those of a reference honest
session run at the start (after one that fills the worker's prefix cache), and DONE counts
them. The in-process worker of the CI test also must count no "failed" outcome
(an exception the worker did not expect); the worker process must stay alive and log no
traceback. Prints a JSON summary: `sessions`, `outcomes` (what the worker answered, per
stage and mutation), `honest` (sessions served), `failures` (each with its seed). Exit
status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import random
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from app.disagg import wire
from app.disagg.handshake import NONCE_BYTES, _fingerprint_map, proof, session_key
from app.disagg.wire import PREFIX, FrameType, ProtocolError, encode_parts
from models.fingerprint import ModelFingerprint

STAGES = ("hello", "auth", "prefill", "stream")
MUTATIONS = ("bitflip", "truncate", "length", "type", "fields", "oversized", "order",
             "garbage", "semantic")
WRONG_VALUES: tuple[Any, ...] = ("x", b"\x00" * 3, -1, 2**64 - 1, 1.5, math.nan, math.inf,
                                 [1, "a"], {"k": 1}, None, True)


@dataclass
class Target:
    """The worker: address, shared secret, its model's fingerprint, and an honest prompt
    (token ids valid for its model, shorter than its context); `n_ctx`: its context."""

    host: str
    port: int
    secret: bytes
    fingerprint: ModelFingerprint
    prompt: list[int]
    n_ctx: int
    n_vocab: int
    chunk_tokens: int = 16


def raw_frame(ftype: int, header: Any, payload: bytes = b"", key: bytes = b"",
              hlen: int | None = None, plen: int | None = None) -> bytes:
    """A frame with any header (not checked against its schema), tagged with `key`;
    `hlen`/`plen` override the lengths the prefix declares."""
    hdr = msgpack.packb(header, use_bin_type=True)
    prefix = PREFIX.pack(wire.MAGIC, wire.PROTOCOL_VERSION, ftype, 0,
                         len(hdr) if hlen is None else hlen,
                         len(payload) if plen is None else plen)
    tag = wire._tag(key, [prefix, hdr, payload])
    return prefix + hdr + payload + tag


class Honest:
    """The honest decode box's frames, as one session sends them."""

    def __init__(self, t: Target, request: int = 7):
        self.t = t
        self.request = request
        self.nonce_c = secrets.token_bytes(NONCE_BYTES)
        self.fp_c = _fingerprint_map(t.fingerprint, None, "f16", False)

    def hello(self) -> dict[str, Any]:
        return {"nonce": self.nonce_c, "fingerprint": self.fp_c}

    def auth(self, challenge: dict[str, Any], fp_c: dict[str, Any] | None = None
             ) -> dict[str, Any]:
        return {"proof": proof(self.t.secret, b"client", self.nonce_c, challenge["nonce"],
                               self.fp_c if fp_c is None else fp_c, challenge["fingerprint"])}

    def prefill(self) -> dict[str, Any]:
        return {"request": self.request, "start": 0, "tokens": list(self.t.prompt),
                "chunk_tokens": self.t.chunk_tokens}


def _header(stage: str, h: Honest, challenge: dict | None) -> tuple[FrameType, dict]:
    if stage == "hello":
        return FrameType.HELLO, h.hello()
    if stage == "auth":
        assert challenge is not None
        return FrameType.AUTH, h.auth(challenge)
    if stage == "prefill":
        return FrameType.PREFILL, h.prefill()
    return FrameType.CANCEL, {"request": h.request}


def _valid_header(ftype: FrameType, rng: random.Random, h: Honest) -> dict[str, Any]:
    """A header that fits `ftype`'s schema (for out-of-order frames)."""
    kinds = {"int": lambda: rng.choice([0, 1, h.request, 2**40]),
             "str": lambda: rng.choice(["", "busy", "f16"]),
             "bin": lambda: secrets.token_bytes(rng.choice([0, NONCE_BYTES])),
             "map": lambda: h.fp_c, "ints": lambda: list(h.t.prompt[:rng.randint(0, 8)])}
    return {name: kinds[kind]() for name, kind in wire.SCHEMAS[ftype].items()}


def mutate(stage: str, kind: str, rng: random.Random, h: Honest, key: bytes,
           challenge: dict | None) -> tuple[bytes, dict | None]:
    """The bytes to send instead of the honest frame at `stage`; and, for a HELLO whose
    fingerprint was changed, that fingerprint (the AUTH proof must cover it as sent)."""
    ftype, header = _header(stage, h, challenge)
    honest = b"".join(bytes(p) for p in encode_parts(ftype, header, key=key))
    sent_fp = None
    if kind == "bitflip":
        buf = bytearray(honest)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        return bytes(buf), None
    if kind == "truncate":
        return honest[:rng.randrange(len(honest))], None
    if kind == "length":
        hlen = len(msgpack.packb(header, use_bin_type=True))
        choice = rng.choice([0, 1, hlen - 1, hlen + 1, hlen * 4, wire.MAX_HEADER_BYTES,
                             2**32 - 1])
        if rng.random() < 0.5:
            return raw_frame(ftype, header, key=key, hlen=choice), None
        return raw_frame(ftype, header, key=key,
                         plen=rng.choice([1, 16, wire.MAX_PAYLOAD_BYTES, 2**64 - 1])), None
    if kind == "type":
        if not header:
            return raw_frame(ftype, rng.choice(WRONG_VALUES), key=key), None
        bad = dict(header)
        name = rng.choice(sorted(bad))
        if name == "fingerprint" and rng.random() < 0.5:
            fp = dict(bad[name])
            fp[rng.choice(sorted(fp))] = rng.choice(WRONG_VALUES)
            bad[name] = sent_fp = fp
        else:
            bad[name] = rng.choice(WRONG_VALUES)
        return raw_frame(ftype, bad, key=key), sent_fp
    if kind == "fields":
        bad = dict(header)
        if bad and rng.random() < 0.5:
            del bad[rng.choice(sorted(bad))]
        else:
            bad[rng.choice(["extra", "request", "nonce", ""])] = 1
        return raw_frame(ftype, bad, key=key), None
    if kind == "oversized":
        choice = rng.randrange(3)
        if choice == 0:
            return raw_frame(ftype, {**header, "pad": b"\x00" * (wire.MAX_HEADER_BYTES + 1)},
                             key=key), None
        if choice == 1:
            return raw_frame(ftype, header, key=key, plen=wire.MAX_PAYLOAD_BYTES + 1), None
        tokens = [rng.randrange(h.t.n_vocab) for _ in range(h.t.n_ctx + rng.randint(0, 64))]
        return raw_frame(FrameType.PREFILL, {**h.prefill(), "tokens": tokens}, key=key), None
    if kind == "order":
        other = rng.choice([t for t in FrameType if t != ftype])
        return raw_frame(other, _valid_header(other, rng, h), key=key), None
    if kind == "garbage":
        return secrets.token_bytes(rng.choice([1, 19, 20, 64, 4096])), None
    # semantic: well-formed and tagged, values the worker must refuse
    if stage == "hello":
        fp = dict(h.fp_c)
        fp[rng.choice(sorted(fp))] = rng.choice([math.inf, -math.inf, math.nan, 2**64 - 1,
                                                 -(2**63), "", [], {}, None])
        if rng.random() < 0.3:
            del fp[rng.choice(sorted(fp))]
        return raw_frame(ftype, {**header, "fingerprint": fp}, key=key), fp
    if stage == "auth":
        return raw_frame(ftype, {"proof": secrets.token_bytes(32)}, key=key), None
    if stage == "prefill":
        n = len(h.t.prompt)
        bad = rng.choice([{"start": n}, {"start": n + 5}, {"chunk_tokens": 0},
                          {"tokens": []}, {"tokens": [h.t.n_vocab + 1] * 3},
                          {"tokens": [2**32 - 1]}, {"start": 2**62}])
        return raw_frame(ftype, {**h.prefill(), **bad}, key=key), None
    return raw_frame(FrameType.CANCEL, {"request": h.request + 1}, key=key), None


async def _read(reader: asyncio.StreamReader, key: bytes) -> wire.Frame:
    return await wire.read_frame(reader, key, max_payload=wire.MAX_PAYLOAD_BYTES)


@dataclass
class Session:
    """What one mutated session saw: `answer` (e.g. "ERROR:protocol", "closed",
    "KV*3,DONE"), `problem` when the worker misbehaved."""

    answer: str = ""
    problem: str | None = None
    errors: list[dict[str, str]] = field(default_factory=list)  # ERROR frames' headers


async def _drain(reader: asyncio.StreamReader, key: bytes, timeout: float) -> Session:
    """Read the worker's frames until it closes (tagged with `key`, or b"" for an ERROR
    sent before the session key took effect); the answer, or a problem."""
    seen: list[str] = []
    errors: list[dict[str, str]] = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    frame = await _read_any(reader, (key, b""))
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        return Session(",".join(seen), "worker closed mid-frame")
                    break  # closed between frames: clean
                except ProtocolError as e:
                    return Session(",".join(seen), f"worker sent a bad frame: {e.code}: {e}")
                if frame.type == FrameType.ERROR:
                    seen.append(f"ERROR:{frame.header['code']}")
                    errors.append(frame.header)
                elif not seen or seen[-1] != frame.type.name:
                    seen.append(frame.type.name)
    except TimeoutError:
        return Session(",".join(seen), f"worker did not close within {timeout} s")
    except (ConnectionError, OSError):
        seen.append("reset")
    return Session(",".join(seen) or "closed", errors=errors)


async def _read_any(reader: asyncio.StreamReader, keys: tuple[bytes, ...]) -> wire.Frame:
    """One frame tagged with any of `keys` (an ERROR sent before READY uses b"")."""
    prefix = await reader.readexactly(PREFIX.size)
    ftype, hlen, plen = wire.parse_prefix(prefix)
    raw = await reader.readexactly(hlen)
    header = wire.parse_header(ftype, raw, plen)
    payload = await reader.readexactly(plen) if plen else b""
    tag = await reader.readexactly(wire.TAG_BYTES)
    for key in keys:
        if wire._tag(key, [prefix, raw, payload]) == tag:
            return wire.Frame(ftype, header, payload)
    raise ProtocolError("checksum", "frame tag matches no key")


async def mutated_session(t: Target, stage: str, kind: str, seed: int,
                          close_timeout: float, mutation: Any = None) -> Session:
    """One session with one mutation (see the module docstring); `mutation`: a function
    with `mutate`'s signature and result (default `mutate`)."""
    rng = random.Random(seed)
    h = Honest(t)
    reader, writer = await asyncio.open_connection(t.host, t.port)
    try:
        challenge, key = None, b""
        if stage != "hello":
            writer.writelines(encode_parts(FrameType.HELLO, h.hello()))
            challenge = (await _read(reader, b"")).header
            key = session_key(t.secret, h.nonce_c, challenge["nonce"])
            if stage != "auth":
                writer.writelines(encode_parts(FrameType.AUTH, h.auth(challenge)))
                await _read(reader, key)  # READY
                if stage == "stream":
                    writer.writelines(encode_parts(FrameType.PREFILL, h.prefill(), key=key))
                    first = await _read_any(reader, (key,))
                    if first.type == FrameType.QUEUE:  # the worker's first answer (queue)
                        first = await _read_any(reader, (key,))
                    if first.type != FrameType.KV:
                        return Session(first.type.name, "honest PREFILL got no KV")
        frame_key = key if stage in ("prefill", "stream") else b""  # handshake frames: b""
        data, sent_fp = (mutation or mutate)(stage, kind, rng, h, frame_key, challenge)
        writer.write(data)
        await writer.drain()
        if sent_fp is not None and stage == "hello":  # finish the handshake over it
            try:
                c = await _read_any(reader, (b"",))
            except (ProtocolError, asyncio.IncompleteReadError, ConnectionError):
                c = None
            if c is not None and c.type == FrameType.CHALLENGE:
                key = session_key(t.secret, h.nonce_c, c.header["nonce"])
                writer.writelines(encode_parts(FrameType.AUTH, h.auth(c.header, sent_fp)))
        writer.write_eof()
        return await _drain(reader, key, close_timeout)
    except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
        return Session(f"reset:{type(e).__name__}")
    except ProtocolError as e:  # the honest frames before the mutation were refused
        return Session("", f"honest frames before the mutation failed: {e.code}: {e}")
    finally:
        writer.close()


async def honest_session(t: Target, timeout: float = 120.0) -> tuple[str, str | None]:
    """A full honest prefill: (sha256 of the KV payloads in order, problem or None)."""
    h = Honest(t)
    reader, writer = await asyncio.open_connection(t.host, t.port)
    digest = hashlib.sha256()
    try:
        async with asyncio.timeout(timeout):
            writer.writelines(encode_parts(FrameType.HELLO, h.hello()))
            c = (await _read(reader, b"")).header
            key = session_key(t.secret, h.nonce_c, c["nonce"])
            writer.writelines(encode_parts(FrameType.AUTH, h.auth(c)))
            if (await _read(reader, key)).type != FrameType.READY:
                return "", "no READY"
            writer.writelines(encode_parts(FrameType.PREFILL, h.prefill(), key=key))
            pos, frames = 0, 0
            while True:
                f = await _read(reader, key)
                if f.type == FrameType.DONE:
                    break
                if f.type == FrameType.QUEUE and frames == 0:  # where the prompt queues
                    continue
                if f.type != FrameType.KV:
                    return "", f"expected KV or DONE, got {f.type.name} {f.header}"
                kv = wire.decode_kv(f)
                if kv.layer == 0:
                    if kv.first_pos != pos:
                        return "", f"KV chunk at {kv.first_pos}, expected {pos}"
                    pos += kv.n_tokens
                frames += 1
                digest.update(bytes(kv.k) + bytes(kv.v))
            if pos != len(t.prompt) or f.header["frames"] != frames:
                return "", f"DONE after {pos} positions and {frames} frames: {f.header}"
            return digest.hexdigest(), None
    except (ProtocolError, ConnectionError, OSError, asyncio.IncompleteReadError,
            TimeoutError) as e:
        return "", f"honest session failed: {type(e).__name__}: {e}"
    finally:
        writer.close()


@dataclass
class Report:
    sessions: int = 0
    honest: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)


async def fuzz_worker(t: Target, mutations: int, seed: int = 0, honest_every: int = 25,
                      close_timeout: float = 15.0, healthy: Any = None) -> dict[str, Any]:
    """Run `mutations` mutated sessions against the worker at `t` (stage and mutation
    drawn in turn, then at random, from `seed`) with an honest session every
    `honest_every` and at the end. `healthy()`: an extra check after each session (None, or
    a message saying what is wrong with the worker). Returns the JSON summary."""
    start = time.monotonic()
    rng = random.Random(seed)
    report = Report()
    # twice: the first fills the worker's prefix cache, and the KV sent from the cache may
    # differ in its bytes from the cold run's (`kv_cold_equals_cached`, docs/readme-fuzz.md)
    digests = []
    for first in ("honest (cold)", "honest (reference)"):
        digest, problem = await honest_session(t)
        digests.append(digest)
        if problem:
            report.failures.append({"session": first, "problem": problem})
    reference = digests[-1]
    combos = [(s, m) for s in STAGES for m in MUTATIONS]
    for i in range(mutations):
        stage, kind = combos[i] if i < len(combos) else rng.choice(combos)
        session_seed = rng.randrange(2**32)
        s = await mutated_session(t, stage, kind, session_seed, close_timeout)
        report.sessions += 1
        report.outcomes[f"{stage}/{kind} -> {s.answer}"] += 1
        problem = s.problem or (healthy() if healthy else None)
        if problem:
            report.failures.append({"stage": stage, "mutation": kind, "seed": session_seed,
                                    "answer": s.answer, "problem": problem})
        if (i + 1) % honest_every == 0 or i == mutations - 1:
            digest, problem = await honest_session(t)
            report.honest += 1
            if problem or digest != reference:
                report.failures.append({"session": f"honest after {i + 1}",
                                        "problem": problem or "KV differs from the reference"})
    return {"sessions": report.sessions, "honest": report.honest, "seed": seed,
            "kv_cold_equals_cached": digests[0] == digests[1],
            "failures": report.failures, "seconds": round(time.monotonic() - start, 1),
            "outcomes": dict(sorted(report.outcomes.items()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.bench.wire_fuzz",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, help="a running worker on 127.0.0.1 (default: "
                        "start `tandem prefill-worker` on the embedded model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", help="the worker's model file (default: the embedded one)")
    parser.add_argument("--secret-file", type=Path, help="the worker's shared secret")
    parser.add_argument("--mutations", type=int, default=2000, help="default 2000")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--honest-every", type=int, default=25)
    parser.add_argument("--close-timeout", type=float, default=15.0,
                        help="seconds the worker has to close after the half-close")
    args = parser.parse_args(argv)
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    import tempfile

    import gguf

    from app.bench.worker_process import WorkerProcess
    from app.disagg.fingerprints import model_fingerprint
    from models.registry import DEFAULT_MODEL
    from models.store import model_path

    path = Path(args.model) if args.model else model_path(DEFAULT_MODEL)
    n_vocab = len(gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"].data)
    secret = args.secret_file.read_bytes().strip() if args.secret_file else b""
    target = Target(args.host, args.port or 0, secret, model_fingerprint(path),
                    prompt=list(range(1000, 1100)), n_ctx=2048, n_vocab=n_vocab)
    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        if not args.port:
            proc = WorkerProcess(Path(tmp), "--threads", "2", "--ctx-size", "2048",
                                 "--model", str(path))
            target.port = proc.port

        def healthy() -> str | None:
            if proc is None:
                return None
            if proc.proc.poll() is not None:
                return f"worker exited with status {proc.proc.returncode}"
            return "traceback in the worker's log" if "Traceback" in proc.log() else None

        try:
            summary = await fuzz_worker(target, args.mutations, args.seed, args.honest_every,
                                        args.close_timeout, healthy)
        finally:
            if proc is not None:
                log = proc.log()
                proc.stop()
    if proc is not None:
        summary["worker_outcomes"] = dict(Counter(
            line.split(": ")[2].split(":")[0] for line in log.splitlines()
            if "prefill for" in line and line.count(": ") >= 2))
        summary["worker_dropped"] = log.count(" dropped: ")
    print(json.dumps(summary, indent=2))
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

