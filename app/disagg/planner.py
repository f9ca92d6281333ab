"""Does a second box pay? A roofline prediction of prefill on one box, decode on another.

Units: seconds, bytes, FLOPs; GB = 1e9 bytes, TFLOPS = 1e12 FLOP/s. The numbers (devices,
links, model shapes) live in `devices.toml` next to this file, with their sources.

- Prefill is compute-bound: FLOPs = 2 * matmul_params * prompt (every weight is one
  multiply-add per token) + causal attention 2 * layers * heads * head_dim * s * (s + 1)
  (QK^T and AV) + the LM head for the last token, divided by peak FLOP/s * efficiency.
  `matmul_params` leaves out the token-embedding table (a lookup, no FLOPs) and the LM head
  (only the last prompt token needs logits).
- Decode is bandwidth-bound: each output token reads the weights plus the KV of its context
  (prompt + tokens so far), divided by peak bandwidth * efficiency.
- The KV (2 * layers * kv_heads * head_dim * kv_bytes_per_elem bytes per prompt token) goes
  over the link per layer while the next layer computes; what stays exposed is
  max(0, transfer - prefill) + one layer's transfer + the link latency
  (shared/notes/two-box.md, section 1).

totals: a box alone = its prefill + its decode; split = prefill box's prefill + exposed
transfer + decode box's decode. The split pays when it beats the best single box by more
than `PAY_MARGIN`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

PAY_MARGIN = 0.05  # the split must be more than 5% faster than the best single box
GB = 1e9
TFLOPS = 1e12


class PlannerError(ValueError):
    """A bad name or a bad data file; the message is for the user."""


@dataclass(frozen=True, slots=True)
class Device:
    """One box. memory_bandwidth_gbs: peak memory bandwidth, GB/s. fp16_tflops: dense FP16
    matmul peak, TFLOPS. compute_efficiency / bandwidth_efficiency: the fraction of each peak
    an inference engine achieves (0..1]."""

    name: str
    description: str
    memory_bandwidth_gbs: float
    fp16_tflops: float
    compute_efficiency: float
    bandwidth_efficiency: float
    source: str = ""  # where the figures come from

    @property
    def flops_per_s(self) -> float:
        """Achievable FLOP/s."""
        return self.fp16_tflops * TFLOPS * self.compute_efficiency

    @property
    def bytes_per_s(self) -> float:
        """Achievable memory bandwidth, bytes/s."""
        return self.memory_bandwidth_gbs * GB * self.bandwidth_efficiency


@dataclass(frozen=True, slots=True)
class Link:
    """The network between the boxes. usable_gbs: goodput, GB/s (not line rate).
    latency_ms: one-way latency, milliseconds, paid once per transfer."""

    name: str
    description: str
    usable_gbs: float
    latency_ms: float
    source: str = ""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A dense decoder-only transformer. params: all parameters. heads / kv_heads: query and
    key-value attention heads. vocab: embedding rows. tied_embeddings: the LM head is the
    embedding table. weight_bytes_per_param / kv_bytes_per_elem: storage sizes, bytes."""

    name: str
    description: str
    params: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    tied_embeddings: bool
    weight_bytes_per_param: float
    kv_bytes_per_elem: float
    source: str = ""

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def matmul_params(self) -> int:
        """Parameters multiplied once per prompt token (no embedding table, no LM head)."""
        return self.params - self.embedding_params * (1 if self.tied_embeddings else 2)

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token over all layers, bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_elem

    @property
    def decode_weight_bytes(self) -> float:
        """Weight bytes read per decode step: all but an untied input-embedding table."""
        read = self.params - (0 if self.tied_embeddings else self.embedding_params)
        return read * self.weight_bytes_per_param

    def prefill_flops(self, prompt: int) -> float:
        """FLOPs to prefill `prompt` tokens from an empty cache."""
        linear = 2 * self.matmul_params * prompt + 2 * self.embedding_params
        attention = 2 * self.layers * self.heads * self.head_dim * prompt * (prompt + 1)
        return float(linear + attention)

    def decode_bytes(self, prompt: int, output: int) -> float:
        """Bytes read to decode `output` tokens after `prompt`: step t reads the weights and
        the KV of prompt + t tokens."""
        context_tokens = output * prompt + output * (output - 1) / 2
        return output * self.decode_weight_bytes + self.kv_bytes_per_token * context_tokens


@dataclass(frozen=True, slots=True)
class BoxTimes:
    """One box running the whole request: prefill_s (= its TTFT), decode_s, seconds."""

    device: str
    prefill_s: float
    decode_s: float

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


@dataclass(frozen=True, slots=True)
class Plan:
    """The prediction for one workload. kv_bytes: the prompt's KV. kv_transfer_s: sending it
    all (serialised). exposed_transfer_s: the part that streaming per layer cannot hide
    behind prefill. All times in seconds."""

    model: str
    link: str
    prompt: int
    output: int
    prefill_box: BoxTimes
    decode_box: BoxTimes
    kv_bytes: float
    kv_transfer_s: float
    exposed_transfer_s: float

    @property
    def hidden_transfer_s(self) -> float:
        return self.kv_transfer_s - self.exposed_transfer_s

    @property
    def split_ttft_s(self) -> float:
        """Until the decode box holds the whole KV."""
        return self.prefill_box.prefill_s + self.exposed_transfer_s

    @property
    def split_total_s(self) -> float:
        return self.split_ttft_s + self.decode_box.decode_s

    @property
    def serial_split_total_s(self) -> float:
        """The split when the KV is sent only after prefill (no overlap)."""
        return self.prefill_box.prefill_s + self.kv_transfer_s + self.decode_box.decode_s

    @property
    def best_single(self) -> BoxTimes:
        return min(self.prefill_box, self.decode_box, key=lambda box: box.total_s)

    @property
    def speedup_vs_prefill_box(self) -> float:
        return self.prefill_box.total_s / self.split_total_s

    @property
    def speedup_vs_decode_box(self) -> float:
        return self.decode_box.total_s / self.split_total_s

    @property
    def speedup_vs_best(self) -> float:
        return self.best_single.total_s / self.split_total_s

    @property
    def pays(self) -> bool:
        return self.split_total_s < self.best_single.total_s * (1 - PAY_MARGIN)

    @property
    def verdict(self) -> str:
        best = self.best_single
        if self.pays:
            return (f"the second box pays: split {self.split_total_s:.2f} s vs {best.device} "
                    f"alone {best.total_s:.2f} s ({self.speedup_vs_best:.2f}x)")
        return (f"the second box does not pay: split {self.split_total_s:.2f} s vs "
                f"{best.device} alone {best.total_s:.2f} s ({self.speedup_vs_best:.2f}x, "
                f"needs more than {1 / (1 - PAY_MARGIN):.2f}x)")

    def to_dict(self) -> dict[str, Any]:
        boxes = {"prefill_box": self.prefill_box, "decode_box": self.decode_box}
        return {
            "model": self.model, "link": self.link, "prompt": self.prompt,
            "output": self.output,
            **{key: {"device": box.device, "prefill_s": box.prefill_s, "decode_s": box.decode_s,
                     "total_s": box.total_s} for key, box in boxes.items()},
            "kv_bytes": round(self.kv_bytes), "kv_transfer_s": self.kv_transfer_s,
            "exposed_transfer_s": self.exposed_transfer_s,
            "hidden_transfer_s": self.hidden_transfer_s, "split_ttft_s": self.split_ttft_s,
            "split_total_s": self.split_total_s,
            "serial_split_total_s": self.serial_split_total_s,
            "best_single": self.best_single.device,
            "speedup_vs_prefill_box": self.speedup_vs_prefill_box,
            "speedup_vs_decode_box": self.speedup_vs_decode_box,
            "speedup_vs_best": self.speedup_vs_best, "pays": self.pays, "verdict": self.verdict,
        }


def box_times(device: Device, model: ModelShape, prompt: int, output: int) -> BoxTimes:
    """`device` running prefill and decode of the whole request itself."""
    return BoxTimes(device.name, model.prefill_flops(prompt) / device.flops_per_s,
                    model.decode_bytes(prompt, output) / device.bytes_per_s)


def plan(prefill_device: Device, decode_device: Device, model: ModelShape, link: Link,
         prompt: int, output: int) -> Plan:
    """Predict both boxes alone and the split (prefill on `prefill_device`, KV over `link`,
    decode on `decode_device`) for `prompt` prompt tokens and `output` generated tokens."""
    if prompt < 1 or output < 1:
        raise PlannerError("prompt and output must be at least 1 token")
    prefill_box = box_times(prefill_device, model, prompt, output)
    kv_bytes = model.kv_bytes_per_token * prompt
    wire_s = kv_bytes / (link.usable_gbs * GB)
    latency_s = link.latency_ms / 1e3
    exposed = max(0.0, wire_s - prefill_box.prefill_s) + wire_s / model.layers + latency_s
    return Plan(model.name, link.name, prompt, output, prefill_box,
                box_times(decode_device, model, prompt, output), kv_bytes,
                wire_s + latency_s, min(exposed, wire_s + latency_s))


# --- the data file -------------------------------------------------------------------------

TABLES = {"devices": Device, "links": Link, "models": ModelShape}


@dataclass(frozen=True, slots=True)
class Catalog:
    """The devices, links and models by name."""

    devices: dict[str, Device]
    links: dict[str, Link]
    models: dict[str, ModelShape]

    def device(self, name: str) -> Device:
        return _lookup(self.devices, name, "device")

    def link(self, name: str) -> Link:
        return _lookup(self.links, name, "link")

    def model(self, name: str) -> ModelShape:
        return _lookup(self.models, name, "model")


def _lookup(table: dict, name: str, kind: str):
    if name not in table:
        raise PlannerError(f"unknown {kind} {name!r}; known {kind}s: {', '.join(sorted(table))}")
    return table[name]


def _read(path: Path | None) -> dict[str, Any]:
    try:
        if path is None:
            text = resources.files(__package__).joinpath("devices.toml").read_text("utf-8")
        else:
            text = Path(path).read_text(encoding="utf-8")
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlannerError(f"{path or 'devices.toml'}: {exc}") from None


def _build(cls: type, name: str, entry: dict[str, Any], source: str):
    wanted = [f.name for f in fields(cls) if f.name != "name"]
    entry = {"description": name, "source": "", **entry}
    unknown = sorted(set(entry) - set(wanted))
    missing = [key for key in wanted if key not in entry]
    if unknown or missing:
        raise PlannerError(f"{source}: {name}: "
                           + "; ".join(filter(None, [
                               missing and f"missing {', '.join(missing)}",
                               unknown and f"unknown {', '.join(unknown)}"])))
    for key, value in entry.items():
        if key in ("description", "source"):
            if not isinstance(value, str):
                raise PlannerError(f"{source}: {name}: {key} must be a string")
        elif key != "tied_embeddings" and not (
                isinstance(value, int | float) and not isinstance(value, bool) and value > 0):
            raise PlannerError(f"{source}: {name}: {key} must be a positive number, "
                               f"not {value!r}")
    if cls is ModelShape and not isinstance(entry["tied_embeddings"], bool):
        raise PlannerError(f"{source}: {name}: tied_embeddings must be true or false")
    for key in ("compute_efficiency", "bandwidth_efficiency"):
        if entry.get(key, 0) > 1:
            raise PlannerError(f"{source}: {name}: {key} must be in (0, 1]")
    return cls(name=name, **entry)


def load_catalog(extra: Path | str | None = None) -> Catalog:
    """The built-in `devices.toml`, with `extra` (a TOML file in the same format) merged on
    top: its entries add new names or override single fields of existing ones.

    Raises:
        PlannerError: an unreadable or invalid file (FileNotFoundError for a missing one).
    """
    merged: dict[str, dict[str, dict[str, Any]]] = {table: {} for table in TABLES}
    for path in (None, extra) if extra is not None else (None,):
        data = _read(path)
        source = str(path) if path is not None else "devices.toml"
        for table, entries in data.items():
            if table not in TABLES or not isinstance(entries, dict):
                raise PlannerError(f"{source}: unknown table [{table}]; expected "
                                   f"{', '.join(TABLES)}")
            for name, entry in entries.items():
                merged[table][name] = {**merged[table].get(name, {}), **entry}
    source = "devices.toml" if extra is None else f"devices.toml + {extra}"
    return Catalog(**{table: {name: _build(cls, name, entry, source)
                              for name, entry in merged[table].items()}
                      for table, cls in TABLES.items()})
