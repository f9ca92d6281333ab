"""The paired peer benchmark's round order, summary arithmetic and decode-gap probes."""

from __future__ import annotations

import itertools
import json
import sys
from collections import Counter

import pytest

from app.bench.http import ChatResult
from app.bench.peer_paired import (
    gap_summary,
    per_system,
    probed,
    process_name,
    process_order,
    read_probe,
    round_order,
    summarize,
    system_of,
    turn_result,
)

SYSTEMS = ["tandem", "llama_server", "python_floor"]


def test_round_order_balances_places_and_predecessors():
    orders = [round_order(SYSTEMS, i) for i in range(6)]
    assert orders[0] == ["tandem", "llama_server", "python_floor"]
    assert round_order(SYSTEMS, 6) == orders[0]
    assert len({tuple(o) for o in orders}) == 6
    places = Counter((s, o.index(s)) for o in orders for s in o)
    assert set(places.values()) == {2}  # each system in each place twice
    pairs = Counter(p for o in orders for p in itertools.pairwise(o))
    assert len(pairs) == 6 and set(pairs.values()) == {2}  # each follows each other twice
    assert [round_order(["a", "b"], i) for i in range(3)] == [["a", "b"], ["b", "a"],
                                                             ["a", "b"]]


def test_summary_is_medians_of_per_round_ratios():
    def r(t, b, f):
        return {"tandem": {"tok_s": t, "ttft_ms": t + 100},
                "llama_server": {"tok_s": b, "ttft_ms": b + 100},
                "python_floor": {"tok_s": f, "ttft_ms": f + 100}}

    # a slow round (llama-server at 50) and fast ones (100): tandem's per-round ratios are
    # 0.9, 0.9, 1.0, 1.1 and the floor's 1.0, 0.96, 1.0, 1.04
    rounds = [r(45, 50, 50), r(90, 100, 96), r(100, 100, 100), r(110, 100, 104)]
    s = summarize(rounds)
    assert s["rounds"] == 4
    assert s["throughput_tok_s"] == {"tandem": 95.0, "llama_server": 100.0,
                                     "python_floor": 98.0}
    assert s["ttft_ms_p50"] == {"tandem": 195.0, "llama_server": 200.0, "python_floor": 198.0}
    assert s["ratio_to_llama_server"] == {
        "tandem": {"median": 0.95, "q1": 0.9, "q3": 1.075},
        "python_floor": {"median": 1.0, "q1": 0.97, "q3": 1.03},
    }


def test_summary_needs_two_rounds():
    with pytest.raises(ValueError, match="1 round"):
        summarize([{"tandem": {"tok_s": 1, "ttft_ms": 1},
                    "llama_server": {"tok_s": 1, "ttft_ms": 1}}])


def test_probed_runs_the_module_under_the_probe():
    cmd = [sys.executable, "-m", "app.cli", "serve", "--port", "8"]
    assert probed(cmd, "/t/tandem.json") == [sys.executable, "-m", "app.bench.decode_probe",
                                             "/t/tandem.json", "app.cli", "serve", "--port", "8"]
    with pytest.raises(ValueError, match="not a `python -m` command"):
        probed(["/bin/llama-server", "-m", "model.gguf"], "/t/x.json")


def test_gap_summary_and_probe_files(tmp_path):
    good = tmp_path / "tandem.json"
    good.write_text(json.dumps({"decodes": 9, "decode_us_p50": 9000.0, "gaps": 7,
                                "gap_us_p50": 450.0}))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    floor = {"decodes": 9, "decode_us_p50": 8900.0, "gaps": 7, "gap_us_p50": 225.0}
    tandem = read_probe(str(good))
    assert gap_summary({"tandem": tandem, "python_floor": floor}) == {
        "decode_gaps": {"tandem": tandem, "python_floor": floor},
        "gap_tandem_to_python_floor": 2.0}
    assert read_probe(str(bad)) is None and read_probe(str(tmp_path / "none.json")) is None
    assert gap_summary({"tandem": tandem, "python_floor": None}) == {
        "decode_gaps": {"tandem": tandem, "python_floor": None}}


def test_replica_processes_take_turns_within_each_round():
    assert [process_name("tandem", k) for k in range(3)] == ["tandem", "tandem#2", "tandem#3"]
    assert [system_of(p) for p in ("tandem", "tandem#2", "python_floor#3")] == [
        "tandem", "tandem", "python_floor"]
    assert process_order(SYSTEMS, 1, 4) == round_order(SYSTEMS, 4)  # one replica: as before
    assert process_order(SYSTEMS, 2, 0) == [
        "tandem", "llama_server", "python_floor",  # round_order(0)
        "tandem#2", "python_floor#2", "llama_server#2"]  # round_order(1)
    orders = [process_order(SYSTEMS, 2, i) for i in range(6)]
    places = Counter((p, o.index(p)) for o in orders for p in o)
    assert len(places) == 18 and set(places.values()) == {2}  # 6 processes x 3 places x 2


def test_a_systems_round_is_the_mean_of_its_processes():
    rounds = [{"tandem": {"tok_s": 90, "ttft_ms": 200}, "llama_server": {"tok_s": 100,
                                                                        "ttft_ms": 150},
               "tandem#2": {"tok_s": 110, "ttft_ms": 100},
               "llama_server#2": {"tok_s": 80, "ttft_ms": 170}}]
    assert per_system(rounds, ["tandem", "llama_server"]) == [
        {"tandem": {"tok_s": 100.0, "ttft_ms": 150.0},
         "llama_server": {"tok_s": 90.0, "ttft_ms": 160.0}}]


def test_gap_summary_averages_replicas():
    def probe(gap):
        return {"decodes": 9, "decode_us_p50": 9000.0, "gaps": 7, "gap_us_p50": gap}

    probes = {"tandem": probe(400.0), "python_floor": probe(200.0), "tandem#2": probe(600.0),
              "python_floor#2": probe(250.0)}
    assert gap_summary(probes) == {"decode_gaps": probes, "gap_tandem_to_python_floor": 2.222}


def test_a_turn_of_requests_sent_at_once():
    results = [ChatResult(ttft=0.5, tpot=0.3, completion_tokens=128, prompt_tokens=70,
                          cached_tokens=None),
               ChatResult(ttft=1.5, tpot=0.31, completion_tokens=128, prompt_tokens=70,
                          cached_tokens=None),
               ChatResult(ttft=2.5, tpot=None, completion_tokens=1, prompt_tokens=70,
                          cached_tokens=None)]
    # 257 tokens in 10 s; TTFT median of 500, 1500, 2500; TPOT of the two that have one
    assert turn_result(results, 10.0) == {"tok_s": 25.7, "ttft_ms": 1500.0, "tpot_ms": 305.0}
    assert turn_result(results[2:], 2.0)["tpot_ms"] == 0.0
    for bad in (([], 1.0), (results, 0.0)):
        with pytest.raises(ValueError, match="request"):
            turn_result(*bad)


def test_summary_and_system_means_carry_tpot_when_measured():
    rounds = [{"tandem": {"tok_s": 40.0, "ttft_ms": 900.0, "tpot_ms": 310.0},
               "llama_server": {"tok_s": 50.0, "ttft_ms": 2000.0, "tpot_ms": 290.0},
               "tandem#2": {"tok_s": 44.0, "ttft_ms": 1100.0, "tpot_ms": 330.0},
               "llama_server#2": {"tok_s": 50.0, "ttft_ms": 2000.0, "tpot_ms": 300.0}}] * 2
    by_system = per_system(rounds, ["tandem", "llama_server"])
    assert by_system[0] == {"tandem": {"tok_s": 42.0, "ttft_ms": 1000.0, "tpot_ms": 320.0},
                            "llama_server": {"tok_s": 50.0, "ttft_ms": 2000.0,
                                             "tpot_ms": 295.0}}
    s = summarize(by_system)
    assert s["tpot_ms_p50"] == {"tandem": 320.0, "llama_server": 295.0}
    assert s["ratio_to_llama_server"] == {"tandem": {"median": 0.84, "q1": 0.84, "q3": 0.84}}
