"""The composition root: `EngineArgs` -> a running `AsyncEngine`.

The only place that resolves a model, picks a backend and wires runner, engine and step
thread together; every entry point calls `load_engine`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from app.config import EngineArgs, check_two_box_kv, check_worker_kv
from app.disagg.peer import PeerConfig
from app.engine.async_engine import AsyncEngine
from app.engine.engine import LLMEngine
from app.engine.residency import MirroredResidency
from app.engine.spec_decode.draft_model import DraftModelProposer, check_same_vocabulary
from app.engine.spec_decode.speculator import Speculator
from app.spec_profile import load_profile, step_time_curve
from backends.base import Runner
from backends.loader import load_runner
from models.store import resolve_model


def display_name(model: str) -> str:
    """The name an engine reports for `model`: a registry name as given, a file's stem."""
    return Path(model).stem if model.endswith(".gguf") else model


def load_engine(args: EngineArgs, *, pull_missing: bool = True) -> AsyncEngine:
    """Resolve `args.model` (fetching a registry model unless `pull_missing` is False),
    load it on the chosen backend, give it a speculator (measuring or reading the cached
    step-time curves) when speculation is on and the runner truncates exactly, with the
    draft model of `args.draft_model` if given, and start the step thread.

    Raises:
        FileNotFoundError / models.errors.ModelStoreError: no such model (or not fetched).
        ValueError: the backend cannot load it, or the configuration does not fit.
        ImportError: the chosen backend is not installed.
    """
    path = resolve_model(args.model, pull_missing=pull_missing)
    runner, backend_name = load_runner(path, backend=args.backend, config=args.runner)
    opened: list[Runner] = [runner]
    client = None
    try:
        if args.prefill_peer is not None:  # again, now that an automatic backend is chosen
            check_two_box_kv(args.runner.kv_cache_type, backend_name, "with --prefill-peer")
        engine = _build(args, runner, Path(path), backend_name, opened, pull_missing)
        if args.prefill_peer is not None:
            client = _prefill_client(args.prefill_peer, Path(path), runner)
            engine.set_remote_prefill(client)
    except BaseException:
        if client is not None:
            client.close()
        for r in opened:
            r.close()
        raise
    async_engine = AsyncEngine(engine, display_name(args.model), backend_name)
    async_engine.model_path = Path(path)
    if client is not None:
        client.attach(async_engine)
    return async_engine


def load_prefill_engine(args: EngineArgs, *, pull_missing: bool = True
                        ) -> tuple[LLMEngine, Path]:
    """The engine of `tandem prefill-worker` (no speculation, no step thread: the worker
    drives it) and its model file. Raises as `load_engine`, and ValueError if the backend
    cannot export KV."""
    check_worker_kv(args)
    path = Path(resolve_model(args.model, pull_missing=pull_missing))
    runner, backend_name = load_runner(path, backend=args.backend, config=args.runner)
    try:
        check_worker_kv(args, backend_name)  # again, now that an automatic backend is chosen
        if not runner.capabilities.kv_transfer:
            raise ValueError("this backend cannot export KV for a decode box")
    except ValueError:
        runner.close()
        raise
    return LLMEngine(runner, args.engine_config()), path


def _prefill_client(peer: PeerConfig, path: Path, runner: Runner):
    from app.disagg.client import PrefillClient
    from app.disagg.fingerprints import model_fingerprint

    info = runner.info
    return PrefillClient(peer, model_fingerprint(path), info.n_layers, info.n_kv_heads,
                         info.head_dim, kv_cache_type=getattr(runner, "kv_cache_type", "f16"),
                         exact=getattr(runner, "exact", False))


def _build(args: EngineArgs, runner: Runner, path: Path, backend_name: str,
           opened: list[Runner], pull_missing: bool) -> LLMEngine:
    engine_config = args.engine_config()
    speculate = args.spec.enabled and runner.capabilities.exact_truncate
    if not speculate:
        return LLMEngine(runner, engine_config)
    context = min(engine_config.context_length, runner.info.n_ctx_train, runner.max_seq_tokens)
    adaptive = args.spec.fixed_k is None
    # the target's curve, refined from its steps as they run (and saved to the profile)
    online = load_profile(runner, path, backend_name).online_times() if adaptive else None
    residency = draft = draft_curve = None
    if args.draft_model and args.spec.mode != "ngram":
        draft_runner, draft_path = load_draft(args, runner, backend_name, pull_missing)
        opened.append(draft_runner)
        residency = MirroredResidency(runner, draft_runner, runner.block_size)
        draft = DraftModelProposer(draft_runner, residency)
        if adaptive:
            draft_curve = step_time_curve(draft_runner, draft_path, backend_name)[0]
    speculator = Speculator(args.spec, None, context, runner.capabilities.equal_split,
                            draft, draft_curve, online)
    return LLMEngine(runner, engine_config, residency=residency, speculator=speculator)


def load_draft(args: EngineArgs, target: Runner, backend_name: str,
               pull_missing: bool = True) -> tuple[Runner, Path]:
    """The draft model's runner, shaped like the target's (same slots, block size and block
    ids). Raises ValueError naming what differs when its vocabulary is not the target's."""
    draft_path = Path(resolve_model(args.draft_model, pull_missing=pull_missing))
    config = replace(args.runner, kv_tokens=target.num_blocks * target.block_size,
                     block_size=target.block_size)
    draft, _ = load_runner(draft_path, backend=backend_name, config=config)
    try:
        if draft.num_blocks < target.num_blocks or draft.max_seqs < target.max_seqs:
            raise ValueError("its KV cache cannot mirror the target's slots and blocks")
        if not draft.capabilities.exact_truncate:
            raise ValueError("its runner cannot roll back drafts exactly")
        check_same_vocabulary(target, draft)
    except ValueError as exc:
        draft.close()
        raise ValueError(f"draft model {args.draft_model} cannot draft for "
                         f"{args.model}: {exc}") from None
    return draft, draft_path
