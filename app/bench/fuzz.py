"""Schemathesis against a running `tandem serve`: generated requests to every route of its
OpenAPI document (`GET /openapi.json`, `app.server.openapi`), each response checked.

    python -m app.bench.fuzz --examples 2000            # starts `tandem serve` (embedded model)
    python -m app.bench.fuzz --url http://127.0.0.1:8000 --api-key KEY --examples 200

Two phases per operation: Schemathesis's coverage cases (boundaries and type mismatches:
the smallest float, the largest integer, empty strings, missing fields; about 2,700 over
tandem's routes; `--coverage N` sends at most N per operation), then `--examples` generated
requests in all, split evenly over the operations and the two generation modes (positive:
bodies valid against the schema; negative: bodies that violate it). Prints
a JSON summary: `requests` (generated requests sent; the checks send a few more of their
own, not counted), `status` (count per HTTP status), `server_errors` (5xx answers),
`failures` (one entry per operation and kind of failure, with one reproducing curl),
`requests_per_operation` (an operation without inputs, such as `GET /health`, has only a
few distinct requests) and `seconds`. Exit status 1 when anything failed.

Checks (`CHECKS`, Schemathesis's names): no 5xx; status, media type, headers and body as
documented (error bodies in their API's shape: `app.server.openapi.ERROR_MODELS`, also
checked for any 4xx by `error_shape`); invalid bodies refused; required headers enforced;
unsupported methods answered 405 with `Allow`; the API key enforced. Left out:
`positive_data_acceptance`, since the server refuses with a 400 what a JSON schema cannot
say (cross-field rules such as `top_logprobs` without `logprobs`, features it does not have
such as Ollama's `truncate: true` or Anthropic `document` blocks), and the stateful checks
(the API creates no resources).

Generation is bounded for a real model (`bound_generation`): each request asks for at most
`--max-tokens` tokens (default 8; added where a request leaves its length out, since the
default is the context's end) and `n` at most 2, so 2,000 requests take minutes, not hours;
out-of-range values that the server must refuse are left as generated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import schemathesis
from hypothesis import HealthCheck, Phase
from pydantic import ValidationError

from app.server.errors import api_shape
from app.server.openapi import ERROR_MODELS
from models.registry import DEFAULT_MODEL

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance",
          "negative_data_rejection", "missing_required_header", "unsupported_method",
          "allow_header_conformance", "ignored_auth")
INT64_MAX = 2**63 - 1
# body fields that set a reply's length, per route family
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# where the length is optional: the field added when a request leaves it out
DEFAULT_LENGTH_FIELD = {"/v1/chat/completions": "max_tokens", "/v1/completions": "max_tokens",
                        "/v1/responses": "max_output_tokens"}
REQUEST_TIMEOUT_S = 120.0


def error_shape(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """Any 4xx answer carries the error body of the path's API (`app.server.errors`)."""
    if not 400 <= response.status_code < 500:
        return
    model = ERROR_MODELS[api_shape(case.operation.path)]
    try:
        model.model_validate_json(response.content)
    except ValidationError as exc:
        raise AssertionError(f"{response.status_code} body is not {model.__name__}: "
                             f"{response.content[:300]!r} ({exc.errors()[0]['msg']})") from None


def bound_generation(case: schemathesis.Case, max_tokens: int) -> None:
    """Cap the reply length a request asks for, in place: `max_tokens` (and OpenAI's other
    names; added where optional and left out, since the default is the context's end), `n`,
    Ollama's `options.num_predict` (added when absent: Ollama's default is until EOS).
    Values outside the documented range are left as generated, for the server to refuse."""
    body = case.body
    if not isinstance(body, dict):
        return
    for key in LENGTH_FIELDS:
        value = body.get(key)
        if type(value) is int and max_tokens < value <= INT64_MAX:
            body[key] = max_tokens
    default_key = DEFAULT_LENGTH_FIELD.get(case.operation.path)
    if default_key and not any(body.get(key) is not None for key in LENGTH_FIELDS):
        body[default_key] = max_tokens  # left out, a reply may run to the context's end
    n = body.get("n")
    if type(n) is int and 2 < n <= 64:
        body["n"] = 2
    if case.operation.path in ("/api/chat", "/api/generate"):
        options = body.get("options")
        if options is None and "options" not in body:
            body["options"] = options = {}
        if isinstance(options, dict):
            predict = options.get("num_predict")
            if predict is None or type(predict) is int and (predict < 0 or predict > max_tokens):
                options["num_predict"] = max_tokens


@dataclass
class Tally:
    """What a run saw: statuses, and failures deduplicated by (operation, kind)."""

    status: Counter[int] = field(default_factory=Counter)
    per_operation: Counter[str] = field(default_factory=Counter)
    failures: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def failed(self, case: schemathesis.Case, kind: str, message: str, curl: str) -> None:
        key = (case.operation.label, kind)
        entry = self.failures.setdefault(key, {"operation": key[0], "kind": kind, "count": 0,
                                               "message": message[:600], "curl": curl[:2000]})
        entry["count"] += 1


def _checks() -> list[Any]:
    import schemathesis.checks as builtin

    return [getattr(builtin, name) for name in CHECKS]


def _send(case: schemathesis.Case, headers: dict[str, str], max_tokens: int, tally: Tally,
          checks: list[Any]) -> None:
    bound_generation(case, max_tokens)
    try:
        response = case.call(headers=headers, timeout=REQUEST_TIMEOUT_S)
    except Exception as exc:  # a dropped connection is a failure of the server, not the run
        tally.failed(case, "transport", f"{type(exc).__name__}: {exc}", case.as_curl_command())
        return
    tally.status[response.status_code] += 1
    tally.per_operation[case.operation.label] += 1
    try:
        case.validate_response(response, checks=checks, additional_checks=[error_shape],
                               headers=headers)
    except BaseExceptionGroup as group:
        for failure in group.exceptions:
            kind = getattr(failure, "title", None) or type(failure).__name__
            tally.failed(case, kind, getattr(failure, "message", str(failure)),
                         case.as_curl_command(headers=headers))
    except AssertionError as exc:
        tally.failed(case, type(exc).__name__, str(exc), case.as_curl_command(headers=headers))


def _coverage_cases(schema: Any, op: Any, modes: list[Any], most: int | None) -> list[Any]:
    """Schemathesis's coverage phase for `op`: boundary and type-mismatch cases (the
    smallest float, the largest integer, empty strings, missing fields, ...), all of them or
    `most`, spread evenly over the list."""
    if most == 0:
        return []
    cases = list(schema.iter_coverage_cases(
        op, generation_modes=modes, generation_config=schema.config.generation_for(operation=op)))
    if most is None or len(cases) <= most:
        return cases
    return [cases[i * len(cases) // most] for i in range(most)]


def fuzz(url: str, examples: int, api_key: str | None = None, seed: int = 0,
         max_tokens: int = 8, coverage: int | None = None,
         progress: bool = False) -> dict[str, Any]:
    """Send Schemathesis's coverage cases (all, or at most `coverage` per operation) and
    about `examples` generated requests (split over the operations and both generation
    modes) to the server at `url`, and check each answer; returns the summary the module
    docstring describes. `progress`: a line on stderr after each operation."""
    start = time.monotonic()
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    operations = [result.ok() for result in schema.get_all_operations()]
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    per_run = max(1, examples // (len(operations) * len(modes)))
    tally = Tally()
    checks = _checks()
    seconds: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    for op in operations:
        op_start = time.monotonic()
        before = sum(tally.status.values())
        for case in _coverage_cases(schema, op, list(modes), coverage):
            _send(case, headers, max_tokens, tally, checks)
        phases["coverage"] += sum(tally.status.values()) - before
        before = sum(tally.status.values())
        for mode in modes:
            try:
                strategy = op.as_strategy(generation_mode=mode)
            except Exception as exc:  # e.g. nothing to make invalid in a GET without inputs
                tally.errors.append(f"{op.label} {mode.value}: {type(exc).__name__}: {exc}")
                continue

            @hypothesis.settings(max_examples=per_run, database=None, deadline=None,
                                 phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                                 print_blob=False)
            @hypothesis.seed(seed)
            @hypothesis.given(strategy)
            def run(case: schemathesis.Case) -> None:
                _send(case, headers, max_tokens, tally, checks)

            try:
                run()
            except (hypothesis.errors.Unsatisfiable, hypothesis.errors.FailedHealthCheck) as exc:
                if mode is schemathesis.GenerationMode.POSITIVE:  # negative: may be impossible
                    tally.errors.append(f"{op.label} {mode.value}: {exc}")
        phases["fuzzing"] += sum(tally.status.values()) - before
        seconds[op.label] = round(time.monotonic() - op_start, 1)
        if progress:
            print(f"{op.label}: {seconds[op.label]} s, {sum(tally.status.values())} requests "
                  "so far", file=sys.stderr, flush=True)
    server_errors = sum(n for status, n in tally.status.items() if status >= 500)
    return {
        "url": url, "operations": len(operations), "examples_per_operation_and_mode": per_run,
        "seed": seed, "max_tokens": max_tokens,
        "requests": sum(tally.status.values()), "requests_per_phase": dict(phases),
        "status": {str(k): v for k, v in sorted(tally.status.items())},
        "server_errors": server_errors,
        "failures": sorted(tally.failures.values(), key=lambda f: (f["operation"], f["kind"])),
        "generation_errors": tally.errors,
        "seconds": round(time.monotonic() - start, 1),
        "requests_per_operation": dict(tally.per_operation.most_common()),
        "seconds_per_operation": dict(seconds.most_common()),
    }


@contextmanager
def _serve(model: str, ctx_size: int, api_key: str) -> Iterator[str]:
    import os

    from app.bench.server_process import free_port, running

    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--model", model, "--port", str(port),
           "--ctx-size", str(ctx_size), "--api-key", api_key]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "passive"}
    env.pop("TANDEM_API_KEY", None)
    with running(cmd, port, timeout=300, env=env) as url:
        yield url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.bench.fuzz", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start `tandem serve`)")
    parser.add_argument("--api-key", help="the running server's API key")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="model to serve when starting one (default: the embedded model)")
    parser.add_argument("--ctx-size", type=int, default=2048,
                        help="context of the started server, tokens (default 2048)")
    parser.add_argument("--examples", type=int, default=2000,
                        help="generated requests in all, after the coverage cases (default 2000)")
    parser.add_argument("--coverage", type=int, default=None,
                        help="most coverage cases per operation (default: all; 0: none)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    parser.add_argument("--max-tokens", type=int, default=8,
                        help="most reply tokens a valid generated request asks for (default 8)")
    args = parser.parse_args(argv)
    if args.url:
        summary = fuzz(args.url.rstrip("/"), args.examples, args.api_key, args.seed,
                       args.max_tokens, args.coverage, progress=True)
    else:
        with _serve(args.model, args.ctx_size, "fuzz-key") as url:
            summary = fuzz(url, args.examples, "fuzz-key", args.seed, args.max_tokens,
                           args.coverage, progress=True)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return 1 if summary["server_errors"] or summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
