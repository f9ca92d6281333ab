"""Request by request (or, with `--concurrency N`, N requests at a time): `tandem serve`,
llama-server and the Python floor (`app.bench.python_floor`) all running at once, taking turns.

`app.bench.peer` runs each server alone for a whole round, a minute or more apart, and this
machine's speed drifts more than that between rounds. Here a round is one request to each
server, back to back (the order goes through the permutations), so drift cancels in the round's ratios: one
streaming client, greedy, the same conversation for the three, each request's throughput its
completion tokens over its wall time (TTFT included). Idle, the servers take no CPU.
With `--concurrency N` a server's turn is N different conversations sent at once (the same N
to each server), its throughput all their completion tokens over the turn's wall time, its
TTFT and TPOT the medians over the N.

Prints one JSON object: per system the median throughput (tok/s) and TTFT, and the median
(with quartiles) of the per-round ratios to llama-server. With `--decode-gaps`, tandem and
the floor run under `app.bench.decode_probe`, and the object also has, per Python server, the
median time between two one-token decodes and of a decode (`decode_gaps`), and tandem's gap
over the floor's.

With `--replicas K`, each system runs as K processes (`tandem`, `tandem#2`, ...) and a round
is one request to each process; a system's throughput in a round is the mean over its
processes. On this project's 2-core VM two identical servers measured in one run can differ
by up to 10% in decode time for the life of the process, so one process per system measures
that luck as much as the servers; `by_process` shows each process's median.

usage: python -m app.bench.peer_paired [--model NAME] [--llama-server PATH] [--threads 2]
                                       [--rounds 24] [--max-tokens 128] [--no-floor]
                                       [--tandem-args "--spec off"] [--decode-gaps]
                                       [--replicas 1] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

import httpx

from app.bench.http import SAMPLING, ChatResult, make_conversations, served_model, stream_chat
from app.bench.peer import SEQS, add_peer_args, llama_server_binary, llama_server_cmd, tandem_cmd
from app.bench.server_process import free_port, running
from app.bench.stats import median

BASELINE = "llama_server"


def floor_cmd(path: str, port: int, threads: int) -> list[str]:
    """The command line of `app.bench.python_floor` on `path`, `port`, `threads`."""
    return [sys.executable, "-m", "app.bench.python_floor", "--model", path, "--port",
            str(port), "--threads", str(threads)]


def probed(cmd: list[str], out: str) -> list[str]:
    """`cmd` (`python -m MODULE ARGS`) run under `app.bench.decode_probe`, writing `out`."""
    if cmd[:2] != [sys.executable, "-m"]:
        raise ValueError(f"not a `python -m` command: {cmd[:3]}")
    return [cmd[0], "-m", "app.bench.decode_probe", out, *cmd[2:]]


def read_probe(path: str) -> dict | None:
    """A probe's file, or None if its server left none (killed, or it failed to start)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def process_name(system: str, replica: int) -> str:
    """The name of `system`'s process number `replica` (0: the system's own name)."""
    return system if replica == 0 else f"{system}#{replica + 1}"


def system_of(process: str) -> str:
    """The system a process name belongs to."""
    return process.split("#", 1)[0]


def gap_summary(probes: dict[str, dict | None]) -> dict:
    """The probes' medians per process, and tandem's gap over the floor's (when both ran;
    with replicas, the mean of each system's processes' medians)."""
    out: dict = {"decode_gaps": probes}
    gaps: dict[str, list[float]] = {}
    for process, probe in probes.items():
        gap = (probe or {}).get("gap_us_p50")
        if gap:
            gaps.setdefault(system_of(process), []).append(gap)
    if gaps.get("tandem") and gaps.get("python_floor"):
        out["gap_tandem_to_python_floor"] = round(
            statistics.fmean(gaps["tandem"]) / statistics.fmean(gaps["python_floor"]), 3)
    return out


def round_order(systems: list[str], round_index: int) -> list[str]:
    """The order of round `round_index`: the permutations of `systems` in turn, so that over
    len(systems)! rounds each takes each place, and follows each other, equally often (the
    one before can leave llama.cpp's workers spinning into the next request)."""
    orders = list(itertools.permutations(systems))
    return list(orders[round_index % len(orders)])


def process_order(systems: list[str], replicas: int, round_index: int) -> list[str]:
    """The processes' order in round `round_index`: for each replica in turn, the systems in
    `round_order` of a different round, so that a process rarely follows its own system."""
    return [process_name(s, k) for k in range(replicas)
            for s in round_order(systems, round_index + k)]


def per_system(rounds: list[dict[str, dict[str, float]]],
               systems: list[str]) -> list[dict[str, dict[str, float]]]:
    """Rounds by process -> rounds by system (in `systems`' order): the mean of each system's
    processes' figures (`tok_s`, `ttft_ms` and, where measured, `tpot_ms`)."""
    return [{s: {k: statistics.fmean(m[k] for p, m in r.items() if system_of(p) == s)
                 for k in next(iter(r.values()))} for s in systems} for r in rounds]


def turn_result(results: list[ChatResult], wall_s: float) -> dict[str, float]:
    """One server's turn in a round: the requests sent at once and their wall time (seconds)
    -> `tok_s` (all their completion tokens over `wall_s`), and the medians of their TTFT and
    TPOT (`ttft_ms`, `tpot_ms`; TPOT over the requests that have one, 0 if none has).
    Raises ValueError for no requests or a wall time that is not positive."""
    if not results or wall_s <= 0:
        raise ValueError(f"{len(results)} request(s) in {wall_s} s")
    tpots = [r.tpot * 1000 for r in results if r.tpot is not None]
    return {"tok_s": sum(r.completion_tokens for r in results) / wall_s,
            "ttft_ms": statistics.median(r.ttft * 1000 for r in results),
            "tpot_ms": statistics.median(tpots) if tpots else 0.0}


def summarize(rounds: list[dict[str, dict[str, float]]]) -> dict:
    """`rounds[i][system] = {"tok_s", "ttft_ms"}` -> medians per system and, per system
    other than llama-server, the median and quartiles of `tok_s / llama-server's tok_s` over
    the rounds. Raises ValueError for fewer than 2 rounds."""
    if len(rounds) < 2:
        raise ValueError(f"{len(rounds)} round(s): quartiles need 2 or more")
    systems = list(rounds[0])
    out: dict = {"rounds": len(rounds),
                 "throughput_tok_s": {s: median([r[s]["tok_s"] for r in rounds], 1)
                                      for s in systems},
                 "ttft_ms_p50": {s: median([r[s]["ttft_ms"] for r in rounds], 1)
                                 for s in systems},
                 "ratio_to_llama_server": {}}
    if "tpot_ms" in rounds[0][systems[0]]:
        out["tpot_ms_p50"] = {s: median([r[s]["tpot_ms"] for r in rounds], 1) for s in systems}
    for s in systems:
        if s == BASELINE:
            continue
        ratios = [r[s]["tok_s"] / r[BASELINE]["tok_s"] for r in rounds]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        out["ratio_to_llama_server"][s] = {"median": median(ratios, 3),
                                           "q1": round(q1, 3), "q3": round(q3, 3)}
    return out


async def _measure(urls: dict[str, str], models: dict[str, str], systems: list[str],
                   replicas: int, rounds: int, concurrency: int, prompt_tokens: int,
                   max_tokens: int, seed: int) -> list[dict]:
    conversations = make_conversations(rounds * concurrency, prompt_tokens, 0, seed)
    timeout = httpx.Timeout(3600.0, connect=30.0)
    async with contextlib.AsyncExitStack() as stack:
        clients = {s: await stack.enter_async_context(httpx.AsyncClient(base_url=u,
                                                                        timeout=timeout))
                   for s, u in urls.items()}
        for s, client in clients.items():  # warm-up, not measured
            for _ in range(2):
                await stream_chat(client, models[s], [{"role": "user", "content": "Hello"}], 16)
        results = []
        for i in range(rounds):
            batch = conversations[i * concurrency:(i + 1) * concurrency]
            one_round = {}
            for s in process_order(systems, replicas, i):
                start = time.perf_counter()
                done = await asyncio.gather(*(stream_chat(clients[s], models[s], m, max_tokens)
                                              for m in batch))
                one_round[s] = turn_result(done, time.perf_counter() - start)
            results.append(one_round)
        return results


def main(argv: list[str] | None = None) -> int:
    from models.store import resolve_model

    p = argparse.ArgumentParser(prog="python -m app.bench.peer_paired", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_peer_args(p)
    p.add_argument("--rounds", type=int, default=24)
    p.add_argument("--no-floor", action="store_true", help="leave the Python floor out")
    p.add_argument("--decode-gaps", action="store_true",
                   help="time the decodes of tandem and the floor (app.bench.decode_probe)")
    p.add_argument("--replicas", type=int, default=1,
                   help="processes per system, measured in turn in every round (default 1)")
    p.add_argument("--concurrency", type=int, default=1,
                   help="requests sent at once in each server's turn (default 1)")
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error("--rounds must be at least 2")
    if args.replicas < 1:
        p.error("--replicas must be at least 1")
    if not 1 <= args.concurrency <= SEQS:
        p.error(f"--concurrency must be 1 to {SEQS} (the servers' sequences)")
    path = str(resolve_model(args.model))
    binary = llama_server_binary(args.llama_server)
    extra = shlex.split(args.tandem_args)
    commands = {"tandem": lambda m, port, t: tandem_cmd(m, port, t) + extra,
                BASELINE: lambda m, port, t: llama_server_cmd(binary, m, port, t)}
    if not args.no_floor:
        commands["python_floor"] = floor_cmd
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        urls, probes = {}, {}
        for k in range(args.replicas):
            for s, cmd in commands.items():
                name, port = process_name(s, k), free_port()
                line = cmd(path, port, args.threads)
                if args.decode_gaps and s != BASELINE:
                    probes[name] = os.path.join(tmp, f"{name}.json")
                    line = probed(line, probes[name])
                urls[name] = stack.enter_context(running(line, port))
        models = {s: served_model(u) for s, u in urls.items()}
        rounds = asyncio.run(_measure(urls, models, list(commands), args.replicas,
                                      args.rounds, args.concurrency, args.prompt_tokens,
                                      args.max_tokens, args.seed))
        stack.close()  # the servers stop, and the probes write their files
        gaps = gap_summary({s: read_probe(f) for s, f in probes.items()}) if probes else {}
    by_process = ({"by_process": {p: median([r[p]["tok_s"] for r in rounds], 1)
                                  for p in rounds[0]}} if args.replicas > 1 else {})
    print(json.dumps({"scenario": f"short_c{args.concurrency}_paired", "model": args.model,
                      "threads": args.threads, "max_tokens": args.max_tokens,
                      "tandem_args": extra, "replicas": args.replicas,
                      "sampling": SAMPLING, **summarize(per_system(rounds, list(commands))),
                      **by_process, **gaps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
