"""`tandem two-box plan`: predict whether prefilling on one box and decoding on another beats
either box alone, from device specs, the model's shape and the link (app/disagg/planner.py,
data in app/disagg/devices.toml).

The defaults are EXO Labs' measured case: DGX Spark prefill, M3 Ultra decode, Llama-3.1-8B
FP16, an 8,192-token prompt, 10 GbE. EXO did not publish the output length; the default
`--output 32` is the length their generation times imply at the calibrated bandwidth
efficiency (the derivation is in devices.toml).

`--here` plans for this machine (device "here", the decode box unless named otherwise) and
the served model (`--model`, default the embedded one): its shape from the GGUF, this
machine measured with it (app/disagg/here.py). `--list` prints the known devices, links and
models with their figures and sources.
"""

from __future__ import annotations

import argparse
import json
import sys

from app.commands.engine_flags import positive_int
from backends.base import KV_TRANSFER_DTYPES
from models.registry import DEFAULT_MODEL

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
                    f"({EXO_OUTPUT_TOKENS}), EXO did not publish one. --here plans for this "
                    "machine and the model you serve (measured, shape from its GGUF); --list "
                    "shows the known devices, links and models with their sources.")
    plan.add_argument("--prefill-device", default=None, metavar="NAME",
                      help="box that prefills in the split (default: spark)")
    plan.add_argument("--decode-device", default=None, metavar="NAME",
                      help="box that decodes in the split (default: m3-ultra; with --here: "
                           "here, unless --prefill-device is here)")
    plan.add_argument("--model", default=None, metavar="NAME",
                      help="model shape: a name in devices.toml, else a served model (registry "
                           "name or .gguf path) whose shape is read from its GGUF (default: "
                           "llama-3.1-8b; with --here: the embedded model, "
                           f"{DEFAULT_MODEL}, always from its GGUF)")
    plan.add_argument("--here", action="store_true",
                      help="add this machine as device 'here', measured with the --model "
                           "GGUF (or its cached measurement) (default: off)")
    plan.add_argument("--threads", type=positive_int, default=None, metavar="N",
                      help="with --here: CPU threads to measure with, as the served model "
                           "will run (default: all available CPUs)")
    plan.add_argument("--remeasure", action="store_true",
                      help="with --here: measure again instead of reading the cached figures "
                           "(measure on a quiet machine; default: off)")
    plan.add_argument("--prompt", type=positive_int, default=8192, metavar="TOKENS",
                      help="prompt length, tokens (default: 8192, EXO's)")
    plan.add_argument("--output", type=positive_int, default=EXO_OUTPUT_TOKENS,
                      metavar="TOKENS",
                      help="generated tokens (default: 32, the length inferred for EXO's "
                           "figures from their generation times and the bandwidths)")
    plan.add_argument("--kv-cache-type", choices=tuple(KV_TRANSFER_DTYPES), default="f16",
                      help="KV cache type of both boxes: what the split sends and decode "
                           "reads (q8_0: 34 bytes per 32 values) (default: f16)")
    plan.add_argument("--link", default="10gbe", metavar="NAME",
                      help="network between the boxes (default: 10gbe)")
    plan.add_argument("--devices", default=None, metavar="FILE",
                      help="extra TOML merged over the built-in devices.toml: new names or "
                           "overridden fields (default: the built-in table only)")
    plan.add_argument("--list", action="store_true",
                      help="print the known devices, links and models with their figures "
                           "and sources, and exit (default: off)")
    plan.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.disagg.planner import PlannerError, load_catalog, plan

    try:
        catalog = load_catalog(args.devices)
        if args.list:
            print("\n".join(list_lines(catalog, args.devices)))
            return 0
        model, here = _model_and_here(args, catalog)
        prefill = args.prefill_device or "spark"
        decode = args.decode_device or ("here" if here and prefill != "here" else "m3-ultra")
        result = plan(catalog.device(prefill), catalog.device(decode), model,
                      catalog.link(args.link), args.prompt, args.output)
    except (PlannerError, OSError, ValueError, ImportError) as exc:
        print(f"tandem: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out = result.to_dict()
        if here is not None:
            out["model_shape"] = _fields(model)
            out["here"] = _fields(here)
        print(json.dumps(out, indent=2))
    else:
        if here is not None:
            for line in here_lines(model, here):
                print(line)
        _table(result)
    return 0


def _model_and_here(args, catalog):
    """(the model shape, this machine as a Device or None). A served model is resolved
    without fetching: plan for what is here."""
    from dataclasses import replace

    from app.disagg.here import KV_BYTES, here_device, measure, model_shape
    from app.loader import display_name
    from models.store import resolve_model

    if not args.here:
        for flag, value in (("--threads", args.threads), ("--remeasure", args.remeasure)):
            if value not in (None, False):
                raise ValueError(f"{flag} is for --here, which is not given")
        name = args.model or "llama-3.1-8b"
        if name in catalog.models:
            return replace(catalog.model(name),
                           kv_bytes_per_elem=KV_BYTES[args.kv_cache_type]), None
        return model_shape(resolve_model(name, pull_missing=False), display_name(name),
                           args.kv_cache_type), None
    name = args.model or DEFAULT_MODEL
    path = resolve_model(name, pull_missing=False)
    model = model_shape(path, display_name(name), args.kv_cache_type)
    here = here_device(model, measure(path, threads=args.threads, remeasure=args.remeasure))
    catalog.devices["here"] = here
    return model, here


def _fields(obj) -> dict:
    from dataclasses import asdict

    return asdict(obj)


def here_lines(model, here) -> list[str]:
    """What `--here` measured and read, before the table."""
    kv = model.kv_bytes_per_token
    return [
        f"here: {here.description}: {here.source}; achieved {here.fp16_tflops:.3g} TFLOPS, "
        f"{here.memory_bandwidth_gbs:.3g} GB/s",
        f"model: {model.description}: {model.layers} layers, {model.heads} heads, "
        f"{model.kv_heads} KV heads, head dim {model.head_dim}, KV f16: {kv:,.0f} B per token "
        f"(2 x {model.layers} x {model.kv_heads} x {model.head_dim} x "
        f"{model.kv_bytes_per_elem:g}); {model.params:,} parameters, "
        f"{model.weight_bytes_per_param:.2f} B each",
    ]


def list_lines(catalog, extra=None) -> list[str]:
    """`--list`: every device, link and model with its figures, then its source."""
    origin = "devices.toml" + (f" + {extra}" if extra else "")
    lines = [f"devices ({origin}):"]
    for d in catalog.devices.values():
        lines += [f"  {d.name}: {d.description}: {d.memory_bandwidth_gbs:g} GB/s, "
                  f"{d.fp16_tflops:g} TFLOPS FP16, efficiency {d.compute_efficiency:g} compute, "
                  f"{d.bandwidth_efficiency:g} bandwidth", f"    source: {d.source or '-'}"]
    lines.append("links:")
    for link in catalog.links.values():
        lines += [f"  {link.name}: {link.description}: {link.usable_gbs:g} GB/s usable, "
                  f"{link.latency_ms:g} ms one way", f"    source: {link.source or '-'}"]
    lines.append("models:")
    for m in catalog.models.values():
        lines += [f"  {m.name}: {m.description}: {m.params:,} parameters, {m.layers} layers, "
                  f"{m.kv_heads} KV heads x {m.head_dim}, KV {m.kv_bytes_per_token:,.0f} B "
                  f"per token", f"    source: {m.source or '-'}"]
    lines.append("(add or override entries with --devices FILE; --here adds this machine)")
    return lines


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
