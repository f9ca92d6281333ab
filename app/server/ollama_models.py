"""What Ollama's discovery routes say about the served model (`/api/tags`, `/api/show`,
`/api/ps`), in the shapes of Ollama's `api/types.go` (`ListModelResponse`, `ShowResponse`,
`ProcessModelResponse`, `ModelDetails`).

Names are Ollama's `name:tag`: the served name with `:latest` (`smollm2-135m-instruct:latest`);
a request may name the model with or without the tag, or by any alias the OpenAI routes take.

Facts come from the model file and its GGUF metadata (llama.cpp's `llama_model_meta_*`
through the runner; absent on other backends, which then report the architecture and name
only): `size` (file bytes), `digest` (sha256 of the file: the model store's checked sidecar,
else hashed once), `modified_at` (file time), `details` (`format` "gguf", `family` =
`general.architecture`, `parameter_size` = `general.size_label`, `quantization_level` from
`general.file_type`), `model_info` (GGUF keys; `<arch>.context_length` is the context tandem
serves, not the trained one: it is what clients size prompts by). `capabilities`:
"completion", "tools" when the chat template takes tools (the model's native call format),
"insert" when the model has fill-in-the-middle tokens (`app.server.fim`). `template` is the
GGUF's Jinja chat template, preceded for FIM models by the FIM prompt in Ollama's template
syntax (Continue enables autocomplete when the template mentions `.Suffix`). `parameters`
lists `num_ctx` and the model's default sampling settings, one `key value` per line.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

from app.prompts import call_format
from app.server.context import ServerContext
from app.server.errors import APIError
from app.server.fim import fim_ids, supports_fim
from app.server.generation import OPENAI_DEFAULTS

TAG = ":latest"
# GGUF keys shown in `model_info` (those present), then `<arch>.` keys
_GENERAL = ("general.architecture", "general.basename", "general.name", "general.finetune",
            "general.size_label", "general.file_type", "general.quantization_version",
            "general.type", "general.license")
_ARCH = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
         "attention.head_count_kv", "rope.freq_base", "vocab_size")
_TOKENIZER = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
              "tokenizer.ggml.eos_token_id")
_HASH_CHUNK = 1 << 20


def ollama_name(ctx: ServerContext) -> str:
    """The served model's name as Ollama clients list it (`name:latest`)."""
    return ctx.model_name if ":" in ctx.model_name else ctx.model_name + TAG


def resolve(ctx: ServerContext, requested: str | None) -> str:
    """The name to answer with for a request's `model`: as given (Ollama echoes it), or the
    served one's Ollama name for None or "".

    Raises APIError 404 `model 'x' not found` (Ollama's wording) for any other model."""
    if not requested:
        return ollama_name(ctx)
    base = requested[: -len(TAG)] if requested.lower().endswith(TAG) else requested
    try:
        ctx.resolve_model(base)
    except APIError:
        raise APIError(404, f"model '{requested}' not found", param="model",
                       code="model_not_found") from None
    return requested  # Ollama answers with the name as the request gave it


def _number(text: str | None) -> Any:
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _quantization(file_type: Any) -> str:
    """`general.file_type` (llama.cpp's `llama_ftype`) as Ollama names it, e.g. "Q4_K_M"."""
    if not isinstance(file_type, int):
        return ""
    import gguf

    try:
        name = gguf.LlamaFileType(file_type).name
    except ValueError:
        return ""
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _human(n: int) -> str:
    """A parameter count as Ollama prints it (`format.HumanNumber`): 1.5B, 135M."""
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}".rstrip("0").rstrip(".") + unit
    return str(n)


class ModelFacts:
    """The served model's facts, gathered once per app (`facts(request.app.state, ctx)`)."""

    def __init__(self, ctx: ServerContext):
        engine = ctx.engine
        runner = getattr(engine, "runner", None)
        meta = getattr(runner, "meta", None)
        info = engine.info
        arch = (meta("general.architecture") if meta else None) or info.architecture
        self.name = ollama_name(ctx)
        self.path: Path | None = getattr(engine, "model_path", None)
        self.arch = arch
        model_info: dict[str, Any] = {}
        if meta is not None:
            keys = [*_GENERAL, *(f"{arch}.{k}" for k in _ARCH), *_TOKENIZER]
            for key in keys:
                value = _number(meta(key))
                if value is not None:
                    model_info[key] = value
            n_params = getattr(runner, "n_params", None)
            if n_params:
                model_info["general.parameter_count"] = n_params
        model_info.setdefault("general.architecture", arch)
        model_info.setdefault("general.basename", info.name)
        model_info[f"{arch}.context_length"] = ctx.context_length
        self.model_info = dict(sorted(model_info.items()))
        size_label = model_info.get("general.size_label")
        n = model_info.get("general.parameter_count")
        self.details = {
            "parent_model": "", "format": "gguf", "family": arch, "families": [arch],
            "parameter_size": str(size_label) if size_label else (_human(n) if n else ""),
            "quantization_level": _quantization(model_info.get("general.file_type")),
        }
        tok = engine.tokenizer
        self.fim = supports_fim(tok)
        self.capabilities = ["completion"]
        if tok.chat_template and call_format(tok).kind != "generic":
            self.capabilities.append("tools")
        if self.fim:
            self.capabilities.append("insert")
        template = tok.chat_template or ""
        if self.fim:
            ids = fim_ids(tok)
            pre, suf, mid = (tok.token_text(ids[p]) for p in ("prefix", "suffix", "middle"))
            template = (f"{{{{- if .Suffix }}}}{pre}{{{{ .Prompt }}}}{suf}{{{{ .Suffix }}}}"
                        f"{mid}\n{{{{- else }}}}\n{template}\n{{{{- end }}}}")
        self.template = template
        d = ctx.defaults or OPENAI_DEFAULTS
        params = [("num_ctx", ctx.context_length), ("temperature", d.temperature),
                  ("top_p", d.top_p), ("top_k", d.top_k), ("min_p", d.min_p),
                  ("repeat_penalty", d.repetition_penalty), ("repeat_last_n", d.repeat_last_n)]
        self.parameters = "\n".join(f"{k:<30} {v:g}" if isinstance(v, float)
                                    else f"{k:<30} {v}" for k, v in params)
        self.size = 0
        self.modified_at = dt.datetime.fromtimestamp(ctx.created, dt.UTC)
        if self.path is not None and self.path.is_file():
            st = self.path.stat()
            self.size = st.st_size
            self.modified_at = dt.datetime.fromtimestamp(st.st_mtime, dt.UTC)
        self._digest: str | None = None if self.path else ""
        self._lock = asyncio.Lock()

    async def digest(self) -> str:
        """sha256 of the model file (the store's sidecar when present; else the file is
        hashed once, off the event loop); "" without a file."""
        async with self._lock:
            if self._digest is None:
                self._digest = await asyncio.to_thread(_file_digest, self.path)  # type: ignore[arg-type]
        return self._digest

    def listing(self, digest: str) -> dict[str, Any]:
        """The `/api/tags` entry."""
        return {"name": self.name, "model": self.name, "modified_at": _iso(self.modified_at),
                "size": self.size, "digest": digest, "details": self.details}


def _file_digest(path: Path) -> str:
    sidecar = path.with_name(path.name + ".sha256")
    try:
        if sidecar.stat().st_mtime_ns >= path.stat().st_mtime_ns:
            recorded = sidecar.read_text().split()[0]
            if len(recorded) == 64:
                return recorded
    except (OSError, IndexError):
        pass
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def now_iso() -> str:
    """The current time as Ollama's `created_at` (RFC 3339, UTC)."""
    return _iso(dt.datetime.now(dt.UTC))


def facts(state: Any, ctx: ServerContext) -> ModelFacts:
    """The `ModelFacts` of the model `ctx` serves, built on first use and kept on
    `app.state` (per model name: a server with a model pool serves several)."""
    cache = getattr(state, "ollama_facts", None)
    if cache is None:
        cache = state.ollama_facts = {}
    found = cache.get(ctx.model_name)
    if found is None:
        found = cache[ctx.model_name] = ModelFacts(ctx)
    return found
