//! The stats reporter: every `stats.interval_s` collects each actor's interval counters,
//! logs them at INFO (R27), and keeps the totals for the final report.
//!
//! Actors keep plain counters (no shared atomics) and hand them over on request; the reporter
//! merges. Mailbox: default capacity; only the handle and its own tick send to it.
//!
//! # Supervision: restart in place
//!
//! The reporter's only state is its totals. A panic as a collection starts (before any
//! counter is taken from an actor) is caught ([`crate::actors::supervisor::catch`]) and
//! changes nothing, so the reporter carries on with that collection: the engine's report
//! (`stats`, `shutdown`) stays complete and the accounting closed. A panic while an
//! interval is merged into the totals (after its counters were taken) loses that interval,
//! logged; the totals keep the intervals merged before it and the reporter serves the next
//! collection. Either way the reporter never dies, so `stats` and `shutdown` always get an
//! answer.

use std::time::Duration;

use actix::prelude::*;

use super::lookup_planner::LookupPlanner;
use super::reservation_manager::ReservationManager;
use super::saver_queue::SaverQueue;
use super::supervisor::catch;
use crate::messages::lookup_planner::CollectLookupStats;
use crate::messages::reservation_manager::CollectLoadStats;
use crate::messages::saver_queue::CollectSaveStats;
use crate::messages::stats_reporter::CollectNow;
use crate::pool::{ActorFault, ActorFaults, HealthView};
use crate::stats::{ConnectorStats, PoolHealthStats};

/// The stats reporter.
pub struct StatsReporter {
    planner: Addr<LookupPlanner>,
    manager: Addr<ReservationManager>,
    savers: Vec<Addr<SaverQueue>>,
    interval: Duration,
    totals: ConnectorStats,
    faults: ActorFaults,
    /// `stats.instance`: names this connector in its log lines.
    instance: String,
    /// The health of the connector's pool (R30), read at each collection.
    health: HealthView,
}

impl StatsReporter {
    /// Builds the reporter.
    pub fn new(
        planner: Addr<LookupPlanner>,
        manager: Addr<ReservationManager>,
        savers: Vec<Addr<SaverQueue>>,
        interval: Duration,
        faults: ActorFaults,
        instance: String,
        health: HealthView,
    ) -> Self {
        StatsReporter {
            planner,
            manager,
            savers,
            interval,
            totals: ConnectorStats::default(),
            faults,
            instance: if instance.is_empty() {
                "0".to_owned()
            } else {
                instance
            },
            health,
        }
    }

    /// Starts a collection; a panic before it takes anything changes nothing, and the
    /// collection goes on (module docs).
    fn start_collection(&self) -> impl std::future::Future<Output = ConnectorStats> + 'static {
        let started = catch(|| {
            assert!(
                !self.faults.fires(ActorFault::ReporterPanic),
                "injected fault reporter_panic: the stats reporter panicked starting a collection"
            );
        });
        if let Err(panicked) = started {
            tracing::error!(
                panic = panicked.message(),
                "stats reporter panicked starting a collection; restarted, collection goes on"
            );
        }
        self.collect_future()
    }

    /// Merges one interval into the totals; a panic loses that interval (module docs).
    /// The pool's health is not merged: the totals take the health view's snapshot, which
    /// is itself a total since start.
    fn absorb(&mut self, interval: &ConnectorStats) {
        let mut totals = self.totals.clone();
        match catch(|| totals.merge(interval)) {
            Ok(()) => self.totals = totals,
            Err(panicked) => tracing::error!(
                panic = panicked.message(),
                "stats reporter panicked merging an interval; interval lost, restarted"
            ),
        }
        self.totals.pool = self.health.snapshot();
    }

    /// Collects one interval from every actor (actors that are gone contribute nothing).
    async fn collect(
        planner: Addr<LookupPlanner>,
        manager: Addr<ReservationManager>,
        savers: Vec<Addr<SaverQueue>>,
    ) -> ConnectorStats {
        let mut interval = ConnectorStats::default();
        if let Ok(lookups) = planner.send(CollectLookupStats).await {
            interval.lookups = lookups;
        }
        if let Ok(loads) = manager.send(CollectLoadStats).await {
            interval.loads = loads;
        }
        for saver in savers {
            if let Ok(saves) = saver.send(CollectSaveStats).await {
                interval.saves.merge(&saves);
            }
        }
        interval
    }

    fn collect_future(&self) -> impl std::future::Future<Output = ConnectorStats> + 'static {
        Self::collect(
            self.planner.clone(),
            self.manager.clone(),
            self.savers.clone(),
        )
    }
}

/// Logs one interval at INFO, readable and parseable (key=value fields): one line per
/// counter set (`stats::D1`), the pool's health since start, and the interval's rates.
fn log_interval(
    stats: &ConnectorStats,
    pool: &PoolHealthStats,
    interval: Duration,
    instance: &str,
) {
    stats.lookups.log(instance);
    stats.loads.log(instance);
    stats.saves.log(instance);
    pool.log(instance);
    let seconds = interval.as_secs_f64().max(f64::EPSILON);
    #[expect(clippy::cast_precision_loss, reason = "a rate for a log line")]
    let rate = |value: u64| value as f64 / seconds;
    let (loads, saves) = (&stats.loads, &stats.saves);
    tracing::info!(
        instance,
        load_gbps = rate(loads.bytes_loaded) / 1e9,
        load_pages_per_s = rate(loads.pages_loaded),
        save_gbps = rate(saves.bytes_saved) / 1e9,
        save_pages_per_s = rate(saves.saves_done),
        "rates"
    );
}

impl Actor for StatsReporter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.interval, |actor, ctx| {
            ctx.spawn(
                actor
                    .start_collection()
                    .into_actor(actor)
                    .map(|interval, actor, _| {
                        actor.absorb(&interval);
                        let pool = actor.totals.pool;
                        if let Err(panicked) = catch(|| {
                            log_interval(&interval, &pool, actor.interval, &actor.instance);
                        }) {
                            tracing::error!(
                                panic = panicked.message(),
                                "stats reporter panicked logging an interval"
                            );
                        }
                    }),
            );
        });
    }
}

/// Collection is atomic with respect to other messages (`AtomicResponse`): two
/// concurrent collections never interleave their merges.
impl Handler<CollectNow> for StatsReporter {
    type Result = AtomicResponse<Self, ConnectorStats>;

    fn handle(&mut self, _message: CollectNow, _ctx: &mut Self::Context) -> Self::Result {
        AtomicResponse::new(Box::pin(self.start_collection().into_actor(self).map(
            |interval, actor, _| {
                actor.absorb(&interval);
                actor.totals.clone()
            },
        )))
    }
}
