//! The whole connector on the embedded pool and the host device: a prompt computed by one
//! instance is saved, found by a second instance's lookup, loaded into its pages and
//! verified byte for byte (R10, R11, R16, R19, R23-R25).

#![expect(
    clippy::unwrap_used,
    clippy::too_many_lines,
    reason = "test set-up: a failure is the test failing"
)]

use std::sync::Arc;
use std::time::Duration;

use kv_connector::config::Config;
use kv_connector::connector::{
    ConnectorHandle, ConnectorParams, EngineConnector, ReserveAnswer, ScheduledRequest,
    SchedulerOutput,
};
use kv_connector::core::eviction::EvictionPolicy;
use kv_connector::core::hash::{scope_seed, Scope};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::{GroupId, Layout};
use kv_connector::gpu::{Device, PagePoolSpec};
use kv_connector::pool::{MemoryPool, Pool, SystemClock};

const PAGES: u32 = 256;

fn start(pool: Arc<dyn Pool>, layout: &Layout) -> (ConnectorHandle, Device) {
    let page_bytes = usize::try_from(layout.page_bytes(&layout.groups[0]).unwrap()).unwrap();
    let device = Device::open_host(&[PagePoolSpec {
        group: GroupId(0),
        page_bytes,
        num_pages: PAGES,
    }])
    .unwrap();
    let params = ConnectorParams {
        config: Config::default(),
        layout: layout.clone(),
        pool,
        devices: vec![device.clone()],
        seed: scope_seed(&Scope::default()),
        model_key: "test".into(),
    };
    (ConnectorHandle::start(params).unwrap(), device)
}

fn page_content(block: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from((i * 7 + block * 13) % 251).unwrap())
        .collect()
}

/// Waits (for real) until the request's lookup answers.
fn reserve(
    handle: &mut ConnectorHandle,
    request: RequestId,
    reservation: ReservationId,
) -> ReserveAnswer {
    loop {
        match handle.reserve_prefix(request, 0, reservation) {
            ReserveAnswer::Pending => handle.wait_for_progress(Duration::from_millis(100)),
            answer @ ReserveAnswer::Offer { .. } => return answer,
        }
    }
}

#[test]
fn a_saved_prompt_is_loaded_byte_identical_by_another_instance() {
    let layout = Layout::preset("tiny-full").unwrap();
    let t = layout.tokens_per_block as usize;
    let pool: Arc<dyn Pool> = Arc::new(
        MemoryPool::new(
            EvictionPolicy::mooncake_defaults(64 << 20),
            Arc::new(SystemClock::new()),
        )
        .unwrap(),
    );
    let (mut first, first_device) = start(Arc::clone(&pool), &layout);
    let (mut second, second_device) = start(Arc::clone(&pool), &layout);
    let page_bytes = first_device.page_pool(GroupId(0)).unwrap().page_bytes;
    let prompt: Arc<[i64]> = (0..i64::try_from(10 * t + 3).unwrap())
        .collect::<Vec<_>>()
        .into();

    // Instance 1: nothing in the pool yet; compute the prompt in two chunks and save it.
    first.lookup_prefix(RequestId(1), Arc::clone(&prompt), 0);
    assert_eq!(
        reserve(&mut first, RequestId(1), ReservationId(1)),
        ReserveAnswer::Offer {
            extra_tokens: 0,
            is_async: false
        }
    );
    let table: Vec<i32> = (0..11).collect();
    for block in 0..10 {
        first_device
            .write_page(
                GroupId(0),
                u32::try_from(block).unwrap(),
                &page_content(block, page_bytes),
            )
            .unwrap();
    }
    for (before, after) in [(0, 4 * t + 5), (4 * t + 5, prompt.len())] {
        let tables: [&[i32]; 1] = [&table];
        let step = ScheduledRequest {
            request: RequestId(1),
            prompt_len: prompt.len(),
            computed_before: before,
            computed_after: after,
            new_reservation: None,
            page_tables: &tables,
        };
        first.on_step(&SchedulerOutput {
            requests: vec![step],
        });
    }
    assert!(
        first.request_finished(RequestId(1)),
        "pages stay until saves finish (R22)"
    );
    first.settle_saves();
    assert_eq!(first.get_finished_saves(), vec![RequestId(1)]);
    let saved = first.stats();
    assert_eq!(
        saved.saves.saves_done, 10,
        "all ten full blocks saved, the partial one never (R16)"
    );

    // Instance 2: the same prompt; all full blocks but the one holding the last token.
    second.lookup_prefix(RequestId(7), Arc::clone(&prompt), 0);
    let ReserveAnswer::Offer {
        extra_tokens,
        is_async,
    } = reserve(&mut second, RequestId(7), ReservationId(70))
    else {
        panic!("lookup never answered")
    };
    assert_eq!((extra_tokens, is_async), (10 * t, true));
    let table: Vec<i32> = (100..111).collect();
    let tables: [&[i32]; 1] = [&table];
    let step = ScheduledRequest {
        request: RequestId(7),
        prompt_len: prompt.len(),
        computed_before: 0,
        computed_after: 0,
        new_reservation: Some(ReservationId(70)),
        page_tables: &tables,
    };
    second.on_step(&SchedulerOutput {
        requests: vec![step],
    });
    let finished = loop {
        let finished = second.get_finished_prefix_loads();
        if !finished.is_empty() {
            break finished;
        }
        second.wait_for_progress(Duration::from_millis(100));
    };
    assert_eq!(finished.len(), 1);
    assert!(finished[0].filled, "{finished:?}");
    for block in 0..10 {
        let page = 100 + u32::try_from(block).unwrap();
        assert_eq!(
            second_device.read_page_to_vec(GroupId(0), page).unwrap(),
            page_content(block, page_bytes),
            "block {block}"
        );
    }
    let stats = second.shutdown();
    assert_eq!(
        (
            stats.lookups.full,
            stats.loads.loads_done,
            stats.loads.pages_loaded
        ),
        (1, 1, 10)
    );
    let stats = first.shutdown();
    assert_eq!(stats.lookups.full_miss, 1);
}
