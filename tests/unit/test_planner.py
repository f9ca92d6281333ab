"""`tandem two-box plan` (app/disagg/planner.py): the roofline arithmetic exactly, EXO Labs'
published Spark + M3 Ultra figures within 15%, the inferred output length, a workload where
the second box does not pay, the data file's errors and overrides, and the CLI."""

from __future__ import annotations

import json
import math

import pytest

from app.cli import main
from app.commands.two_box import EXO_OUTPUT_TOKENS
from app.disagg.planner import PlannerError, load_catalog, plan

CATALOG = load_catalog()
LLAMA = CATALOG.model("llama-3.1-8b")
SPARK, MAC = CATALOG.device("spark"), CATALOG.device("m3-ultra")
PROMPT = 8192


def exo_plan():
    return plan(SPARK, MAC, LLAMA, CATALOG.link("10gbe"), PROMPT, EXO_OUTPUT_TOKENS)


def test_model_arithmetic_is_exact() -> None:
    assert LLAMA.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072  # 128 KiB
    assert LLAMA.kv_bytes_per_token * PROMPT == 2**30  # 1 GiB at 8K, 32 MiB per layer
    assert LLAMA.matmul_params == 8_030_261_248 - 2 * 128256 * 4096
    assert LLAMA.prefill_flops(PROMPT) == (2 * LLAMA.matmul_params * PROMPT + 2 * 128256 * 4096
                                           + 2 * 32 * 32 * 128 * PROMPT * (PROMPT + 1))
    assert LLAMA.decode_weight_bytes == (8_030_261_248 - 128256 * 4096) * 2
    # step t reads the weights and PROMPT + t tokens of KV
    assert LLAMA.decode_bytes(PROMPT, 3) == 3 * LLAMA.decode_weight_bytes + 131072 * (
        3 * PROMPT + 3)
    assert SPARK.flops_per_s == 100e12 * 0.90 and MAC.bytes_per_s == 819e9 * 0.70


def test_exo_transfer_hides_behind_prefill_but_one_layer() -> None:
    p = exo_plan()
    wire_s = 2**30 / 1.15e9
    assert p.kv_transfer_s == pytest.approx(wire_s + 1e-4)
    assert p.exposed_transfer_s == pytest.approx(wire_s / 32 + 1e-4)  # ~29 ms
    assert p.split_total_s == pytest.approx(p.prefill_box.prefill_s + p.exposed_transfer_s
                                            + p.decode_box.decode_s)
    assert p.serial_split_total_s == pytest.approx(p.split_total_s + wire_s * 31 / 32)


# EXO Labs, blog.exolabs.net/nvidia-dgx-spark (shared/notes/two-box.md section 1)
EXO_FIGURES = {
    "spark prefill": (lambda p: p.prefill_box.prefill_s, 1.47),
    "m3-ultra generation": (lambda p: p.decode_box.decode_s, 0.85),
    "m3-ultra prefill": (lambda p: p.decode_box.prefill_s, 5.57),
    "spark generation": (lambda p: p.prefill_box.decode_s, 2.87),
    "split total": (lambda p: p.split_total_s, 2.32),
    "speedup vs m3-ultra": (lambda p: p.speedup_vs_decode_box, 2.8),
    "speedup vs spark": (lambda p: p.speedup_vs_prefill_box, 1.87),
}


@pytest.mark.parametrize("figure", EXO_FIGURES)
def test_exo_figures_within_15_percent(figure: str) -> None:
    predicted, published = EXO_FIGURES[figure]
    assert predicted(exo_plan()) == pytest.approx(published, rel=0.15)


def test_exo_verdict_pays_against_the_spark() -> None:
    p = exo_plan()
    assert p.pays and p.best_single.device == "spark"
    assert p.speedup_vs_best == p.speedup_vs_prefill_box
    assert p.verdict.startswith("the second box pays: split 2.39 s vs spark alone 4.16 s")


def test_inferred_exo_output_length_is_32() -> None:
    """EXO did not publish it: the generation times at 100% bandwidth bound it (43 and 49
    tokens); at the shared calibrated efficiency the best fit is 32 (devices.toml)."""
    step = LLAMA.decode_bytes(PROMPT, 1)
    mac_max = 0.85 * MAC.memory_bandwidth_gbs * 1e9 / step
    spark_max = 2.87 * SPARK.memory_bandwidth_gbs * 1e9 / step
    assert (round(mac_max), round(spark_max)) == (43, 49)
    assert SPARK.bandwidth_efficiency == MAC.bandwidth_efficiency
    assert round(MAC.bandwidth_efficiency * math.sqrt(mac_max * spark_max)) == EXO_OUTPUT_TOKENS


def test_short_prompt_long_output_on_a_slow_link_does_not_pay() -> None:
    p = plan(SPARK, MAC, LLAMA, CATALOG.link("1gbe"), 256, 512)
    assert p.best_single.device == "m3-ultra"
    assert not p.pays and p.speedup_vs_best < 1
    # the 32 MiB of KV takes longer than the Spark's prefill: most of it is exposed
    assert p.exposed_transfer_s > p.prefill_box.prefill_s
    assert p.verdict.startswith("the second box does not pay: split ")
    assert p.verdict.endswith("needs more than 1.05x)")


@pytest.mark.parametrize(("lookup", "name", "message"), [
    ("device", "h100",
     "unknown device 'h100'; known devices: m3-ultra, m4-max, rtx-4090, spark"),
    ("link", "wifi", "unknown link 'wifi'; known links: 10gbe, 1gbe, 25gbe, tb5"),
    ("model", "gpt-2", "unknown model 'gpt-2'; known models: llama-3.1-8b, qwen2.5-7b, "
                       "smollm2-135m-instruct"),
])
def test_unknown_names_list_the_known_ones(lookup: str, name: str, message: str) -> None:
    with pytest.raises(PlannerError) as info:
        getattr(CATALOG, lookup)(name)
    assert str(info.value) == message


def test_devices_file_overrides_fields_and_adds_entries(tmp_path) -> None:
    extra = tmp_path / "mine.toml"
    extra.write_text('[devices.spark]\nfp16_tflops = 200\n\n'
                     '[devices.h100]\nmemory_bandwidth_gbs = 3350\nfp16_tflops = 989\n'
                     'compute_efficiency = 0.6\nbandwidth_efficiency = 0.8\n')
    catalog = load_catalog(extra)
    assert catalog.device("spark").fp16_tflops == 200
    assert catalog.device("spark").memory_bandwidth_gbs == 273  # not overridden
    assert catalog.device("h100").description == "h100"
    faster = plan(catalog.device("spark"), MAC, LLAMA, CATALOG.link("10gbe"), PROMPT, 32)
    assert faster.prefill_box.prefill_s == pytest.approx(exo_plan().prefill_box.prefill_s / 2)


@pytest.mark.parametrize(("text", "message"), [
    ("[devices.x]\nfp16_tflops = 1\n", "x: missing memory_bandwidth_gbs, compute_efficiency, "
                                       "bandwidth_efficiency"),
    ("[devices.spark]\ntflops = 1\n", "spark: unknown tflops"),
    ("[devices.spark]\nbandwidth_efficiency = 1.5\n", "bandwidth_efficiency must be in (0, 1]"),
    ("[devices.spark]\nfp16_tflops = -1\n", "fp16_tflops must be a positive number, not -1"),
    ("[gpus.x]\na = 1\n", "unknown table [gpus]"),
])
def test_bad_devices_file(tmp_path, text: str, message: str) -> None:
    extra = tmp_path / "bad.toml"
    extra.write_text(text)
    with pytest.raises(PlannerError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        load_catalog(extra)


def test_cli_json_is_the_exo_case_by_default(capsys) -> None:
    assert main(["two-box", "plan", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["model"], out["prompt"], out["output"], out["link"]) == (
        "llama-3.1-8b", 8192, EXO_OUTPUT_TOKENS, "10gbe")
    assert out == json.loads(json.dumps(exo_plan().to_dict()))
    assert out["prefill_box"]["device"] == "spark" and out["pays"] is True


def test_cli_table_and_errors(capsys, tmp_path) -> None:
    assert main(["two-box", "plan", "--prompt", "256", "--output", "512",
                 "--link", "1gbe"]) == 0
    out = capsys.readouterr().out
    assert "m3-ultra alone" in out and "verdict: the second box does not pay" in out
    assert main(["two-box", "plan", "--decode-device", "h100"]) == 1
    assert capsys.readouterr().err == ("tandem: error: unknown device 'h100'; known devices: "
                                       "m3-ultra, m4-max, rtx-4090, spark\n")
    assert main(["two-box", "plan", "--devices", str(tmp_path / "none.toml")]) == 1
    assert "none.toml" in capsys.readouterr().err


# -- `--list` and `--here` --------------------------------------------------------------------


def test_cli_list_prints_every_entry_with_its_figures_and_source(capsys) -> None:
    assert main(["two-box", "plan", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "devices (devices.toml):",
        "  spark: NVIDIA DGX Spark (GB10, 128 GB LPDDR5x): 273 GB/s, 100 TFLOPS FP16, "
        "efficiency 0.9 compute, 0.7 bandwidth",
        "    source: bandwidth: NVIDIA DGX Spark spec sheet; FP16: EXO Labs blog; efficiencies "
        "calibrated on EXO's Spark + M3 Ultra measurement"]
    at = lines.index("links:")
    assert lines[at + 3:at + 5] == [
        "  10gbe: 10 Gigabit Ethernet (EXO's link): 1.15 GB/s usable, 0.1 ms one way",
        "    source: assumed: TCP goodput at 92% of the 10 Gb/s line rate (~1.15 GB/s)"]
    assert "  smollm2-135m-instruct: SmolLM2-135M-Instruct, GGUF Q4_1 (HuggingFaceTB/"\
        "SmolLM2-135M-Instruct): 134,515,008 parameters, 30 layers, 3 KV heads x 64, KV 23,040 "\
        "B per token" in lines
    assert lines[-1] == ("(add or override entries with --devices FILE; --here adds this "
                         "machine)")
    names = [ln.split(":")[0].strip() for ln in lines
             if ln.startswith("  ") and not ln.startswith("    ")]
    assert names == [*CATALOG.devices, *CATALOG.links, *CATALOG.models]
    assert all(ln != "    source: -" for ln in lines)  # every built-in entry cites one


def test_here_reads_the_kv_geometry_from_the_gguf(embedded_model) -> None:
    from app.disagg.here import model_shape

    shape = model_shape(embedded_model, "smollm2-135m-instruct")
    assert (shape.layers, shape.heads, shape.kv_heads, shape.head_dim, shape.hidden,
            shape.vocab, shape.params, shape.tied_embeddings, shape.kv_bytes_per_elem) == (
        30, 9, 3, 64, 576, 49152, 134_515_008, True, 2.0)
    assert shape.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23_040
    assert shape.weight_bytes_per_param == 96_576_768 / 134_515_008  # the tensors' bytes
    # the hand-written table entry agrees with the file
    table = CATALOG.model("smollm2-135m-instruct")
    assert [getattr(shape, f) for f in ("params", "layers", "heads", "kv_heads", "head_dim",
                                        "hidden", "vocab", "tied_embeddings")] == [
        getattr(table, f) for f in ("params", "layers", "heads", "kv_heads", "head_dim",
                                    "hidden", "vocab", "tied_embeddings")]


def test_cli_here_on_the_embedded_model(embedded_model, monkeypatch, capsys) -> None:
    import os
    import platform

    from app.disagg import here

    # the measurement itself is timing (tests/integration/test_two_box_plan_here.py runs it)
    monkeypatch.setattr(here, "measure", lambda path, threads=None, remeasure=False:
                        here.Measured("llamacpp", 2, 0.010, 512, 2.0, True))
    assert main(["two-box", "plan", "--here", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    shape = here.model_shape(embedded_model, "smollm2-135m-instruct")
    assert {k: out["model_shape"][k] for k in ("layers", "kv_heads", "head_dim",
                                               "kv_bytes_per_elem")} == {
        "layers": 30, "kv_heads": 3, "head_dim": 64, "kv_bytes_per_elem": 2.0}
    assert (out["model"], out["prefill_box"]["device"], out["decode_box"]["device"]) == (
        "smollm2-135m-instruct", "spark", "here")
    assert out["here"]["fp16_tflops"] == shape.prefill_flops(512) / 2.0 / 1e12
    assert out["here"]["memory_bandwidth_gbs"] == shape.decode_bytes(128, 1) / 0.010 / 1e9
    assert out["kv_bytes"] == 23_040 * 8192
    # a q8_0 cache on both boxes: 34 bytes per 32 values on the wire and in decode's reads
    assert main(["two-box", "plan", "--here", "--json", "--kv-cache-type", "q8_0"]) == 0
    q8 = json.loads(capsys.readouterr().out)
    assert (q8["model_shape"]["kv_bytes_per_elem"], q8["kv_bytes"]) == (34 / 32, 12_240 * 8192)
    assert main(["two-box", "plan", "--json", "--kv-cache-type", "q8_0"]) == 0  # a table model
    assert json.loads(capsys.readouterr().out)["kv_bytes"] == 2 * 32 * 8 * 128 * 34 / 32 * 8192
    # the decode step the planner predicts for this box is the one measured (128 of context)
    assert out["decode_box"]["decode_s"] == pytest.approx(
        0.010 * shape.decode_bytes(8192, 32) / shape.decode_bytes(128, 1))

    assert main(["two-box", "plan", "--here", "--prefill-device", "here"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cpu = platform.processor() or platform.machine()
    assert lines[:2] == [
        f"here: this machine ({cpu}, {os.cpu_count()} cores, 2 threads, llamacpp): cached "
        f"(--remeasure to measure again) with smollm2-135m-instruct: prefill 512 tokens in "
        f"2.000 s (256 tok/s), decode 10.0 ms/token; achieved "
        f"{shape.prefill_flops(512) / 2.0 / 1e12:.3g} TFLOPS, "
        f"{shape.decode_bytes(128, 1) / 0.010 / 1e9:.3g} GB/s",
        "model: smollm2-135m-instruct (SmolLM2-135M-Instruct.Q4_1.gguf): 30 layers, 9 heads, "
        "3 KV heads, head dim 64, KV f16: 23,040 B per token (2 x 30 x 3 x 64 x 2); "
        "134,515,008 parameters, 0.72 B each"]
    assert "here alone" in lines[3] or any(ln.startswith("here alone") for ln in lines)
    assert any(ln.startswith("split here -> m3-ultra") for ln in lines)


def test_cli_here_flags_need_here(capsys) -> None:
    assert main(["two-box", "plan", "--threads", "2"]) == 1
    assert capsys.readouterr().err == ("tandem: error: --threads is for --here, which is not "
                                       "given\n")
