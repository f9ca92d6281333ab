"""Two-box mode over an emulated link (`app.bench.netns`, default 1 Gbit/s, 0.5 ms): where
the remote/local crossover lies, measured by forcing each and chosen by the policy, and the
overlap fraction at long prompts.

Two boxes on one machine: the worker in its own network namespace on core 0, the decode box
on core 1, one thread each. Equal cores would make remote prefill never pay, so the decode
box is throttled to `--decode-cpu-share` of its core (a cgroup v1 CPU quota), standing in
for a decode box that prefills slower than the prefill box (EXO's Mac prefills 3.8x slower
than their Spark).

1. For each prompt length: TTFT with local prefill (no peer) and with remote (policy
   "always"), fresh prompts, so nothing is cached; the measured crossover is the shortest
   length from which remote stays faster.
2. The policy ("auto", `--prefill-min-tokens 1` so that only its cost model decides),
   after the sweep taught it the speeds: which lengths it sends remote.
3. Remote prefills of `--overlap-at` lengths: overlap fraction, link GB/s, first frame.

Needs root and iproute2. usage: python -m app.bench.two_box_link [--lengths 32,...]
[--decode-cpu-share 0.5] [--overlap-at 2048,8000] [--rate 1gbit] [--delay 0.5ms]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
from pathlib import Path

from app.bench.netns import emulated_link
from app.bench.two_box import fresh_prompt, time_to_first_token
from app.bench.worker_process import WorkerProcess
from models.registry import DEFAULT_MODEL

CGROUP = Path("/sys/fs/cgroup/cpu")


@contextlib.contextmanager
def cpu_share(share: float):
    """Throttle this process to `share` of one CPU (cgroup v1 `cpu.cfs_quota_us`); yields
    whether it could."""
    group = CGROUP / f"tandem-bench-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(share * 100000)))
        for tid in os.listdir("/proc/self/task"):
            (group / "tasks").write_text(tid)
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                (CGROUP / "tasks").write_text(tid)
        with contextlib.suppress(OSError):
            group.rmdir()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--lengths", default="32,64,128,256,512,1024")
    p.add_argument("--overlap-at", default="2048,8000")
    p.add_argument("--decode-cpu-share", type=float, default=0.5)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--delay", default="0.5ms")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    overlap_at = [int(x) for x in args.overlap_at.split(",") if x]

    from app.config import EngineArgs
    from app.disagg.peer import PeerConfig
    from app.disagg.policy import PolicyConfig
    from app.loader import load_engine
    from backends.base import RunnerConfig

    ctx = min(max(lengths + overlap_at) + 64, 8192)  # the embedded model trained on 8192
    secret = Path(tempfile.mkdtemp(prefix="tandem-link-")) / "peer.secret"
    secret.write_text(os.urandom(32).hex())
    os.sched_setaffinity(0, {1})
    result: dict = {"model": args.model, "link": {"rate": args.rate, "delay": args.delay}}
    with emulated_link(args.rate, args.delay) as link:
        result["link"]["shaping"] = link.shaping
        # started before the throttle, so that it stays outside the decode box's cgroup
        worker = WorkerProcess(secret.parent, "--model", args.model, "--host", link.peer_ip,
                               "--secret-file", str(secret), "--threads", "1",
                               "--ctx-size", str(ctx),
                               prefix=("ip", "netns", "exec", link.namespace, "taskset", "-c", "0"))
        throttle = cpu_share(args.decode_cpu_share)
        throttled = throttle.__enter__()
        result["decode_cpu_share"] = args.decode_cpu_share if throttled else 1.0
        try:
            runner = RunnerConfig(max_seqs=2, seq_tokens=ctx, n_threads=1)
            peer = PeerConfig(link.peer_ip, worker.port, secret=secret.read_bytes(),
                              first_frame_timeout_s=60, frame_timeout_s=30,
                              policy=PolicyConfig(mode="always"))
            local = load_engine(EngineArgs(model=args.model, runner=runner))
            split = load_engine(EngineArgs(model=args.model, runner=runner, prefill_peer=peer))
            tok = local.tokenizer
            client = split.engine.scheduler.remote
            asyncio.run(time_to_first_token(split, fresh_prompt(tok, 64, 999)))  # warm the worker up
            sweep = []
            for i, n in enumerate(lengths):
                t_local, m_local = asyncio.run(time_to_first_token(local, fresh_prompt(tok, n, 2 * i)))
                t_remote, m = asyncio.run(time_to_first_token(split, fresh_prompt(tok, n, 2 * i + 1)))
                # what the policy learns: both prefill speeds, link, import cost
                client.observe_local(n - m_local.cached_tokens, m_local.first_token_time
                                     - m_local.first_scheduled_time)
                sweep.append({"tokens": n, "local_ttft_s": round(t_local, 3),
                              "remote_ttft_s": round(t_remote, 3),
                              "remote_ok": m.remote_prefill.get("ok")})
            faster = [r["remote_ttft_s"] < r["local_ttft_s"] for r in sweep]
            measured = next((r["tokens"] for k, r in enumerate(sweep) if all(faster[k:])), None)
            client.peer.policy.mode = "auto"
            client.policy.config.mode = "auto"
            client.policy.config.min_tokens = 1
            chosen = {n: client.decide(n - 1, 0) for n in lengths}
            policy_first = next((n for n in lengths if all(chosen[m][0] for m in lengths
                                                           if m >= n)), None)
            result.update({
                "sweep": sweep, "measured_crossover_tokens": measured,
                "policy_decisions": {n: list(d) for n, d in chosen.items()},
                "policy_crossover_tokens": policy_first,
                "policy_estimates": client.policy.snapshot()})
            client.policy.config.mode = "always"
            overlap = []
            for k, n in enumerate(overlap_at):
                t, m = asyncio.run(time_to_first_token(split, fresh_prompt(tok, n, 500 + k)))
                s = m.remote_prefill
                overlap.append({"tokens": n, "ttft_s": round(t, 3), "ok": s.get("ok"),
                                "overlap": s.get("overlap"), "link_gbps": s.get("link_gbps"),
                                "first_frame_fraction": s.get("first_frame_fraction"),
                                "exposed_s": s.get("exposed_s"), "bytes": s.get("bytes")})
            result["overlap"] = overlap
            split.shutdown()
            local.shutdown()
        finally:
            throttle.__exit__(None, None, None)
            worker.stop()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
