//! A request's scope seeds its chain (R34, `request_scope`), through the real connector and
//! the embedded pool: a prompt saved under one cache salt and adapter is offered to a
//! request of the same scope only; another salt, another adapter or no scope finds nothing,
//! and requests without a scope keep sharing as before.

mod common;

use std::sync::Arc;

use common::{memory_pool, prompt, reserve, start, Instance};
use kv_connector::config::Config;
use kv_connector::connector::{EngineConnector, ReserveAnswer};
use kv_connector::core::ids::{RequestId, ReservationId};
use kv_connector::core::layout::Layout;
use kv_connector::pool::Pool;
use kv_connector::RequestScope;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn scope(salt: Option<&str>, adapter: Option<&str>) -> RequestScope {
    RequestScope {
        cache_salt: salt.map(str::to_owned),
        adapter: adapter.map(str::to_owned),
    }
}

/// The offer of a fresh lookup of `tokens` in `scope`.
fn offer(
    instance: &mut Instance,
    request: u64,
    tokens: &Arc<[i64]>,
    scope: RequestScope,
) -> Result<usize, Box<dyn std::error::Error>> {
    let request = RequestId(request);
    instance
        .handle
        .lookup_prefix_in_scope(request, Arc::clone(tokens), 0, scope)?;
    match reserve(&mut instance.handle, request, ReservationId(request.0)) {
        ReserveAnswer::Offer { extra_tokens, .. } => Ok(extra_tokens),
        ReserveAnswer::Pending => Err("reserve answered pending".into()),
    }
}

#[test]
fn r34_only_requests_of_the_same_scope_share() -> TestResult {
    let layout = Layout::preset("tiny-full")?;
    let pool = memory_pool(64 << 20);
    let tokens = prompt(0, 8 * 16 + 1);
    let mut saver = start(
        Arc::clone(&pool) as Arc<dyn Pool>,
        &layout,
        Config::default(),
    );
    let scopes_saved = [
        scope(Some("tenant-a"), None),
        scope(None, Some("adapter-x")),
        RequestScope::default(),
    ];
    for (n, request_scope) in (1..).zip(&scopes_saved) {
        assert_eq!(offer(&mut saver, n, &tokens, request_scope.clone())?, 0);
        saver.compute(RequestId(n), &tokens, &layout, 0);
        saver.handle.settle_saves();
        saver.handle.request_finished(RequestId(n));
    }
    let mut reader = start(
        Arc::clone(&pool) as Arc<dyn Pool>,
        &layout,
        Config::default(),
    );
    for (n, request_scope) in (10..).zip(&scopes_saved) {
        assert_eq!(
            offer(&mut reader, n, &tokens, request_scope.clone())?,
            8 * 16,
            "{request_scope:?}"
        );
    }
    let others = [
        scope(Some("tenant-b"), None),
        scope(None, Some("adapter-y")),
        scope(Some("tenant-a"), Some("adapter-x")),
        scope(Some(""), None),
    ];
    for (n, request_scope) in (20..).zip(others) {
        assert_eq!(
            offer(&mut reader, n, &tokens, request_scope.clone())?,
            0,
            "{request_scope:?}"
        );
    }
    let _ = reader.handle.shutdown();
    let _ = saver.handle.shutdown();
    Ok(())
}
