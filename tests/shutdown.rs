//! Shutdown follows the stop order: queued saves are settled before the final report,
//! which accounts for every page (STYLE G14).

mod common;

use std::sync::Arc;

use common::{memory_pool, prompt, reserve, start};
use kv_connector::config::Config;
use kv_connector::connector::EngineConnector;
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Layout;
use kv_connector::pool::Pool;

#[test]
fn shutdown_settles_queued_saves_before_the_final_report() {
    let layout = Layout::preset("tiny-hybrid").unwrap();
    let pool = memory_pool(64 << 20);
    let mut instance = start(
        Arc::clone(&pool) as Arc<dyn Pool>,
        &layout,
        Config::default(),
    );
    for request in 0..4_u64 {
        let tokens = prompt(i64::try_from(request).unwrap() * 100_000, 20 * 16 + 5);
        instance
            .handle
            .lookup_prefix(RequestId(request), Arc::clone(&tokens), 0);
        reserve(
            &mut instance.handle,
            RequestId(request),
            ReservationId(request),
        );
        instance.compute(
            RequestId(request),
            &tokens,
            &layout,
            i32::try_from(request).unwrap() * 32,
        );
    }
    let stats = instance.handle.shutdown();
    let saves = stats.saves;
    assert!(saves.saves_enqueued > 0);
    assert_eq!(
        saves.saves_enqueued,
        saves.saves_done + saves.saves_skipped_present + saves.saves_dropped + saves.saves_failed
    );
    assert_eq!(
        pool.counters().objects,
        saves.saves_done,
        "every stored page is in the pool"
    );
    assert_eq!(stats.lookups.full_miss, 4);
}
