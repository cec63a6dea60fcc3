//! The reservation manager's actor tests.

use std::sync::Arc;
use std::time::Instant;

use super::*;
use crate::core::hash::{hash_blocks, scope_seed, Scope};
use crate::core::layout::Layout;
use crate::core::planner::{GroupLoad, LookupOutcome, LookupPlan};
use crate::messages::reservation_manager::{CollectLoadStats, StartLoad, StartLoads};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A load of blocks 0 and 1 of group 0 into `pages`, over `tokens`.
fn load(
    request: u64,
    reservation: u64,
    tokens: std::ops::Range<u64>,
    pages: Vec<u32>,
    layout: &Layout,
) -> Result<StartLoad, Box<dyn std::error::Error>> {
    let prompt: Vec<i64> = (0..=16 * 2).collect();
    let hashes = hash_blocks(scope_seed(&Scope::default()), &prompt, 16)?;
    let plan = LookupPlan {
        outcome: LookupOutcome::Full,
        resume_tokens: 32,
        local_match_tokens: 0,
        full_hit_tokens: 32,
        offered_tokens: 32,
        loads: vec![GroupLoad {
            group: layout.groups[0].id,
            blocks: vec![0, 1],
        }],
        rounds: 1,
        probed_items: 2,
    };
    Ok(StartLoad {
        request: RequestId(request),
        reservation: ReservationId(reservation),
        grant: Arc::new(LoadGrant::new(tokens.clone(), 16)),
        tokens,
        plan: Arc::new(plan),
        hashes: hashes.into(),
        pages,
    })
}

/// One `StartLoads` carrying several reservations: each is handled in the message's
/// order and reported exactly once; with no loader attached every one fails (R25),
/// and one the ledger refuses (empty token range) fails in its place, not first.
#[actix::test]
async fn a_step_s_loads_are_handled_in_order_and_each_reported_once() -> TestResult {
    let layout = Layout::preset("tiny-full")?;
    let keys = Arc::new(KeySpace::new(&layout, "ns", "m", &[64])?);
    let (lookups, _lookups) = flume::bounded(8);
    let (loads, finished) = flume::bounded(8);
    let (saves, _saves) = flume::bounded(8);
    let inbox = EngineInbox {
        lookups,
        loads,
        saves,
    };
    let ledger = Ledger::new(16, [(layout.groups[0].id, 8)])?;
    let manager = ReservationManager::new(ledger, keys, inbox, 8, ActorFaults::default()).start();
    let message = StartLoads {
        loads: vec![
            load(3, 30, 0..32, vec![4, 5], &layout)?,
            load(1, 10, 7..7, vec![0, 1], &layout)?,
            load(2, 20, 0..32, vec![2, 3], &layout)?,
        ],
        enqueued_at: Instant::now(),
    };
    manager.send(message).await?;
    let mut reported = Vec::new();
    for _ in 0..3 {
        let LoadAnswer::Finished(load) = finished.recv_async().await? else {
            panic!("no load was taken back: none is stale");
        };
        assert!(!load.filled, "no loader: nothing can be filled");
        reported.push((load.request.0, load.reservation.0));
    }
    assert_eq!(reported, vec![(3, 30), (1, 10), (2, 20)]);
    assert!(finished.is_empty(), "each reservation is reported once");
    let stats = manager.send(CollectLoadStats).await?;
    assert_eq!((stats.loads_started, stats.loads_failed), (3, 3));
    Ok(())
}
