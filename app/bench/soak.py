"""Soak bench: hours of mixed traffic against a real `tandem serve` with a prefill worker,
and whether anything leaks, sticks or slows down (issue 33).

It starts `tandem serve` (and, unless `--no-with-worker`, a `tandem prefill-worker` it
prefills through with `--prefill-policy always`) as child processes in sessions of their
own, so a Ctrl+C in the terminal reaches only this bench. Both get a temporary
`TANDEM_HOME` with the user's measured caches copied in (fingerprints, probes, step-time
profiles): they start as fast, and the two-box estimates they write never reach the user's
store. Then:

1. warm-up: one request of every class at once (`app.bench.soak_traffic`), an idle pause,
   and the idle state: server RSS and open fds;
2. load for `--minutes`: `--clients` concurrent clients, each sending requests of classes
   drawn by weight; `/health` probed every second on a connection of its own; every
   `--sample-s` seconds the server's and worker's RSS and fds and the engine's gauges from
   `/metrics`; every `--kill-every-s` seconds (at least once in a short run) the worker is
   SIGKILLed while a long prompt is in flight, one more long prompt is sent while it is
   down, it is restarted on the same port, and one more is sent after;
3. drain (the requests in flight finish), close every connection, an idle pause of
   `--idle-s`, then the idle state again (polled up to 30 s for the KV blocks and slots to
   drain and the fds to come back).

Prints the JSON summary (`app.bench.soak_report.summarize`: per-class counts and latency
percentiles, the goals of issue 33 with pass/fail) and writes into `--out`: `summary.json`,
`soak.png`, `samples.jsonl` and `outcomes.jsonl` (appended as the run goes, so a run killed
outright still leaves its data), and the server's and worker's logs. The exit status is 0
when every goal passed, 1 otherwise. Ctrl+C (or SIGTERM, SIGHUP) ends the load early and still drains, checks and reports; a second Ctrl+C skips the drain and
the idle pause.

usage: python -m app.bench.soak --minutes 60 [--model NAME] [--out DIR] [--clients 4]
                                [--no-with-worker] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import httpx

from app.bench import soak_traffic as traffic
from app.bench.server_process import free_port, wait_healthy
from app.bench.soak_report import FD_TOLERANCE, Outcome, SoakRecord, chart, summarize, warm_point
from app.bench.soak_sample import engine_gauges, health_latency, process_stats
from app.bench.worker_process import ROOT, WorkerProcess
from models.registry import DEFAULT_MODEL

HEALTH_EVERY_S = 1.0
IDLE_DEADLINE_S = 30.0  # how long the idle state may take to settle after the pause
DRAIN_S = 150.0  # longer than the client timeout: every request in flight ends by then
CLIENT_TIMEOUT = httpx.Timeout(120.0, connect=10.0)


def _copy_caches(dest: Path) -> None:
    """Copy the user's measured caches (model fingerprints, repack probes, step-time
    profiles; not the two-box estimates, which the run measures) into `dest`, so the
    children start as fast as with the user's store without writing into it."""
    import shutil

    from models.store import store_dir

    src = store_dir()
    for name in ("fingerprints", "probes", "profiles"):
        if (src / name).is_dir():
            shutil.copytree(src / name, dest / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("two-box-*"))


class Soak:
    """One run: the child processes, the record, and the events Ctrl+C sets."""

    def __init__(self, args: argparse.Namespace, out: Path, model_path: Path):
        self.args = args
        self.out = out
        self.model_path = model_path
        self.home = tempfile.mkdtemp(prefix="tandem-soak-home-")
        _copy_caches(Path(self.home) / "models")
        self.env = {**os.environ, "TANDEM_HOME": self.home, "PYTHONUNBUFFERED": "1"}
        # llama.cpp's OpenMP threads spin at barriers by default; with two processes on
        # one machine that steals the other's cores (as in tests/e2e/conftest.py)
        self.env.setdefault("OMP_WAIT_POLICY", "passive")
        self.env.pop("TANDEM_API_KEY", None)
        duration = args.minutes * 60
        self.record = SoakRecord(meta={}, duration_s=duration, warm_s=warm_point(duration))
        self.server: subprocess.Popen | None = None
        self.worker: WorkerProcess | None = None
        self.worker_port = free_port()
        self.worker_starts = 0
        self.stop = asyncio.Event()  # the load ends (deadline or Ctrl+C)
        self.drained = asyncio.Event()  # the requests in flight have ended: stop sampling
        self.hurry = asyncio.Event()
        self.t0 = 0.0
        self._phase_t = time.perf_counter()
        self.warm = False  # the warm-up is over
        self._samples = open(out / "samples.jsonl", "a")  # noqa: SIM115 - open for the run
        self._outcomes = open(out / "outcomes.jsonl", "a")  # noqa: SIM115

    # -- processes ------------------------------------------------------------------------

    def common_flags(self) -> list[str]:
        flags = ["--model", str(self.model_path), "--ctx-size", str(self.args.ctx_size)]
        return flags + (["--threads", str(self.args.threads)] if self.args.threads else [])

    def start_worker(self) -> None:
        """A worker on `worker_port`; the previous one's log is kept as `worker-<n>.log`."""
        self.worker_starts += 1
        self.worker = WorkerProcess(self.out, *self.common_flags(), timeout=300,
                                    port=self.worker_port, env=self.env,
                                    start_new_session=True)
        self.record.meta.setdefault("worker_pids", []).append(self.worker.proc.pid)
        self.worker.log_path = self.worker.log_path.rename(
            self.out / f"worker-{self.worker_starts}.log")

    def start_server(self, with_worker: bool) -> str:
        port = free_port()
        cmd = [sys.executable, "-m", "app.cli", "serve", *self.common_flags(),
               "--port", str(port), "--max-concurrency", str(self.args.max_concurrency)]
        if with_worker:
            cmd += ["--prefill-peer", f"127.0.0.1:{self.worker_port}",
                    "--prefill-policy", self.args.prefill_policy]
        log_path = self.out / "server.log"
        with open(log_path, "w") as log:
            self.server = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        self.record.meta["server_pid"] = self.server.pid
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, self.server, timeout=300,
                     stderr_tail=lambda: log_path.read_text()[-3000:])
        return url

    def stop_processes(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGINT)
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        if self.worker is not None:
            self.worker.stop()

    def worker_pid(self) -> int | None:
        w = self.worker
        return w.proc.pid if w is not None and w.proc.poll() is None else None

    # -- recording ------------------------------------------------------------------------

    def phase(self, name: str) -> None:
        """Record that phase `name` ended: `meta["phases_s"][name]` is its length."""
        now = time.perf_counter()
        self.record.meta.setdefault("phases_s", {})[name] = round(now - self._phase_t, 1)
        self._phase_t = now

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def add_outcome(self, o: Outcome) -> None:
        self.record.outcomes.append(o)
        self._outcomes.write(json.dumps(asdict(o)) + "\n")
        self._outcomes.flush()

    async def timed(self, cls: str, client: traffic.Client) -> Outcome:
        fn = traffic.CLASSES[cls][0] if cls in traffic.CLASSES else traffic.long_prompt
        t = self.now()
        t1 = time.perf_counter()
        error = None
        try:
            await fn(client)
        except traffic.Failed as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - recorded; no error ends the client
            error = f"{type(exc).__name__}: {exc}"
        o = Outcome(round(t, 3), cls, error is None, round(time.perf_counter() - t1, 4), error,
                    warmup=not self.warm)
        self.add_outcome(o)
        return o

    async def sample(self, http: httpx.AsyncClient, **extra) -> dict:
        s = {"t_s": round(self.now(), 2), **extra}
        for who, pid in (("server", self.server.pid if self.server else None),
                         ("worker", self.worker_pid())):
            for k, v in process_stats(pid).items():
                s[f"{who}_{k}"] = v
        try:
            gauges = await engine_gauges(http)
            self.record.prefill_routes = gauges.pop("prefill_routes")
            s.update(gauges)
        except httpx.HTTPError as exc:
            s["metrics_error"] = f"{type(exc).__name__}: {exc}"
        self.record.samples.append(s)
        self._samples.write(json.dumps(s) + "\n")
        self._samples.flush()
        return s

    # -- the run --------------------------------------------------------------------------

    def client(self, http: httpx.AsyncClient, model: str, ctx: int, seed: int) -> traffic.Client:
        return traffic.Client(http, model, ctx, random.Random(seed),
                              long_words=self.args.long_words,
                              systems=traffic.system_prompts(self.args.seed))

    async def sleep(self, seconds: float, until: asyncio.Event | None = None) -> bool:
        """Sleep up to `seconds`; True if `until` (default: `stop`) was set meanwhile."""
        until = until or self.stop
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until.wait(), seconds)
        return until.is_set()

    async def client_loop(self, c: traffic.Client, deadline: float) -> None:
        while not self.stop.is_set() and time.perf_counter() < deadline:
            await self.timed(traffic.pick(c.rng), c)
            await self.sleep(c.rng.uniform(0, self.args.think_s))

    async def health_loop(self, http: httpx.AsyncClient) -> None:
        """Probe `/health` every second until the load has drained."""
        while not self.drained.is_set():
            t = self.now()
            ms, error = await health_latency(http)
            self.record.health.append((round(t, 2), round(ms, 2), error))
            await self.sleep(HEALTH_EVERY_S, self.drained)

    async def sample_loop(self, http: httpx.AsyncClient) -> None:
        """Sample every `--sample-s` until the load has drained; a progress line on stderr
        every minute."""
        last_line = 0.0
        while not self.drained.is_set():
            s = await self.sample(http)
            exited = self.server is not None and self.server.poll() is not None
            if exited and not self.stop.is_set():
                self.record.meta["server_exit_code"] = self.server.returncode
                print(f"soak: the server exited ({self.server.returncode}); see server.log",
                      file=sys.stderr, flush=True)
                self.stop.set()  # nothing more to measure
            if time.perf_counter() - last_line >= 60 or not last_line:
                last_line = time.perf_counter()
                failed = sum(not o.ok for o in self.record.outcomes)
                print(f"soak: {s['t_s'] / 60:.1f}/{self.args.minutes:g} min, "
                      f"{len(self.record.outcomes)} requests, {failed} failed, server RSS "
                      f"{s.get('server_rss_mb')} MiB, fds {s.get('server_fds')}, KV blocks "
                      f"{s.get('kv_blocks_used')}, worker kills {len(self.record.kills)}",
                      file=sys.stderr, flush=True)
            await self.sleep(self.args.sample_s, self.drained)

    async def kill_loop(self, c: traffic.Client, period: float) -> None:
        """Every `period` s: SIGKILL the worker while a long prompt is in flight, send the
        next long prompt while it is down, restart it, send one more."""
        while not await self.sleep(period):
            t = self.now()
            inflight = asyncio.create_task(self.timed("kill_inflight", c))
            await asyncio.sleep(c.rng.uniform(0.2, 1.5))  # into its remote prefill
            assert self.worker is not None
            self.worker.proc.kill()
            self.worker.proc.wait()
            first = await inflight
            down = await self.timed("kill_next_long", c)
            t1 = time.perf_counter()
            restart_s = None
            try:
                await asyncio.to_thread(self.start_worker)
                restart_s = round(time.perf_counter() - t1, 2)
            except RuntimeError as exc:
                self.add_outcome(Outcome(round(self.now(), 3), "worker_restart", False,
                                         time.perf_counter() - t1, str(exc)))
            after = await self.timed("restart_next_long", c)
            self.record.kills.append({"t_s": round(t, 1), "restart_s": restart_s,
                                      "inflight_ok": first.ok, "next_long_ok": down.ok,
                                      "after_restart_ok": after.ok})
            if restart_s is None:
                return

    async def idle_state(self, http: httpx.AsyncClient, deadline_s: float,
                         start_fds: int | None) -> dict:
        """Sample until nothing is held and the fds are back (or `deadline_s` passes)."""
        end = time.perf_counter() + deadline_s
        while True:
            s = await self.sample(http, idle=True)
            settled = all(s.get(k) == 0 for k in ("kv_blocks_used", "slots_used", "running",
                                                  "waiting", "remote_prefilling"))
            fds = s.get("server_fds") or 0
            fds_back = start_fds is None or abs(fds - start_fds) <= FD_TOLERANCE
            if (settled and fds_back) or time.perf_counter() > end or self.hurry.is_set():
                return s
            await asyncio.sleep(1.0)

    async def run(self, url: str) -> None:
        args = self.args
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, self.interrupt)
        self.t0 = time.perf_counter()
        probe = httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT)
        try:
            card = (await probe.get("/v1/models")).json()["data"][0]
            model, ctx = card["id"], card["context_length"]
            self.record.meta.update(model=model, model_path=str(self.model_path),
                                    context_length=ctx)
            # warm-up: every class once, together, then the idle state the end is compared
            # with (what the first requests open lazily is open by then)
            async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT) as http:
                await asyncio.gather(*(
                    self.timed(cls, self.client(http, model, ctx, args.seed * 1000 + 900 + i))
                    for i, cls in enumerate(traffic.CLASSES)))
            self.phase("warmup")
            await self.sleep(args.idle_s)
            start = await self.sample(probe, idle=True)
            self.record.start = start
            self.record.samples.clear()  # the load's samples start at t = 0
            self.t0 = time.perf_counter()
            self.warm = True
            deadline = self.t0 + self.record.duration_s
            limits = httpx.Limits(max_connections=args.clients + 2)
            async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT,
                                         limits=limits) as http:
                clients = [self.client(http, model, ctx, args.seed * 1000 + i)
                           for i in range(args.clients)]
                monitors = [asyncio.create_task(self.health_loop(probe)),
                            asyncio.create_task(self.sample_loop(probe))]
                load = [asyncio.create_task(self.client_loop(c, deadline)) for c in clients]
                if self.worker is not None:
                    period = min(args.kill_every_s, self.record.duration_s / 2)
                    load.append(asyncio.create_task(self.kill_loop(
                        self.client(http, model, ctx, args.seed * 1000 + 500), period)))
                await self._until(deadline)
                self.record.load_s = self.now()
                self.phase("load")
                self.stop.set()
                await self._drain(load)
                self.drained.set()
                await asyncio.gather(*monitors)
                self.phase("drain")
            await self.sample(probe)  # the end of the load
            with contextlib.suppress(TimeoutError):  # the idle pause; Ctrl+C ends it
                await asyncio.wait_for(self.hurry.wait(), args.idle_s)
            self.record.idle_end = await self.idle_state(probe, IDLE_DEADLINE_S,
                                                         start.get("server_fds"))
            self.phase("idle_end")
        finally:
            await probe.aclose()

    async def _until(self, deadline: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), max(deadline - time.perf_counter(), 0))

    async def _drain(self, tasks: list[asyncio.Task]) -> None:
        """Let the requests in flight finish (up to DRAIN_S, or until a second Ctrl+C), then
        cancel what is left."""
        hurry = asyncio.create_task(self.hurry.wait())
        end = time.perf_counter() + DRAIN_S
        pending = set(tasks)
        while pending and not hurry.done() and time.perf_counter() < end:
            _, pending = await asyncio.wait(pending | {hurry}, timeout=end - time.perf_counter(),
                                            return_when=asyncio.FIRST_COMPLETED)
            pending.discard(hurry)
        hurry.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def interrupt(self) -> None:
        if not self.stop.is_set():
            self.record.interrupted = True
            self.stop.set()
            print("soak: stopping; the requests in flight finish, then the idle checks "
                  "(Ctrl+C again to skip them)", file=sys.stderr, flush=True)
        else:
            self.hurry.set()

    def close(self) -> None:
        import shutil

        self._samples.close()
        self._outcomes.close()
        shutil.rmtree(self.home, ignore_errors=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app.bench.soak",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True, help="length of the load")
    p.add_argument("--model", default=DEFAULT_MODEL, help="registry name or .gguf path")
    p.add_argument("--out", default=None, help="results directory (default: the bench "
                   "directory of the user data dir, soak-<date>/)")
    p.add_argument("--with-worker", action=argparse.BooleanOptionalAction, default=True,
                   help="prefill through a `tandem prefill-worker`, killed and restarted "
                   "every --kill-every-s (default: on)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    p.add_argument("--ctx-size", type=int, default=4096, help="context of server and worker")
    p.add_argument("--max-concurrency", type=int, default=8, help="the server's batch")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of each process "
                   "(default: half the cores each with a worker, since both share this "
                   "machine; all without)")
    p.add_argument("--prefill-policy", default="always", choices=("auto", "always"))
    p.add_argument("--long-words", type=int, default=600, help="size of a long prompt")
    p.add_argument("--kill-every-s", type=float, default=180.0,
                   help="seconds between worker kills (a short run gets at least one)")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--idle-s", type=float, default=10.0,
                   help="idle pause before the start and end states (more than the "
                   "server's 5 s keep-alive)")
    p.add_argument("--think-s", type=float, default=0.5,
                   help="most seconds a client waits between requests")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.clients < 1:
        p.error("--minutes must be > 0 and --clients >= 1")
    if args.threads is None and args.with_worker:
        args.threads = max(1, (os.cpu_count() or 2) // 2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from app.bench.charts import ChartContext, default_chart_path, model_and_format
    from app.commands.doctor import chip
    from models.store import resolve_model

    model_path = resolve_model(args.model, pull_missing=False)
    out = Path(args.out) if args.out else default_chart_path("soak").with_suffix("")
    out.mkdir(parents=True, exist_ok=True)
    soak = Soak(args, out, model_path)
    rec = soak.record
    rec.meta.update(minutes=args.minutes, clients=args.clients, with_worker=args.with_worker,
                    seed=args.seed, ctx_size=args.ctx_size, prefill_policy=args.prefill_policy,
                    started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), out=str(out))
    error = None
    try:
        with ThreadPoolExecutor(1) as pool:  # both load their model at once
            worker = pool.submit(soak.start_worker) if args.with_worker else None
            url = soak.start_server(with_worker=args.with_worker)
            if worker is not None:
                worker.result()
        soak.phase("start")
        asyncio.run(soak.run(url))
    except KeyboardInterrupt:
        rec.interrupted = True
    except Exception as exc:  # noqa: BLE001 - the summary of what was recorded still comes
        error = f"{type(exc).__name__}: {exc}"
    finally:
        soak.stop_processes()
        soak.close()
    summary = summarize(rec)
    if error:
        summary["error"] = error
        summary["pass"] = False
    name, fmt = model_and_format(model_path)
    context = ChartContext(name, fmt, f"{args.clients} clients, mixed traffic, 4-16 output "
                           "tokens per request", f"{chip()} ({os.cpu_count()} cores)")
    if rec.samples:
        chart(rec, out / "soak.png", context)
        summary["png"] = str(out / "soak.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1), flush=True)
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
