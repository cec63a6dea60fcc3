//! R32 through the real connector: a request's tokens are fixed from its first lookup to
//! its end, every stored object is keyed by the tokens whose KV it carries, and only the
//! reservation of a request's latest offer is loaded, once.

#![expect(
    clippy::unwrap_used,
    reason = "test set-up: a failure is the test failing"
)]

mod common;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{memory_pool, prompt, reserve, start, wait_until, Instance, TestPool};
use kv_connector::config::Config;
use kv_connector::connector::{
    EngineConnector, HookError, ReserveAnswer, ScheduledRequest, SchedulerOutput,
};
use kv_connector::core::hash::{hash_blocks, scope_seed, Scope};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Layout;
use kv_connector::pool::Pool;

fn instance(layout: &Layout) -> (Instance, Arc<TestPool>) {
    let pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let instance = start(
        Arc::clone(&pool) as Arc<dyn Pool>,
        layout,
        Config::default(),
    );
    (instance, pool)
}

/// Every pool key of every full block of `tokens`, every group and shard.
fn keys_of(instance: &Instance, layout: &Layout, tokens: &[i64]) -> HashSet<String> {
    let t = layout.tokens_per_block as usize;
    let hashes = hash_blocks(scope_seed(&Scope::default()), tokens, t).unwrap();
    let keys = instance.handle.keys();
    hashes
        .iter()
        .flat_map(|hash| {
            keys.groups
                .iter()
                .flat_map(|group| group.all_shard_keys(hash).collect::<Vec<_>>())
        })
        .collect()
}

/// Ends a request and waits until its saves settled and it is forgotten.
fn end(instance: &mut Instance, request: RequestId) {
    if instance.handle.request_finished(request) {
        wait_until("the request's saves", || {
            instance.handle.settle_saves();
            instance
                .handle
                .get_finished_saves()
                .contains(&request)
                .then_some(())
        });
    }
}

#[test]
fn a_live_request_keeps_its_tokens_and_a_disputed_one_saves_nothing_r32() {
    let layout = Layout::preset("tiny-full").unwrap();
    let (mut instance, pool) = instance(&layout);
    let (first, second) = (prompt(1, 5 * 16 + 3), prompt(50_000, 5 * 16 + 3));
    instance
        .handle
        .lookup_prefix(RequestId(1), Arc::clone(&first), 0)
        .unwrap();
    // Looked up, not ended: refused, whether or not the lookup has answered.
    assert_eq!(
        instance
            .handle
            .lookup_prefix(RequestId(1), Arc::clone(&second), 0),
        Err(HookError::LiveRequest {
            request: RequestId(1)
        })
    );
    // An engine that computes the other prompt under the id anyway publishes nothing.
    reserve(&mut instance.handle, RequestId(1), ReservationId(1));
    instance.compute(RequestId(1), &second, &layout, 0);
    instance.handle.settle_saves();
    assert!(
        pool.put_log.lock().is_empty(),
        "nothing of a disputed request is saved"
    );
    end(&mut instance, RequestId(1));
    // Ended and forgotten: the id is new again, and saves resume under the new tokens.
    instance.save_prompt(RequestId(1), &second, &layout, 0);
    let stored: HashSet<String> = pool.put_log.lock().iter().cloned().collect();
    assert!(!stored.is_empty());
    assert!(stored.is_subset(&keys_of(&instance, &layout, &second)));
}

#[test]
fn a_request_ended_with_saves_pending_is_still_live_r32() {
    let layout = Layout::preset("tiny-full").unwrap();
    let (mut instance, pool) = instance(&layout);
    let tokens = prompt(1, 5 * 16 + 3);
    pool.hold_puts.store(true, Ordering::SeqCst);
    instance
        .handle
        .lookup_prefix(RequestId(3), Arc::clone(&tokens), 0)
        .unwrap();
    reserve(&mut instance.handle, RequestId(3), ReservationId(1));
    instance.compute(RequestId(3), &tokens, &layout, 0);
    assert!(
        instance.handle.request_finished(RequestId(3)),
        "its saves are held"
    );
    assert_eq!(
        instance
            .handle
            .lookup_prefix(RequestId(3), prompt(9_000, 40), 0),
        Err(HookError::LiveRequest {
            request: RequestId(3)
        })
    );
    pool.hold_puts.store(false, Ordering::SeqCst);
    for _ in 0..8 {
        pool.release_one_get();
    }
    end(&mut instance, RequestId(3));
    instance
        .handle
        .lookup_prefix(RequestId(3), prompt(9_000, 40), 0)
        .unwrap();
}

/// Lookups interleave in the planner: a lookup whose request ended while it ran must not
/// hand its hashes (its prompt's keys) to the next request under the same id.
#[test]
fn a_lookup_result_that_outlived_its_request_is_not_taken_by_the_next_r32() {
    let layout = Layout::preset("tiny-full").unwrap();
    let (mut instance, pool) = instance(&layout);
    let (first, second) = (prompt(1, 5 * 16 + 3), prompt(50_000, 5 * 16 + 3));
    pool.hold_probes.store(true, Ordering::SeqCst);
    instance
        .handle
        .lookup_prefix(RequestId(1), Arc::clone(&first), 0)
        .unwrap();
    instance.handle.flush_lookups();
    wait_until("the first lookup's probe", || {
        (pool.probes_started.load(Ordering::SeqCst) > 0).then_some(())
    });
    pool.hold_probes.store(false, Ordering::SeqCst);
    // The engine gives up on the request while its lookup runs, and reuses the id.
    assert!(!instance.handle.request_finished(RequestId(1)));
    instance
        .handle
        .lookup_prefix(RequestId(1), Arc::clone(&second), 0)
        .unwrap();
    reserve(&mut instance.handle, RequestId(1), ReservationId(2));
    // The first lookup answers now, after the second.
    pool.release_one_get();
    instance.handle.wait_for_progress(Duration::from_secs(5));
    instance.compute(RequestId(1), &second, &layout, 0);
    instance.handle.settle_saves();
    let stored: HashSet<String> = pool.put_log.lock().iter().cloned().collect();
    assert!(!stored.is_empty());
    assert!(
        stored.is_disjoint(&keys_of(&instance, &layout, &first)),
        "the second prompt's KV was saved under the first prompt's keys"
    );
    assert!(stored.is_subset(&keys_of(&instance, &layout, &second)));
}

#[test]
fn only_the_latest_offer_is_loaded_and_only_once_r32() {
    let layout = Layout::preset("tiny-full").unwrap();
    let (mut instance, _pool) = instance(&layout);
    let tokens = prompt(1, 5 * 16 + 3);
    instance.save_prompt(RequestId(1), &tokens, &layout, 0);
    end(&mut instance, RequestId(1));
    instance
        .handle
        .lookup_prefix(RequestId(2), Arc::clone(&tokens), 0)
        .unwrap();
    let offer = reserve(&mut instance.handle, RequestId(2), ReservationId(7));
    assert!(matches!(offer, ReserveAnswer::Offer { extra_tokens, .. } if extra_tokens > 0));
    let table: Vec<i32> = (100..106).collect();
    let tables = [table.as_slice()];
    let scheduled = |reservation| SchedulerOutput {
        requests: vec![ScheduledRequest {
            request: RequestId(2),
            prompt_len: tokens.len(),
            computed_before: 0,
            computed_after: 0,
            new_reservation: Some(ReservationId(reservation)),
            page_tables: &tables,
        }],
    };
    assert_eq!(
        instance.handle.check_step(&scheduled(8)),
        Err(HookError::UnofferedReservation {
            request: RequestId(2),
            reservation: ReservationId(8),
            offered: Some(ReservationId(7)),
        })
    );
    // Unchecked, a reservation never offered is reported failed, never loaded.
    instance.handle.on_step(&scheduled(8));
    assert!(instance.handle.check_step(&scheduled(7)).is_ok());
    instance.handle.on_step(&scheduled(7));
    assert_eq!(
        instance.handle.check_step(&scheduled(7)),
        Err(HookError::ReservationReported {
            request: RequestId(2),
            reservation: ReservationId(7),
        })
    );
    // Named again unchecked: ignored, so the reservation is still reported once.
    instance.handle.on_step(&scheduled(7));
    let mut reported = Vec::new();
    wait_until("both loads", || {
        reported.extend(instance.handle.get_finished_prefix_loads());
        if reported.len() < 2 {
            instance
                .handle
                .wait_for_progress(Duration::from_millis(100));
        }
        (reported.len() >= 2).then_some(())
    });
    instance
        .handle
        .wait_for_progress(Duration::from_millis(200));
    reported.extend(instance.handle.get_finished_prefix_loads());
    reported.sort_by_key(|load| load.reservation);
    let outcomes: Vec<(u64, bool)> = reported
        .iter()
        .map(|load| (load.reservation.0, load.filled))
        .collect();
    assert_eq!(outcomes, vec![(7, true), (8, false)]);
}
