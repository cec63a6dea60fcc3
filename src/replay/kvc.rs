//! The `--connector kvc` hook: builds the real connector (the actor system behind
//! `EngineConnector`) for one replay instance, on the instance's devices and the shared
//! pool, with the default hash scope (the simulator's page content uses the same chain).

use super::connectors::{InstanceContext, ReplayConnector};
use super::error::ReplayError;
use crate::connector::{ConnectorHandle, ConnectorParams};
use crate::core::hash::{scope_seed, Scope};
use crate::stats::ConnectorStats;

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
        share: crate::connector::RankShare::default(),
        seed: scope_seed(&Scope::default()),
        model_key,
    };
    ConnectorHandle::start(params).map_err(|source| ReplayError::Connector {
        instance: context.instance,
        source: Box::new(source),
    })
}

impl ReplayConnector for ConnectorHandle {
    fn report(&mut self) -> ConnectorStats {
        use crate::connector::EngineConnector;
        self.settle_saves();
        self.stats()
    }

    fn finish(&mut self) -> ConnectorStats {
        // The shutdown protocol an engine runs at exit (drain, final stats, "connector
        // stopped"), so the replay exercises and logs it as a deployment would.
        self.close()
    }
}
