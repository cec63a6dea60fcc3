//! The connector's statistics (R27) as a Python dict: `lookups`, `loads` and `saves`, each
//! with the runtime's counter names, latencies in microseconds as `{count, p50, p99, max}`,
//! and `pool`, the pool's health (R30).

use kv_connector::stats::ConnectorStats;
use pyo3::prelude::*;
use serde_json::json;

use crate::convert::json_to_py;

/// `stats` as a dict (module docs).
pub fn to_dict<'py>(py: Python<'py>, stats: &ConnectorStats) -> PyResult<Bound<'py, PyAny>> {
    let (lookups, loads, saves) = (&stats.lookups, &stats.loads, &stats.saves);
    let value = json!({
        "lookups": {
            "lookups": lookups.lookups(),
            "full": lookups.full,
            "rewound": lookups.rewound,
            "checkpoint": lookups.checkpoint,
            "recovered": lookups.recovered,
            "window_miss": lookups.window_miss,
            "full_miss": lookups.full_miss,
            "failed": lookups.failed,
            "outage": lookups.outage,
            "deferred": lookups.deferred,
            "tokens_offered": lookups.tokens_offered,
            "keys_probed": lookups.keys_probed,
            "probe_time_us": lookups.probe_time.summary(),
        },
        "loads": {
            "loads_started": loads.loads_started,
            "loads_done": loads.loads_done,
            "loads_failed": loads.loads_failed,
            "failed_evicted": loads.failed_evicted,
            "failed_corrupt": loads.failed_corrupt,
            "stale_completions": loads.stale_completions,
            "pages_loaded": loads.pages_loaded,
            "bytes_loaded": loads.bytes_loaded,
            "load_time_us": loads.load_time.summary(),
        },
        "saves": {
            "saves_enqueued": saves.saves_enqueued,
            "saves_done": saves.saves_done,
            "saves_skipped_present": saves.saves_skipped_present,
            "saves_dropped": saves.saves_dropped,
            "saves_outage": saves.saves_outage,
            "saves_refreshed": saves.saves_refreshed,
            "saves_failed": saves.saves_failed,
            "saves_no_space": saves.saves_no_space,
            "bytes_saved": saves.bytes_saved,
            "max_queue_depth": saves.max_queue_depth,
            "published_past_chunk_end": saves.published_past_chunk_end,
            "queue_time_us": saves.queue_time.summary(),
        },
        "pool": stats.pool,
    });
    json_to_py(py, &value)
}
