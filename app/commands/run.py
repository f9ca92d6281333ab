"""`tandem run PROMPT`: one reply, streamed through the engine, with timings on stderr."""

from __future__ import annotations

import argparse
import asyncio
import sys

from app.commands.common import add_model_args, fail, load_engine, user_errors


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="answer one prompt, streaming the reply")
    p.add_argument("prompt", help="the user message (or raw text with --raw)")
    add_model_args(p)
    p.add_argument("--system", help="system prompt")
    p.add_argument("--raw", action="store_true", help="send the prompt as-is, no chat template")
    p.add_argument("--max-tokens", type=int, default=512, help="tokens to generate at most")
    # llama.cpp's sampling defaults
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except user_errors() as exc:
        return fail(str(exc))


async def _run(args: argparse.Namespace) -> int:
    from app.engine import SamplingParams
    from app.prompts import chat_prompt_ids, raw_prompt_ids

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_p=args.min_p, seed=args.seed, stop=args.stop,
    )
    engine = load_engine(args, max_seqs=1)
    try:
        if args.raw:
            prompt_ids = raw_prompt_ids(engine.tokenizer, args.prompt)
        else:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            messages.append({"role": "user", "content": args.prompt})
            prompt_ids = chat_prompt_ids(engine.tokenizer, messages)
        out = None
        async for out in engine.generate(prompt_ids, params):
            if out.text:
                sys.stdout.write(out.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        if out is not None and out.metrics is not None:
            print(_summary(out.metrics, out.finish_reason), file=sys.stderr)
    finally:
        engine.shutdown()
    return 0


def _summary(m, finish_reason: str | None) -> str:
    def fmt(value, unit, scale=1.0, digits=0):
        return "n/a" if value is None else f"{value * scale:.{digits}f} {unit}"

    spec = ""
    if m.num_draft_tokens:
        spec = (f" · drafts accepted {m.num_accepted_tokens}/{m.num_draft_tokens} "
                f"({m.acceptance_rate:.0%}), {m.mean_accepted_length:.2f} per step")
    return (
        f"TTFT {fmt(m.ttft, 'ms', 1000)} · prefill {fmt(m.prefill_tok_s, 'tok/s')} · "
        f"decode {fmt(m.decode_tok_s, 'tok/s', digits=1)} · prefix-cached {m.cached_tokens} tokens · "
        f"{m.prompt_tokens} prompt + {m.completion_tokens} generated tokens ({finish_reason})"
        + spec
    )
