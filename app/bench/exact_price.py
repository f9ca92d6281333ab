"""What exact mode costs: decode at 1 and 16 users, prefill, and the speculative table, each
measured with and without `--exact` in the same run.

`python -m app.bench.exact_price [--model M] [--rounds 2]` runs `tandem bench` in a fresh
process per setting (the exact llama.cpp library is chosen per process), alternating
default and exact `--rounds` times, and prints one JSON line per measurement, then a
summary line per metric with the medians and the ratio exact / default (above 1: exact
is faster; for TTFT, below 1). Needs a quiet machine: llama.cpp's threads spin-wait.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

# (metric, tandem bench arguments, how to read the metric from its JSON lines)
DECODE = ["--concurrency", "1,16", "--requests", "16", "--prompt-tokens", "128",
          "--max-tokens", "64"]
PREFILL = ["--concurrency", "1", "--requests", "4", "--prompt-tokens", "480",
           "--max-tokens", "2"]
SPEC = ["--workload", "code-edit,prediction", "--spec", "fixed:4", "--concurrency", "1",
        "--max-tokens", "96", "--requests", "4"]


def _bench(model: str, args: list[str], exact: bool) -> list[dict]:
    cmd = [sys.executable, "-m", "app.cli", "bench", "--model", model, *args]
    cmd += ["--exact"] if exact else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    # every run says which mode it ran (the bench rows, or the speculative table's first)
    said = {r["exact"] for r in rows if "exact" in r}
    if said != {exact}:
        raise RuntimeError(f"{' '.join(cmd)} ran exact={said}, not {exact}")
    return rows


def measurements(model: str, exact: bool) -> dict[str, float]:
    """One round of every metric for one setting: {metric: value}."""
    got: dict[str, float] = {}
    for row in _bench(model, DECODE, exact):
        c = row["concurrency"]
        got[f"decode_tok_s_{c}_users"] = (row["per_user_tok_s"] if c == 1
                                          else row["decode_tok_s_aggregate"])
    (row,) = _bench(model, PREFILL, exact)
    got["prefill_ttft_ms_480_tokens"] = row["ttft_ms"]["p50"]
    for row in _bench(model, SPEC, exact):
        if row.get("mode") and row["mode"] != "off":
            got[f"spec_{row['workload']}_{row['mode']}_ratio_vs_off"] = row["ratio_vs_off"]
            got[f"spec_{row['workload']}_{row['mode']}_tok_s"] = row["decode_tok_s"]
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.bench.exact_price",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        for exact in (False, True):
            got = measurements(args.model, exact)
            runs[exact].append(got)
            print(json.dumps({"round": r, "exact": exact, **got}), flush=True)
    for metric in runs[False][0]:
        if not all(metric in m for m in runs[False] + runs[True]):
            continue  # a speculative cell one run did not report
        default = statistics.median(m[metric] for m in runs[False])
        exact = statistics.median(m[metric] for m in runs[True])
        print(json.dumps({"summary": metric, "default": round(default, 3),
                          "exact": round(exact, 3),
                          "exact_over_default": round(exact / default, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
