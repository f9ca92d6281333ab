"""`tandem run PROMPT`: one reply, streamed through the engine, with timings on stderr."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time

from app.commands.common import add_model_args, fail, load_engine, user_errors
from app.commands.peer_flags import add_peer_args
from app.commands.sampling_flags import add_sampling_args, sampling_values
from app.disagg.report import route_summary


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="answer one prompt, streaming the reply",
        description="Answer one prompt: the reply streams to stdout, timings go to stderr. "
        "The prompt is PROMPT, the text of --file PATH, or stdin when PROMPT is - or absent "
        "(echo hi | tandem run).")
    p.add_argument("prompt", nargs="?", default=None,
                   help="the user message (raw text with --raw); - or absent: read stdin")
    p.add_argument("--file", "-f", metavar="PATH", default=None,
                   help="read the prompt from this file (default: PROMPT or stdin)")
    add_model_args(p)
    add_peer_args(p)
    p.add_argument("--system", metavar="TEXT",
                   help="system message, placed by the chat template (default: none)")
    p.add_argument("--raw", action="store_true",
                   help="send the prompt as is, no chat template (default: off)")
    add_sampling_args(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true",
                     help="the reply is a JSON object (enforced by a grammar; default: off)")
    fmt.add_argument("--json-schema", metavar="FILE", default=None,
                     help="the reply is JSON valid against the JSON Schema in FILE (enforced "
                     "by a grammar; default: none)")
    p.set_defaults(func=main, parser=p)


def response_format(args: argparse.Namespace):
    """The `ResponseFormat` that `--json` / `--json-schema FILE` ask for, or None.
    Raises ValueError naming the file when it cannot be read as JSON; OSError when it
    cannot be read."""
    from app.engine.constrain import ResponseFormat

    if args.json:
        return ResponseFormat("json_object")
    if args.json_schema is None:
        return None
    with open(args.json_schema, encoding="utf-8") as f:
        text = f.read()
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--json-schema {args.json_schema}: not valid JSON: {exc}") from None
    return ResponseFormat("json_schema", schema, args.json_schema)


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt text: `--file`, stdin (`-` or no PROMPT, unless stdin is a terminal), or
    PROMPT. Raises ValueError naming what to give instead."""
    if args.file is not None:
        if args.prompt is not None:
            raise ValueError("give the prompt as PROMPT or with --file, not both")
        with open(args.file, encoding="utf-8") as f:
            return f.read()
    if args.prompt is None or args.prompt == "-":
        if args.prompt is None and sys.stdin.isatty():
            raise ValueError("no prompt: give PROMPT, --file PATH, or pipe it on stdin")
        return sys.stdin.read()
    return args.prompt


def main(args: argparse.Namespace) -> int:
    parser = args.parser
    if args.raw and args.system is not None:
        parser.error("--system needs the chat template, which --raw skips; put the system "
                     "text in the raw prompt instead")
    try:
        prompt = read_prompt(args)
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:
        return fail(f"--file {args.file}: {exc.strerror}")
    if not prompt.strip():
        parser.error("the prompt is empty")
    try:
        fmt = response_format(args)
    except OSError as exc:
        return fail(f"--json-schema {args.json_schema}: {exc.strerror}")
    except ValueError as exc:
        return fail(str(exc))
    try:
        return asyncio.run(_run(args, prompt, fmt))
    except user_errors() as exc:
        return fail(str(exc))


async def _run(args: argparse.Namespace, prompt: str, fmt=None) -> int:
    from app.engine import SamplingParams
    from app.engine.constrain import GrammarError
    from app.progress import PrefillBar
    from app.prompts import chat_prompt_ids, raw_prompt_ids

    params = SamplingParams(  # flags given, else the model's recommended settings
        max_tokens=args.max_tokens, seed=args.seed, stop=args.stop, **sampling_values(args),
    )
    engine = load_engine(args, max_seqs=1)
    try:
        if fmt is not None:  # the grammar is built for the loaded model's vocabulary
            try:
                params.grammar = engine.grammars.compile(fmt)
            except GrammarError as exc:
                what = f"--json-schema {args.json_schema}" if args.json_schema else "--json"
                return fail(f"{what}: {exc.reason}")
        if args.raw:
            prompt_ids = raw_prompt_ids(engine.tokenizer, prompt)
        else:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            messages.append({"role": "user", "content": prompt})
            prompt_ids = chat_prompt_ids(engine.tokenizer, messages)
        out = None
        last = "\n"
        shown_tokens, last_token_time = 0, None
        bar = PrefillBar(engine, "run")  # on stderr, when it is a terminal
        bar.start()
        try:
            async for out in engine.generate(prompt_ids, params, request_id="run"):
                await bar.stop()
                shown_tokens += len(out.token_ids)
                last_token_time = time.perf_counter()
                if out.text:
                    sys.stdout.write(out.text)
                    sys.stdout.flush()
                    last = out.text[-1]
            if last != "\n":  # the stats line on stderr starts on its own line
                sys.stdout.write("\n")
            sys.stdout.flush()
        except BrokenPipeError:  # `| head`: the reader is gone; stop quietly, like Unix tools
            _silence_stdout()
            return 0
        except asyncio.CancelledError:  # Ctrl+C: end the reply's line, say what was done
            await bar.stop()
            if last != "\n":
                sys.stdout.write("\n")
            sys.stdout.flush()
            if out is not None and out.metrics is not None:
                # the decode rate up to the last token shown (the request has no end time)
                m = dataclasses.replace(out.metrics, finish_time=last_token_time,
                                        completion_tokens=shown_tokens)
                print(_summary(m, "interrupted"), file=sys.stderr)
            raise
        if out is not None and out.metrics is not None:
            print(_summary(out.metrics, finish_label(out, engine.context_length)),
                  file=sys.stderr)
    finally:
        engine.shutdown()
    return 0


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit cannot fail a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def finish_label(out, context_length: int) -> str | None:
    """Why the reply ended, as the stats line says it: `stop`, `max tokens`, or `context
    full` when the context window (prompt + reply = `context_length` tokens) ended it."""
    if out.finish_reason != "length":
        return out.finish_reason
    m = out.metrics
    if m is not None and m.prompt_tokens + m.completion_tokens >= context_length:
        return "context full"
    return "max tokens"


def _summary(m, finish_reason: str | None) -> str:
    def fmt(value, unit, scale=1.0, digits=0):
        return "n/a" if value is None else f"{value * scale:.{digits}f} {unit}"

    spec = ""
    if m.num_draft_tokens:
        spec = (f" · drafts accepted {m.num_accepted_tokens}/{m.num_draft_tokens} "
                f"({m.acceptance_rate:.0%}), {m.mean_accepted_length:.2f} per step")
    if m.no_draft:  # steps that drafted nothing, and why (speculator.NO_DRAFT_REASONS)
        why = ", ".join(f"{reason.replace('_', ' ')} {n}" for reason, n in
                        sorted(m.no_draft.items(), key=lambda kv: (-kv[1], kv[0])))
        spec += f" · steps without drafts {sum(m.no_draft.values())} ({why})"
    if m.num_forced_draft_tokens:  # of those drafts, the ones the grammar forced
        spec += (f" · forced tokens accepted {m.num_accepted_forced_tokens}/"
                 f"{m.num_forced_draft_tokens}")
    return (
        f"TTFT {fmt(m.ttft, 'ms', 1000)} · prefill {fmt(m.prefill_tok_s, 'tok/s')} · "
        f"decode {fmt(m.decode_tok_s, 'tok/s', digits=1)} · prefix-cached {m.cached_tokens} tokens · "
        f"{m.prompt_tokens} prompt + {m.completion_tokens} generated tokens ({finish_reason})"
        + spec + (f" · {route}" if (route := route_summary(m.remote_prefill)) else "")
    )
