//! Overload: a full save queue sheds whole requests and counts every page, never blocks the
//! engine, and still lets the requests' pages go (R22); accounting stays closed. Full mailboxes and a full
//! courier outbox are made on purpose with the handle's test gates (feature `faults`:
//! `pause_actors`, `hold_courier`), not by racing the courier.

mod common;

use std::sync::Arc;

use common::{look_up, memory_pool, prompt, reserve, start, TestPool};
use kv_connector::config::Config;
use kv_connector::connector::{EngineConnector, ScheduledRequest, SchedulerOutput};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Layout;
use kv_connector::pool::Pool;

/// R22: a request with more pages in one step than the save queue holds is the oldest
/// request when the queue fills up, so it is shed whole (every page counted dropped)
/// rather than saved in part; the engine is never blocked and still gets its pages back.
#[test]
fn a_request_larger_than_the_save_queue_is_shed_whole_counted_and_released_r22() {
    let layout = Layout::preset("tiny-full").unwrap();
    let mut config = Config::default();
    config.saver.queue_capacity_pages = 4;
    let mut instance = start(memory_pool(64 << 20), &layout, config);
    let tokens = prompt(0, 10 * 16 + 1);
    look_up(&mut instance.handle, RequestId(1), &tokens);
    reserve(&mut instance.handle, RequestId(1), ReservationId(1));
    // One step enqueues ten pages into a queue of four: the fifth push sheds the request
    // with its four queued pages, and its last five pages are dropped as they come.
    instance.compute(RequestId(1), &tokens, &layout, 0);
    let keep = instance.handle.request_finished(RequestId(1));
    instance.handle.settle_saves();
    let finished = instance.handle.get_finished_saves();
    assert!(
        !keep || finished == vec![RequestId(1)],
        "pages are released once saves settle or drop"
    );
    let saves = instance.handle.shutdown().saves;
    assert_eq!(saves.saves_enqueued, 10);
    assert_eq!(saves.saves_dropped, 10);
    assert_eq!(saves.saves_done, 0);
    assert_eq!(
        saves.saves_enqueued,
        saves.saves_done + saves.saves_skipped_present + saves.saves_dropped + saves.saves_failed
    );
}

/// R22 (`save_order::I7`): a request once shed stays shed, so its last chunk's window
/// pages are dropped with its full blocks and no window page of it reaches the pool without
/// the chain below it. Once the engine ended it, its id names a new request, saved whole.
#[test]
fn a_shed_request_saves_no_window_page_and_its_id_is_new_once_ended_r22() {
    let layout = Layout::preset("tiny-hybrid").unwrap();
    let test_pool = Arc::new(TestPool::new(memory_pool(64 << 20)));
    let mut config = Config::default();
    config.saver.queue_capacity_pages = 8;
    let mut instance = start(Arc::clone(&test_pool) as Arc<dyn Pool>, &layout, config);
    let first = prompt(7, 10 * 16 + 3);
    look_up(&mut instance.handle, RequestId(1), &first);
    reserve(&mut instance.handle, RequestId(1), ReservationId(1));
    instance.write_pages(first.len(), &layout, 0);
    // Nine full blocks in one step into a queue of eight: the request is shed at the ninth.
    instance.chunk(RequestId(1), first.len(), &layout, 0, 0..144);
    // Its last chunk (block 9, and the window group's blocks 0..10) finds an empty queue,
    // and is dropped all the same.
    instance.chunk(RequestId(1), first.len(), &layout, 0, 144..first.len());
    let keep = instance.handle.request_finished(RequestId(1));
    instance.handle.settle_saves();
    let finished = instance.handle.get_finished_saves();
    assert!(!keep || finished == vec![RequestId(1)]);
    assert!(
        test_pool.put_log.lock().is_empty(),
        "nothing of the shed request was stored"
    );
    // The engine uses the id again: 4 full blocks and 4 window pages, which fit.
    let second = prompt(9_000_000, 4 * 16 + 1);
    look_up(&mut instance.handle, RequestId(1), &second);
    reserve(&mut instance.handle, RequestId(1), ReservationId(2));
    instance.compute(RequestId(1), &second, &layout, 20);
    let keep = instance.handle.request_finished(RequestId(1));
    instance.handle.settle_saves();
    let finished = instance.handle.get_finished_saves();
    assert!(!keep || finished == vec![RequestId(1)]);
    let saves = instance.handle.shutdown().saves;
    assert_eq!(saves.saves_enqueued, 9 + 11 + 8);
    assert_eq!(saves.saves_dropped, 9 + 11);
    assert_eq!(saves.saves_done, 8, "the new request was saved whole");
    assert_eq!(test_pool.put_log.lock().len(), 8);
    assert_eq!(
        saves.saves_enqueued,
        saves.saves_done + saves.saves_skipped_present + saves.saves_dropped + saves.saves_failed
    );
}

/// A full planner mailbox defers lookups instead of refusing them: every request is
/// still looked up, offered what the pool has, and saves its prompt. The planner's thread
/// is paused while the lookups go out, so its mailbox of one is full for all but the first.
#[cfg(feature = "faults")]
#[test]
fn a_full_planner_mailbox_defers_lookups_and_loses_no_saves() {
    let layout = Layout::preset("tiny-full").unwrap();
    let mut config = Config::default();
    config.planner.mailbox_capacity = 1;
    let mut instance = start(memory_pool(64 << 20), &layout, config);
    let prompts: Vec<_> = (0..16_i64)
        .map(|i| prompt(i * 1_000_000, 4 * 16 + 1))
        .collect();
    let paused = instance.handle.pause_actors();
    for (index, tokens) in prompts.iter().enumerate() {
        look_up(&mut instance.handle, RequestId(index as u64), tokens);
        // One admission pass per request: sixteen messages into a mailbox of one.
        instance.handle.flush_lookups();
    }
    // The savers answer after the courier tried every lookup before it (one outbox, in
    // order): all but the first found the mailbox full.
    instance.handle.settle_saves();
    drop(paused);
    for (index, tokens) in prompts.iter().enumerate() {
        let request = RequestId(index as u64);
        reserve(&mut instance.handle, request, ReservationId(request.0));
        instance.compute(request, tokens, &layout, i32::try_from(index).unwrap() * 8);
    }
    let stats = instance.handle.shutdown();
    assert!(
        stats.lookups.deferred > 0,
        "the mailbox of one refused some lookups at first"
    );
    assert_eq!(stats.lookups.full_miss, 16, "every request was looked up");
    assert_eq!(stats.saves.saves_done, 16 * 4, "and saved its prompt");
}

/// The loads of one step travel in one `StartLoads`; a reservation manager that refuses
/// it (gone here, full in production: the same path) fails every load of the step at
/// once, each reported once, in the step's order (R25), and the accounting stays closed.
#[test]
fn a_refused_start_loads_fails_every_load_of_the_step_r25() {
    let layout = Layout::preset("tiny-full").unwrap();
    let mut instance = start(memory_pool(64 << 20), &layout, Config::default());
    for index in 0..3_u64 {
        let tokens = prompt(i64::try_from(index).unwrap() * 1_000_000, 4 * 16 + 1);
        instance
            .handle
            .lookup_prefix(RequestId(index), tokens, 0)
            .expect("the request is new");
    }
    for index in 0..3_u64 {
        reserve(
            &mut instance.handle,
            RequestId(index),
            ReservationId(10 + index),
        );
    }
    instance.handle.close();
    let table: Vec<i32> = (0..5).collect();
    let tables: Vec<&[i32]> = vec![table.as_slice()];
    let requests = [2_u64, 0, 1]
        .into_iter()
        .map(|index| ScheduledRequest {
            request: RequestId(index),
            prompt_len: 4 * 16 + 1,
            computed_before: 0,
            computed_after: 0,
            new_reservation: Some(ReservationId(10 + index)),
            page_tables: &tables,
        })
        .collect();
    instance.handle.on_step(&SchedulerOutput { requests });
    let finished = instance.handle.get_finished_prefix_loads();
    let reported: Vec<(u64, u64, bool)> = finished
        .iter()
        .map(|load| (load.request.0, load.reservation.0, load.filled))
        .collect();
    assert_eq!(
        reported,
        vec![(2, 12, false), (0, 10, false), (1, 11, false)]
    );
    assert!(instance.handle.get_finished_prefix_loads().is_empty());
    let loads = instance.handle.stats().loads;
    assert_eq!((loads.loads_started, loads.loads_failed), (3, 3));
    assert_eq!(loads.loads_started, loads.loads_done + loads.loads_failed);
}

/// A full courier outbox refuses at once, like a full mailbox: the step's save pages are
/// counted dropped and settle, so every request's pages are released and the accounting
/// stays closed (R22). The courier is held while the steps go out and the outbox holds
/// one message, so the burst of steps overflows it.
#[cfg(feature = "faults")]
#[test]
fn a_full_outbox_drops_and_settles_saves_and_the_accounting_closes_r22() {
    let layout = Layout::preset("tiny-full").unwrap();
    let mut config = Config::default();
    config.handoff.outbox_capacity = 1;
    let mut instance = start(memory_pool(64 << 20), &layout, config);
    let prompts: Vec<_> = (0..16_i64)
        .map(|i| prompt(i * 1_000_000, 4 * 16 + 1))
        .collect();
    for (index, tokens) in prompts.iter().enumerate() {
        let request = RequestId(index as u64);
        look_up(&mut instance.handle, request, tokens);
        reserve(&mut instance.handle, request, ReservationId(request.0));
    }
    // Sixteen steps back to back, four pages each, into an outbox of one.
    let held = instance.handle.hold_courier();
    for (index, tokens) in prompts.iter().enumerate() {
        let request = RequestId(index as u64);
        instance.compute(request, tokens, &layout, i32::try_from(index).unwrap() * 8);
    }
    drop(held);
    let mut kept = Vec::new();
    for index in 0..16_u64 {
        if instance.handle.request_finished(RequestId(index)) {
            kept.push(RequestId(index));
        }
    }
    instance.handle.settle_saves();
    let mut released = instance.handle.get_finished_saves();
    released.sort();
    assert_eq!(released, kept, "every kept request's pages are released");
    let saves = instance.handle.shutdown().saves;
    assert_eq!(
        saves.saves_enqueued,
        16 * 4,
        "every planned page is counted"
    );
    assert!(
        saves.saves_dropped > 0,
        "the outbox of one refused some steps"
    );
    assert_eq!(
        saves.saves_enqueued,
        saves.saves_done + saves.saves_skipped_present + saves.saves_dropped + saves.saves_failed
    );
}
