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

# (section, runtime counter) -> (Prometheus metric, label name, label value)
METRICS: dict[tuple[str, str], tuple[str, str | None, str | None]] = {
    ("lookups", "full"): ("kv_connector_lookup_outcomes_total", "outcome", "full"),
    ("lookups", "rewound"): ("kv_connector_lookup_outcomes_total", "outcome", "rewound"),
    ("lookups", "checkpoint"): ("kv_connector_lookup_outcomes_total", "outcome", "checkpoint"),
    ("lookups", "recovered"): ("kv_connector_lookup_outcomes_total", "outcome", "recovered"),
    ("lookups", "window_miss"): ("kv_connector_lookup_outcomes_total", "outcome", "window_miss"),
    ("lookups", "full_miss"): ("kv_connector_lookup_outcomes_total", "outcome", "full_miss"),
    ("lookups", "failed"): ("kv_connector_lookup_failed_total", None, None),
    ("lookups", "tokens_offered"): ("kv_connector_lookup_offered_tokens_total", None, None),
    ("lookups", "keys_probed"): ("kv_connector_lookup_probed_keys_total", None, None),
    ("loads", "loads_started"): ("kv_connector_load_started_total", None, None),
    ("loads", "loads_done"): ("kv_connector_load_done_total", None, None),
    ("loads", "failed_evicted"): ("kv_connector_load_failed_total", "cause", "evicted"),
    ("loads", "failed_corrupt"): ("kv_connector_load_failed_total", "cause", "corrupt"),
    ("loads", "failed_other"): ("kv_connector_load_failed_total", "cause", "other"),
    ("loads", "stale_completions"): ("kv_connector_load_stale_completions_total", None, None),
    ("loads", "pages_loaded"): ("kv_connector_load_pages_total", None, None),
    ("loads", "bytes_loaded"): ("kv_connector_load_bytes_total", None, None),
    ("saves", "saves_enqueued"): ("kv_connector_save_enqueued_pages_total", None, None),
    ("saves", "saves_done"): ("kv_connector_save_pages_total", "result", "stored"),
    ("saves", "saves_skipped_present"): ("kv_connector_save_pages_total", "result", "skipped_present"),
    ("saves", "saves_dropped"): ("kv_connector_save_pages_total", "result", "dropped"),
    ("saves", "saves_failed"): ("kv_connector_save_pages_total", "result", "failed"),
    ("saves", "saves_no_space"): ("kv_connector_save_no_space_pages_total", None, None),
    ("saves", "saves_refreshed"): ("kv_connector_save_refreshed_pages_total", None, None),
    ("saves", "bytes_saved"): ("kv_connector_save_bytes_total", None, None),
    ("vllm", "bounce_exhausted"): ("kv_connector_vllm_bounce_exhausted_total", None, None),
}


def flat_counters(stats: dict[str, dict[str, Any]], extra: dict[str, int]) -> dict[str, int]:
    """The counters of `Connector.stats()` that METRICS names, as "section.name"."""
    loads = stats.get("loads", {})
    other = loads.get("loads_failed", 0) - loads.get("failed_corrupt", 0) - loads.get("failed_evicted", 0)
    out = {}
    for section, name in METRICS:
        if section == "vllm":
            value = extra.get(name, 0)
        elif (section, name) == ("loads", "failed_other"):
            value = other
        else:
            value = stats.get(section, {}).get(name, 0)
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
                    name=name.removesuffix("_total"), documentation=f"kv_connector {name}", labelnames=names
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
