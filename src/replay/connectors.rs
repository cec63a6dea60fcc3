//! What a replay needs from a connector besides the engine hooks: how one is built per
//! instance ([`ConnectorFactory`], [`InstanceContext`]) and what it reports at the end
//! ([`ReplayConnector::report`], the runtime's [`ConnectorStats`]).
//!
//! Workflow:
//! 1. the driver builds the shared pool and, per instance, one host [`Device`] per
//!    tensor-parallel rank;
//! 2. it calls the factory once per instance with an [`InstanceContext`]; the factory
//!    returns a `Box<dyn ReplayConnector>` (the real connector, or [`NoConnector`]);
//! 3. the engine simulator drives it through [`EngineConnector`];
//! 4. at the end the driver asks each connector for its [`ConnectorStats`] (the runtime's
//!    own counters, declared once in `stats`) and merges them: what only the connector
//!    knows (lookup outcomes, saves, skips, drops, the pool's health).
//!
//! Page sizes: with `--kv-bytes-scale F < 1` the devices and the pool hold `F x` the
//! layout's page bytes ([`InstanceContext::stored_page_bytes`]); a connector must size its
//! objects, keys (`b{bytes}`, R3) and staging slots from those, not from
//! `Layout::page_bytes`, which stays the full size the cost model uses.

use std::sync::Arc;

use crate::config::Config;
use crate::connector::{EngineConnector, NoConnector};
use crate::core::layout::{GroupId, Layout};
use crate::gpu::Device;
use crate::pool::{ManualClock, Pool};
use crate::stats::ConnectorStats;

use super::error::ReplayError;

/// A connector a replay can drive: the engine hooks plus a final report.
pub trait ReplayConnector: EngineConnector {
    /// The counters so far, after the saves enqueued so far settled (the timeline samples
    /// it between steps).
    fn report(&mut self) -> ConnectorStats;

    /// Called once, after the last request finished and every held page was released:
    /// shut the connector down the way an engine does at exit (drain, final report) and
    /// return the final counters.
    fn finish(&mut self) -> ConnectorStats {
        self.report()
    }
}

impl ReplayConnector for NoConnector {
    fn report(&mut self) -> ConnectorStats {
        ConnectorStats::default()
    }
}

/// Everything one instance's connector is built from.
#[derive(Clone)]
#[cfg_attr(not(feature = "internals"), allow(dead_code, reason = "what every connector factory is given; the binary's own factories read part of it"))]
pub struct InstanceContext {
    /// This instance, `0..instances`.
    pub instance: usize,
    /// Instances sharing the pool.
    pub instances: usize,
    /// The effective configuration (after `--config`, environment and `--set`).
    pub config: Arc<Config>,
    /// The KV layout, with the replay's world size; page bytes are full size.
    pub layout: Arc<Layout>,
    /// One device per tensor-parallel rank, index = rank. The engine simulator writes
    /// computed pages into them; loaders write loaded pages, the saver reads.
    pub devices: Vec<Device>,
    /// The pool every instance shares.
    pub pool: Arc<dyn Pool>,
    /// The pool's lease clock, which the driver keeps at the simulated time in ms.
    pub pool_clock: Arc<ManualClock>,
    /// Bytes of one page per group as stored on the devices and in the pool, layout order.
    pub stored_page_bytes: Vec<(GroupId, usize)>,
    /// The `--kv-bytes-scale` in force (1.0 when pages are full size).
    pub kv_bytes_scale: f64,
}

#[cfg(feature = "internals")]
impl InstanceContext {
    /// Stored bytes of one page of `group` (see the module docs), if the layout has it.
    pub fn stored_page_bytes(&self, group: GroupId) -> Option<usize> {
        self.stored_page_bytes
            .iter()
            .find(|(id, _)| *id == group)
            .map(|(_, bytes)| *bytes)
    }
}

/// Builds one instance's connector. Called once per instance, in instance order.
pub type ConnectorFactory<'a> =
    dyn FnMut(&InstanceContext) -> Result<Box<dyn ReplayConnector>, ReplayError> + 'a;

/// The `--connector none` factory: the baseline without a shared pool.
///
/// # Errors
///
/// Never; the signature is the factory's.
#[allow(clippy::unnecessary_wraps, reason = "the signature every connector factory shares")]
pub fn no_connector(_context: &InstanceContext) -> Result<Box<dyn ReplayConnector>, ReplayError> {
    Ok(Box::new(NoConnector))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_connector_reports_nothing_counted() {
        let mut none = NoConnector;
        assert_eq!(none.report(), ConnectorStats::default());
        assert_eq!(none.finish(), ConnectorStats::default());
    }
}
