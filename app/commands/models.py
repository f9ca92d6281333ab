"""`tandem models list | pull NAME | path NAME | convert NAME --to mlx|q8_0|q4_0|f16`: the
model store."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "models", help="list, download and locate known models",
        description="The model registry: list the known models with their size and whether "
        "they are downloaded, pull (download and verify) one, print a downloaded model's path, "
        "convert a GGUF model for the MLX backend, or requantize it to a weight format whose "
        "multi-token steps are cheap (q8_0, q4_0: speculative decoding verifies faster).")
    actions = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")

    actions.add_parser("list", help="known models, their size and whether they are downloaded")

    pull = actions.add_parser("pull", help="download and verify a model (no-op if verified)")
    pull.add_argument("name", help="registry name (e.g. smollm2-135m-instruct) or a Hugging "
                      "Face file, owner/repo/file.gguf (through the huggingface-hub cache; "
                      "HF_HUB_OFFLINE=1 uses the cache only)")
    pull.add_argument("--quiet", action="store_true", help="no progress bar (default: shown)")

    path = actions.add_parser("path", help="print a downloaded model's file path")
    path.add_argument("name", help="registry name")

    convert = actions.add_parser("convert", help="convert a GGUF model for MLX, or requantize "
                                 "it (q8_0, q4_0, f16)")
    convert.add_argument("name", help="registry name or path to a .gguf")
    convert.add_argument("--to", choices=["mlx", "q8_0", "q4_0", "f16"], required=True,
                         help="target: an MLX directory, or a GGUF requantized by llama.cpp's "
                         "quantizer into the store (q8_0 keeps the source's quality at about "
                         "twice a 4-bit size; q4_0 loses some)")
    convert.add_argument("--dtype", choices=["float16", "bfloat16", "float32"],
                         default="float16", help="weight dtype of the converted model "
                         "(default: float16)")
    convert.add_argument("--quantize-bits", type=int, choices=[4, 8], default=None,
                         help="with --to mlx: requantize to MLX's affine format, bits per "
                         "weight (lossy; default: keep --dtype)")

    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from models.errors import ModelStoreError

    try:
        if args.models_command == "list":
            return _list()
        if args.models_command == "pull":
            return _pull(args.name, progress=not args.quiet)
        if args.models_command == "convert":
            return _convert(args)
        return _path(args.name)
    except (ModelStoreError, FileNotFoundError, ValueError, ImportError, RuntimeError) as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 1


def _convert(args: argparse.Namespace) -> int:
    from models.store import resolve_model

    source = resolve_model(args.name)
    if args.to != "mlx":
        return _requantize(source, args.to)
    from backends.mlx.convert import convert_gguf_to_mlx

    out = convert_gguf_to_mlx(source, dtype=args.dtype, quantize_bits=args.quantize_bits)
    print(out)
    return 0


def _requantize(source, to: str) -> int:
    """`convert --to q8_0|q4_0|f16`: llama.cpp's quantizer into `<store>/gguf/`; prints the
    new file's path (pass it as `--model`). An existing conversion is kept, not redone."""
    from backends.llamacpp.quantize import quantize_gguf
    from models.store import gguf_conversion_path, is_mlx_dir

    if is_mlx_dir(source):
        raise ValueError(f"{source} is an MLX directory; --to {to} needs a GGUF model")
    out = gguf_conversion_path(source, to)
    if out.is_file() and out.stat().st_mtime >= source.stat().st_mtime:
        print("tandem: already converted", file=sys.stderr)
    else:
        print(f"tandem: requantizing {source.name} to {to} (llama.cpp's quantizer)...",
              file=sys.stderr)
        quantize_gguf(source, out, to)
    print(out)
    return 0


def _list() -> int:
    from rich.console import Console
    from rich.table import Table

    from app.bench.charts import model_and_format
    from models.registry import DEFAULT_MODEL, LLAMA_CPP_DEFAULTS, MODELS, generation_defaults
    from models.store import gguf_conversions, is_present, mlx_conversions, model_path

    table = Table(box=None, pad_edge=False)
    for column in ("name", "size", "present", "sampling defaults", "path"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for name, entry in MODELS.items():
        label = f"{name} (default)" if name == DEFAULT_MODEL else name
        present = "yes" if is_present(name) else "no"
        table.add_row(label, f"{entry.size / 1e6:,.0f} MB", present, entry.defaults.describe(),
                      str(model_path(name)))
    for conv in mlx_conversions():  # `tandem models convert --to mlx` output
        size = sum(f.stat().st_size for f in conv.iterdir() if f.is_file())
        table.add_row(f"{conv.name} (MLX)", f"{size / 1e6:,.0f} MB", "yes",
                      LLAMA_CPP_DEFAULTS.describe(), str(conv))
    for conv in gguf_conversions():  # `tandem models convert --to q8_0|q4_0|f16` output
        fmt = model_and_format(conv)[1].removeprefix("GGUF ")
        table.add_row(f"{conv.stem} ({fmt})", f"{conv.stat().st_size / 1e6:,.0f} MB", "yes",
                      generation_defaults(str(conv)).describe(), str(conv))
    console = Console()
    if not console.is_terminal:
        console = Console(width=240)  # piped: never wrap or cut the paths
    console.print(table)
    return 0


def _pull(name: str, progress: bool) -> int:
    from pathlib import Path

    from models.errors import ModelNotFoundError
    from models.registry import MODELS
    from models.store import hf_spec, pull, pull_hf

    if hf_spec(name) is not None and not Path(name).expanduser().exists():
        print(pull_hf(name))
        return 0
    if name not in MODELS:
        if Path(name).expanduser().exists():
            raise ModelNotFoundError(f"{name} is a local path: nothing to pull; use it as is "
                                     f"(tandem run --model {name} ...)")
        raise ModelNotFoundError(f"unknown model '{name}'; known models: {', '.join(MODELS)} "
                                 "(or a Hugging Face file: owner/repo/file.gguf)")
    print(pull(name, progress=progress))
    return 0


def _path(name: str) -> int:
    from models.store import is_present, model_path

    path = model_path(name)  # raises for unknown names
    if not is_present(name):
        hint = f"run: tandem models pull {name}"
        print(f"tandem: model '{name}' is not downloaded; {hint}", file=sys.stderr)
        return 1
    print(path)
    return 0
