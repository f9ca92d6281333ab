"""`tandem two-box plan`: predict whether prefilling on one box and decoding on another beats
either box alone, from device specs, the model's shape and the link (app/disagg/planner.py,
data in app/disagg/devices.toml).

The defaults are EXO Labs' measured case: DGX Spark prefill, M3 Ultra decode, Llama-3.1-8B
FP16, an 8,192-token prompt, 10 GbE. EXO did not publish the output length; the default
`--output 32` is the length their generation times imply at the calibrated bandwidth
efficiency (the derivation is in devices.toml).
"""

from __future__ import annotations

import argparse
import json
import sys

from app.commands.engine_flags import positive_int

EXO_OUTPUT_TOKENS = 32  # inferred, not published by EXO: see devices.toml


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "two-box", help="plan prefill on one box, decode on another",
        description="Two-box mode tools: `plan` predicts, for a workload, each box alone and "
        "the split (one box prefills and streams the KV cache, the other decodes).")
    actions = parser.add_subparsers(dest="two_box_command", required=True, metavar="ACTION")
    plan = actions.add_parser(
        "plan", help="predict TTFT and total time for each box alone and for the split",
        description="Predict prefill (compute-bound), decode (bandwidth-bound) and the KV "
                    "transfer, and say whether the second box pays for this workload. "
                    "Defaults: EXO Labs' Spark + M3 Ultra case; its --output is inferred "
                    f"({EXO_OUTPUT_TOKENS}), EXO did not publish one.")
    plan.add_argument("--prefill-device", default="spark", metavar="NAME",
                      help="box that prefills in the split (default: spark)")
    plan.add_argument("--decode-device", default="m3-ultra", metavar="NAME",
                      help="box that decodes in the split (default: m3-ultra)")
    plan.add_argument("--model", default="llama-3.1-8b", metavar="NAME",
                      help="model shape (default: llama-3.1-8b)")
    plan.add_argument("--prompt", type=positive_int, default=8192, metavar="TOKENS",
                      help="prompt length, tokens (default: 8192, EXO's)")
    plan.add_argument("--output", type=positive_int, default=EXO_OUTPUT_TOKENS,
                      metavar="TOKENS",
                      help="generated tokens (default: 32, the length inferred for EXO's "
                           "figures from their generation times and the bandwidths)")
    plan.add_argument("--link", default="10gbe", metavar="NAME",
                      help="network between the boxes (default: 10gbe)")
    plan.add_argument("--devices", default=None, metavar="FILE",
                      help="extra TOML merged over the built-in devices.toml: new names or "
                           "overridden fields (default: the built-in table only)")
    plan.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.disagg.planner import PlannerError, load_catalog, plan

    try:
        catalog = load_catalog(args.devices)
        result = plan(catalog.device(args.prefill_device), catalog.device(args.decode_device),
                      catalog.model(args.model), catalog.link(args.link), args.prompt,
                      args.output)
    except (PlannerError, OSError) as exc:
        print(f"tandem: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _table(result)
    return 0


def _table(result) -> None:
    from rich.console import Console
    from rich.table import Table

    p, d = result.prefill_box, result.decode_box
    table = Table(box=None, pad_edge=False, title=(
        f"{result.model}, prompt {result.prompt} + output {result.output} tokens, "
        f"link {result.link}"), title_justify="left")
    for column in ("config", "TTFT s", "decode s", "total s", "split speedup"):
        table.add_column(column, justify="left" if column == "config" else "right")
    for label, box in ((f"{p.device} alone", p), (f"{d.device} alone", d)):
        table.add_row(label, f"{box.prefill_s:.3f}", f"{box.decode_s:.3f}",
                      f"{box.total_s:.3f}", f"{box.total_s / result.split_total_s:.2f}x")
    table.add_row(f"split {p.device} -> {d.device}", f"{result.split_ttft_s:.3f}",
                  f"{d.decode_s:.3f}", f"{result.split_total_s:.3f}", "")
    table.add_row("split, KV sent after prefill", f"{p.prefill_s + result.kv_transfer_s:.3f}",
                  f"{d.decode_s:.3f}", f"{result.serial_split_total_s:.3f}", "")
    console = Console()
    console.print(table)
    console.print(f"KV {result.kv_bytes / 1e9:.3f} GB: transfer {result.kv_transfer_s:.3f} s, "
                  f"{result.hidden_transfer_s:.3f} s hidden behind prefill, "
                  f"{result.exposed_transfer_s:.3f} s exposed", highlight=False,
                  soft_wrap=True)
    console.print(f"verdict: {result.verdict}", highlight=False, soft_wrap=True)
