//! The `--connector kvc` hook: builds the real connector (the actor system behind
//! `EngineConnector`) for one replay instance.
//!
//! The integrator replaces [`kvc_connector`]'s body: start the connector on
//! `context.devices`, `context.pool` and `context.config`, with the stored page sizes of
//! `context.stored_page_bytes`, and return it as a `Box<dyn ReplayConnector>` whose
//! `report` drains it and returns its counters.

use super::connectors::{InstanceContext, ReplayConnector};
use super::error::ReplayError;

/// Builds the real connector for one instance.
///
/// # Errors
///
/// [`ReplayError::ConnectorNotWired`] until the real connector is wired in.
pub fn kvc_connector(context: &InstanceContext) -> Result<Box<dyn ReplayConnector>, ReplayError> {
    Err(ReplayError::ConnectorNotWired {
        connector: "kvc",
        instance: context.instance,
    })
}
