"""The runtime's counters through vLLM's connector stats and Prometheus hooks.

Each step the worker sends the counters' increase since its last report
(`KvcStats.data`: flat counter name -> increase); vLLM aggregates them, logs them with
its periodic "KV Transfer metrics" line, and `KvcPromMetrics` adds them to Prometheus
counters under the runtime's metric names (docs/OPERATIONS.md), with vLLM's engine
labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from kv_connector import COUNTERS, METRIC_FAMILIES

# What this package counts itself, next to the runtime's counters.
VLLM_METRICS: dict[tuple[str, str], tuple[str, str | None, str | None]] = {
    ("vllm", "bounce_exhausted"): ("kv_connector_vllm_bounce_exhausted_total", None, None),
}
VLLM_HELP = {
    "kv_connector_vllm_bounce_exhausted_total": "Window saves dropped and loads failed for want of a bounce page.",
}

# (section, runtime counter) -> (Prometheus metric, label name, label value): every counter
# the runtime exposes in a counter family (gauges and histograms are the runtime's own
# endpoint's), then this package's.
METRICS: dict[tuple[str, str], tuple[str, str | None, str | None]] = {
    (counter["section"], counter["name"]): (counter["metric"], counter["label"], counter["label_value"])
    for counter in COUNTERS
    if counter["type"] == "counter"
} | VLLM_METRICS

HELP: dict[str, str] = {family["metric"]: family["help"] for family in METRIC_FAMILIES} | VLLM_HELP


def flat_counters(stats: dict[str, dict[str, Any]], extra: dict[str, int]) -> dict[str, int]:
    """The counters of `Connector.stats()` that METRICS names, as "section.name"."""
    out = {}
    for section, name in METRICS:
        value = extra.get(name, 0) if section == "vllm" else stats.get(section, {}).get(name, 0)
        out[f"{section}.{name}"] = int(value)
    return out


@dataclass
class KvcStats(KVConnectorStats):
    """Counter increases since the previous report, "section.name" -> count."""

    def reset(self):
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KvcStats:
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return {key: value for key, value in sorted(self.data.items()) if value}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvcPromMetrics(KVConnectorPromMetrics):
    """Prometheus counters under the runtime's metric names, one set per engine."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[tuple[str, str | None], Any] = {}
        for name, label, _value in set(METRICS.values()):
            names = list(labelnames) + ([label] if label else [])
            if (name, label) not in self._counters:
                self._counters[(name, label)] = self._counter_cls(
                    name=name.removesuffix("_total"), documentation=HELP[name], labelnames=names
                )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        labels = list(self.per_engine_labelvalues[engine_idx])
        for key, increase in transfer_stats_data.items():
            if not increase:
                continue
            section, name = key.split(".", 1)
            metric, label, value = METRICS[(section, name)]
            counter = self._counters[(metric, label)]
            counter.labels(*labels, *([value] if label else [])).inc(increase)
