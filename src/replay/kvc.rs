//! The `--connector kvc` hook: builds the real connector (the actor system behind
//! `EngineConnector`) for one replay instance, on the instance's devices and the shared
//! pool, with the default hash scope (the simulator's page content uses the same chain).

use super::connectors::{ConnectorReport, InstanceContext, LookupOutcomes, ReplayConnector};
use super::error::ReplayError;
use crate::connector::{ConnectorHandle, ConnectorParams};
use crate::core::hash::{scope_seed, Scope};

/// Builds the real connector for one instance.
///
/// # Errors
///
/// [`ReplayError::Connector`] when the connector cannot start (layout refused, devices
/// missing, bad key segments).
pub fn kvc_connector(context: &InstanceContext) -> Result<Box<dyn ReplayConnector>, ReplayError> {
    Ok(Box::new(kvc_handle(context)?))
}

/// Starts the real connector for one instance and returns its handle (for callers that
/// need more than the replay hooks, such as the metrics endpoint).
///
/// # Errors
///
/// As [`kvc_connector`].
pub fn kvc_handle(context: &InstanceContext) -> Result<ConnectorHandle, ReplayError> {
    let mut config = context.config.as_ref().clone();
    if config.stats.instance.is_empty() {
        // Each instance's stats lines say which instance they are.
        config.stats.instance = context.instance.to_string();
    }
    let model_key = if config.keys.model_key.is_empty() {
        context.layout.name.clone()
    } else {
        config.keys.model_key.clone()
    };
    let params = ConnectorParams {
        config,
        layout: context.layout.as_ref().clone(),
        pool: context.pool.clone(),
        devices: context.devices.clone(),
        seed: scope_seed(&Scope::default()),
        model_key,
    };
    ConnectorHandle::start(params).map_err(|source| ReplayError::Connector {
        instance: context.instance,
        source: Box::new(source),
    })
}

impl ReplayConnector for ConnectorHandle {
    fn report(&mut self) -> ConnectorReport {
        use crate::connector::EngineConnector;
        self.settle_saves();
        connector_report(&self.stats())
    }

    fn finish(&mut self) -> ConnectorReport {
        // The shutdown protocol an engine runs at exit (drain, final stats, "connector
        // stopped"), so the replay exercises and logs it as a deployment would.
        connector_report(&self.close())
    }
}

/// The replay's view of a connector's statistics.
fn connector_report(stats: &crate::stats::ConnectorStats) -> ConnectorReport {
    let lookups = &stats.lookups;
    ConnectorReport {
        lookups: LookupOutcomes {
            full: lookups.full,
            rewound: lookups.rewound,
            checkpoint: lookups.checkpoint,
            recovered: lookups.recovered,
            window_miss: lookups.window_miss,
            full_miss: lookups.full_miss,
            outage: lookups.outage,
        },
        pages_saved: stats.saves.saves_done,
        bytes_saved: stats.saves.bytes_saved,
        saves_skipped_present: stats.saves.saves_skipped_present,
        saves_dropped: stats.saves.saves_dropped,
        saves_outage: stats.saves.saves_outage,
        saves_enqueued: stats.saves.saves_enqueued,
        saves_failed: stats.saves.saves_failed,
        saves_no_space: stats.saves.saves_no_space,
        loads_started: stats.loads.loads_started,
        loads_done: stats.loads.loads_done,
        loads_failed: stats.loads.loads_failed + stats.loads.stale_completions,
        published_past_chunk_end: stats.saves.published_past_chunk_end,
        checkpoint_pages_enqueued: stats.saves.checkpoint_pages_planned,
        pool_health: stats.pool,
    }
}
