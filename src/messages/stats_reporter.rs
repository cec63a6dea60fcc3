//! Messages to the stats reporter.

use actix::Message;

use crate::stats::ConnectorStats;

/// Collect every actor's counters now and return the totals since start (R27).
///
/// - Sender: the engine's handle (final report at shutdown, replay's report).
/// - Guarantee: the reply includes everything counted up to the collection.
/// - Reply: [`ConnectorStats`].
/// - Receiver gone: the caller gets a mailbox error and reports empty stats.
#[derive(Message, Debug)]
#[rtype(result = "ConnectorStats")]
pub struct CollectNow;
