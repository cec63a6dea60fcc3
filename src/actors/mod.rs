//! The actor system: wiring, start order and stop order.
//!
//! ```text
//!  engine thread --ConnectorHandle--> outbox --courier thread--> LookupPlanner --probes--> pool
//!                                                           \-> ReservationManager --LoadBlocks--> Loader x (load_threads x ranks)
//!                                                           \-> SaverQueue (one per rank) --puts--> pool
//!  StatsReporter <- collects from planner, manager, savers every stats.interval_s
//!  results to the engine: bounded flume channels (EngineInbox), drained every step
//!  refused messages back to the engine: the courier's return channel
//! ```
//!
//! Start order: planner, reservation manager, loaders (each on its own Arbiter),
//! savers (each on its own Arbiter), loaders attached to the manager, stats reporter;
//! then the handle starts the courier with the planner's, manager's and savers' addresses.
//!
//! Stop order (`ConnectorHandle::shutdown` / `close`, and the CLI on SIGINT / SIGTERM),
//! bounded in all by `saver.shutdown_drain_timeout_ms` (the deadline):
//! 1. the planner stops admitting: the handle drops lookups it has not sent yet (a
//!    shut-down handle sends none), so no new load can be planned;
//! 2. in-flight loads finish or fail: the handle waits for the completion of every load it
//!    started (each has its own `loaders.load_timeout_ms`) until the deadline;
//! 3. the savers drain: `SettleSaves` to every saver, answered when its queue is empty,
//!    until the deadline; saves still queued then are dropped with the actors;
//! 4. the stats reporter collects the final report; pages and loads cut off at the deadline
//!    are counted as `saves_dropped` and `loads_failed`, so the accounting closes;
//! 5. the courier delivers what its outbox still holds and its thread is joined; then
//!    the system stops and its thread is joined (which waits for a batch already running
//!    on the blocking pool), and the staging pools are unregistered from the pool. The
//!    pool (Mooncake `close()`) is closed by its owner once every connector on it stopped.
//!
//! Supervision, per actor (`supervisor.rs` says why each actor catches its own panics
//! rather than relying on actix's `Supervisor`: a panic in a handler ends the actor's task
//! without stopping its context, so nothing would restart it, and its mailbox closes):
//! - loaders and savers restart in place: each load or save batch runs under a
//!   `StagingSupervisor`; a panicking one is reported failed (every page counted and
//!   settled) and the staging pool it lost is rebuilt (host memory, registered again). One
//!   whose staging is pinned CUDA memory cannot rebuild it and retires: it fails every
//!   later load or page at once, counted (`loader.rs`, `saver_queue.rs` module docs);
//! - the lookup planner restarts in place: a lookup whose start panicked is answered with
//!   nothing offered (counted `failed`), and the planner serves the next;
//! - the reservation manager retires, never restarts: a panic may leave its ledger
//!   half-updated, and an empty one would not know the engine's reservations or the loads
//!   writing into them. It drops the ledger; the engine then sees every load reported
//!   failed (loads still at a loader when their loader answers, so no page is handed back
//!   while being written), never filled, and computes the prefixes itself
//!   (`reservation_manager.rs` module docs);
//! - the stats reporter restarts in place: a panic as a collection starts changes nothing
//!   and the collection goes on, so `stats` and `shutdown` always get the whole report.
//!
//! No actor dies of a panic in its own code, so no mailbox closes under the handle. Should
//! one close anyway, the handle turns a closed planner into lookups with nothing offered
//! and a closed manager into failed loads.

pub mod loader;
pub mod lookup_planner;
pub mod reservation_manager;
pub mod saver_queue;
pub mod stats_reporter;
pub mod supervisor;
