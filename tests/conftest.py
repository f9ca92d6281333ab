"""Shared fixtures: the embedded model (fetched into the store if missing)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def embedded_model_path() -> str:
    """Path of the embedded default GGUF (SmolLM2-135M-Instruct Q4_1)."""
    from models.registry import DEFAULT_MODEL
    from models.store import resolve_model

    return str(resolve_model(DEFAULT_MODEL))


@pytest.fixture(scope="session")
def reference_llama(embedded_model_path):
    """llama-cpp-python's high-level `Llama` on the embedded model, as the reference.

    Its model loader has no `use_extra_bufts` argument; AMX repacking crashes on CPUs whose
    kernel refuses AMX tiles, so the default model params are patched while it loads.
    """
    import llama_cpp
    from llama_cpp import llama as llama_module

    original = llama_cpp.llama_cpp.llama_model_default_params

    def patched():
        params = original()
        params.use_extra_bufts = False
        return params

    llama_module.llama_cpp.llama_model_default_params = patched
    try:
        llm = llama_cpp.Llama(embedded_model_path, n_ctx=2048, n_batch=512, n_threads=2,
                              flash_attn=True, verbose=False)
    finally:
        llama_module.llama_cpp.llama_model_default_params = original
    yield llm
    llm.close()
