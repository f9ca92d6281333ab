"""Shared fixtures and the test tiers.

The embedded model (`embedded_model`) has one policy: it is there when `installers/install.sh`
installed it; when it is missing its tests skip with the `tandem models pull` hint, unless
`TANDEM_FETCH_TEST_MODELS=1`, which fetches it into the store.

Markers (registered in pyproject.toml), applied here by directory and fixture:
- `model`: needs the embedded model (every test using one of `MODEL_FIXTURES`, everything in
  tests/integration, the e2e tests on the real server); `pytest -m "not model"` is a run
  without a model;
- `mlx`: tests of the MLX backend (tests/mlx; those that need mlx itself skip without it);
- `slow`: long diagnostics, set on the test itself.

The whole session runs against a temporary model store (`_temporary_store`): the user's model
files are linked in, and everything the code caches beside them (step-time profiles, repack
probes, fingerprints) starts empty and is thrown away, so no test reads a profile another
machine or session measured, and none writes the user's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MODEL_FIXTURES = {
    "embedded_model", "embedded_model_path", "reference_llama", "gguf_path", "qwen_path",
    "repacking_model",
}


# TANDEM_HOME as the session found it ("": unset), i.e. where the user's store is
_USER_HOME_KEY = "_TANDEM_TESTS_USER_HOME"


def _link_models(user_store: Path, store: Path) -> None:
    """Symlink every file at the top of `user_store` (models and their .sha256 sidecars;
    not its cache directories) into `store`, where not linked yet."""
    if not user_store.is_dir():
        return
    for f in user_store.iterdir():
        if f.is_file() and not (store / f.name).exists():
            (store / f.name).symlink_to(f.resolve())


@contextmanager
def _user_home() -> Iterator[None]:
    """TANDEM_HOME as the session found it, inside the block."""
    with pytest.MonkeyPatch.context() as mp:
        home = os.environ.get(_USER_HOME_KEY, "")
        if home:
            mp.setenv("TANDEM_HOME", home)
        else:
            mp.delenv("TANDEM_HOME", raising=False)
        yield


@pytest.fixture(scope="session", autouse=True)
def _temporary_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """TANDEM_HOME for the whole session (and the servers it starts): a temporary directory
    whose `models/` links the user's model files; profiles, probes and fingerprints are
    measured there afresh. Yields that store."""
    from models.store import store_dir

    user_home = os.environ.get("TANDEM_HOME", "")
    user_store = store_dir()
    home = tmp_path_factory.mktemp("tandem-home")
    store = home / "models"
    store.mkdir()
    _link_models(user_store, store)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_USER_HOME_KEY, user_home)
        mp.setenv("TANDEM_HOME", str(home))
        yield store


def store_model(name: str) -> Path:
    """Path of registry model `name` in the (temporary) model store, by the one policy
    above: skip when it is missing, unless TANDEM_FETCH_TEST_MODELS=1 (then fetch it into
    the user's store, where it stays, and link it in)."""
    from models.store import is_present, model_path, pull, store_dir

    if is_present(name):
        return model_path(name)
    if os.environ.get("TANDEM_FETCH_TEST_MODELS") == "1":
        with _user_home():
            pull(name)
            user_store = store_dir()
        _link_models(user_store, store_dir())
        return model_path(name)
    with _user_home():
        user_store = store_dir()
    pytest.skip(f"{name} is not in the model store ({user_store}): run "
                f"`tandem models pull {name}`, or set TANDEM_FETCH_TEST_MODELS=1")


@pytest.fixture(scope="session")
def embedded_model() -> Path:
    """Path of the embedded default GGUF (SmolLM2-135M-Instruct Q4_1) in the model store."""
    from models.registry import DEFAULT_MODEL

    return store_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def repacking_model(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model requantized to Q4_0 (about 2 s, once per session): a type that
    llama.cpp repacks on the CPU (the Q4_1 original has none), for the repacked-weights
    tests. 91.7 MB in a temporary directory."""
    from backends.llamacpp.quantize import quantize_gguf

    out = tmp_path_factory.mktemp("repack") / "smollm2-135m-q4_0.gguf"
    quantize_gguf(embedded_model, out, "q4_0", n_threads=2)
    return out


@pytest.fixture(scope="session")
def embedded_model_path(embedded_model: Path) -> str:
    """`embedded_model` as a string (the name older tests use)."""
    return str(embedded_model)


@pytest.fixture(scope="session")
def reference_llama(embedded_model_path):
    """llama-cpp-python's high-level `Llama` on the embedded model, as the reference, loaded
    with the runner's model params (`backends.llamacpp.runtime.patched_default_params`)."""
    import llama_cpp

    from backends.llamacpp.repack import repack_verdict
    from backends.llamacpp.runtime import patched_default_params

    with patched_default_params(repack_verdict(embedded_model_path).repack):
        llm = llama_cpp.Llama(embedded_model_path, n_ctx=2048, n_batch=512, n_threads=2,
                              flash_attn=True, verbose=False)
    yield llm
    llm.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path)).resolve()
        if TESTS / "integration" in path.parents or MODEL_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.model)
        if TESTS / "mlx" in path.parents:
            item.add_marker(pytest.mark.mlx)
