//! The actor system: wiring, start order and stop order (STYLE G14).
//!
//! ```text
//!  engine thread --ConnectorHandle--> LookupPlanner --probes--> pool
//!                                 \-> ReservationManager --LoadBlocks--> Loader x (load_threads x ranks)
//!                                 \-> SaverQueue (one per rank) --puts--> pool
//!  StatsReporter <- collects from planner, manager, savers every stats.interval_s
//!  results to the engine: bounded flume channels (EngineInbox), drained every step
//! ```
//!
//! Start order: planner, reservation manager, loaders (each on its own Arbiter),
//! savers (each on its own Arbiter), loaders attached to the manager, stats reporter.
//!
//! Stop order (`ConnectorHandle::shutdown`): 1. the handle stops sending lookups;
//! 2. every queued save is settled (`SettleSaves`), which also lets in-flight loads end;
//! 3. the stats reporter collects the final report; 4. the system stops and its thread
//! is joined. Supervision: an actor that panics takes its Arbiter down; its mailbox then
//! refuses `try_send`, which the handle and manager turn into failed loads and dropped
//! saves (service degrades, nothing wrong reaches the engine).

pub mod keyspace;
pub mod loader;
pub mod lookup_planner;
pub mod reservation_manager;
pub mod saver_queue;
pub mod stats_reporter;
