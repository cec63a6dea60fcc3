//! What a replay needs from a connector besides the engine hooks: how one is built per
//! instance ([`ConnectorFactory`], [`InstanceContext`]) and what it reports at the end
//! ([`ReplayConnector::report`], [`ConnectorReport`]).
//!
//! Workflow:
//! 1. the driver builds the shared pool and, per instance, one host [`Device`] per
//!    tensor-parallel rank;
//! 2. it calls the factory once per instance with an [`InstanceContext`]; the factory
//!    returns a `Box<dyn ReplayConnector>` (the real connector, or [`NoConnector`]);
//! 3. the engine simulator drives it through [`EngineConnector`];
//! 4. at the end the driver asks each connector for its [`ConnectorReport`] and sums them:
//!    the counters only the connector knows (lookup outcomes, saves, skips, drops).
//!
//! Page sizes: with `--kv-bytes-scale F < 1` the devices and the pool hold `F x` the
//! layout's page bytes ([`InstanceContext::stored_page_bytes`]); a connector must size its
//! objects, keys (`b{bytes}`, R3) and staging slots from those, not from
//! `Layout::page_bytes`, which stays the full size the cost model uses.

use std::sync::Arc;

use serde::Serialize;

use crate::config::Config;
use crate::connector::{EngineConnector, NoConnector};
use crate::core::layout::{GroupId, Layout};
use crate::gpu::Device;
use crate::pool::{ManualClock, Pool};
use crate::stats::PoolHealthStats;

use super::error::ReplayError;

/// Lookup outcomes (R11-R13, R27), as the connector counted them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LookupOutcomes {
    /// Resumed at the end of the longest present prefix.
    pub full: u64,
    /// Resumed earlier, within the rewind range, for a complete window (R12).
    pub rewound: u64,
    /// Resumed below the rewind range at a window checkpoint (R28).
    pub checkpoint: u64,
    /// Resumed at an earlier complete window found by the fallback (R13).
    pub recovered: u64,
    /// A prefix was present but no window was complete; nothing offered (R13).
    pub window_miss: u64,
    /// No block present (`H = 0`).
    pub full_miss: u64,
    /// Lost to a pool outage: the pool was unreachable or did not answer before the
    /// lookup's deadline, so nothing was offered (R30). Not an outcome of R11-R13.
    pub outage: u64,
}

impl LookupOutcomes {
    /// Adds another connector's counts.
    pub fn add(&mut self, other: &LookupOutcomes) {
        self.full += other.full;
        self.rewound += other.rewound;
        self.checkpoint += other.checkpoint;
        self.recovered += other.recovered;
        self.window_miss += other.window_miss;
        self.full_miss += other.full_miss;
        self.outage += other.outage;
    }

    /// All lookups, those lost to an outage included.
    pub fn total(&self) -> u64 {
        self.full
            + self.rewound
            + self.checkpoint
            + self.recovered
            + self.window_miss
            + self.full_miss
            + self.outage
    }
}

/// The counters a replay cannot see from the engine side; [`NoConnector`] reports zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConnectorReport {
    /// Lookup outcomes.
    pub lookups: LookupOutcomes,
    /// Pages stored in the pool (per shard object).
    pub pages_saved: u64,
    /// Bytes stored in the pool (object payloads as stored).
    pub bytes_saved: u64,
    /// Saves skipped because the key was present (R19).
    pub saves_skipped_present: u64,
    /// Saves shed by the bounded save queue (R22), and those lost to a pool outage.
    pub saves_dropped: u64,
    /// Saves dropped because the pool was unreachable or missed a deadline (R30); also
    /// counted in `saves_dropped`.
    pub saves_outage: u64,
    /// Save pages enqueued; accounting: `saves_enqueued = pages_saved +
    /// saves_skipped_present + saves_dropped + saves_failed`.
    pub saves_enqueued: u64,
    /// Save pages that could not be stored.
    pub saves_failed: u64,
    /// Save pages the pool refused for want of room; also counted in `saves_failed`.
    pub saves_no_space: u64,
    /// Loads started; accounting: `loads_started = loads_done + loads_failed`.
    pub loads_started: u64,
    /// Loads handed to the engine filled.
    pub loads_done: u64,
    /// Loads handed to the engine failed (R25), or stale (R26).
    pub loads_failed: u64,
    /// Pages handed to the pool past the chunk end of their step (R16; must be 0).
    pub published_past_chunk_end: u64,
    /// Window pages enqueued for checkpoints alone (R28).
    pub checkpoint_pages_enqueued: u64,
    /// The pool's health as the connector saw it (R30).
    pub pool_health: PoolHealthStats,
}

impl ConnectorReport {
    /// Adds another connector's counts.
    pub fn add(&mut self, other: &ConnectorReport) {
        self.lookups.add(&other.lookups);
        self.pages_saved += other.pages_saved;
        self.bytes_saved += other.bytes_saved;
        self.saves_skipped_present += other.saves_skipped_present;
        self.saves_dropped += other.saves_dropped;
        self.saves_outage += other.saves_outage;
        self.saves_enqueued += other.saves_enqueued;
        self.saves_failed += other.saves_failed;
        self.saves_no_space += other.saves_no_space;
        self.loads_started += other.loads_started;
        self.loads_done += other.loads_done;
        self.loads_failed += other.loads_failed;
        self.published_past_chunk_end += other.published_past_chunk_end;
        self.checkpoint_pages_enqueued += other.checkpoint_pages_enqueued;
        self.pool_health.merge(&other.pool_health);
    }
}

/// A connector a replay can drive: the engine hooks plus a final report.
pub trait ReplayConnector: EngineConnector {
    /// The counters so far, after the saves enqueued so far settled (the timeline samples
    /// it between steps).
    fn report(&mut self) -> ConnectorReport;

    /// Called once, after the last request finished and every held page was released:
    /// shut the connector down the way an engine does at exit (drain, final report) and
    /// return the final counters.
    fn finish(&mut self) -> ConnectorReport {
        self.report()
    }
}

impl ReplayConnector for NoConnector {
    fn report(&mut self) -> ConnectorReport {
        ConnectorReport::default()
    }
}

/// Everything one instance's connector is built from.
#[derive(Clone)]
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
pub fn no_connector(_context: &InstanceContext) -> Result<Box<dyn ReplayConnector>, ReplayError> {
    Ok(Box::new(NoConnector))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_add_field_by_field() {
        let one = ConnectorReport {
            lookups: LookupOutcomes {
                full: 1,
                rewound: 2,
                checkpoint: 1,
                recovered: 3,
                window_miss: 4,
                full_miss: 5,
                outage: 2,
            },
            pages_saved: 6,
            bytes_saved: 7,
            saves_skipped_present: 8,
            saves_dropped: 9,
            published_past_chunk_end: 10,
            saves_outage: 3,
            ..ConnectorReport::default()
        };
        let mut sum = one;
        sum.add(&one);
        assert_eq!(
            sum.lookups.total(),
            36,
            "lookups lost to an outage count as lookups"
        );
        assert_eq!((sum.lookups.outage, sum.saves_outage), (4, 6));
        assert_eq!((sum.lookups.window_miss, sum.lookups.checkpoint), (8, 2));
        assert_eq!(sum.pages_saved, 12);
        assert_eq!(sum.saves_dropped, 18);
        assert_eq!(sum.published_past_chunk_end, 20);
        assert_eq!(NoConnector.report(), ConnectorReport::default());
    }
}
