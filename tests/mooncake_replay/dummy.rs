//! Mooncake's one-node layout on a real `mooncake_master` and a real node-local
//! `mooncake_client` (the "real client"): this process's clients are dummy clients over
//! shared memory (`mooncake.real_client_address`). Nothing is mocked.
//!
//! Covered:
//! - `kv-connector replay --pool mooncake --real-client` on a slice of the shared trace:
//!   zero mismatched pages and the embedded pool's reuse, every staging pool in the dummy
//!   clients' shared memory;
//! - a dummy client's pool calls: buffers outside its shared memory round-trip through the
//!   fallback buffer it leases there; a staging pool larger than what is left is refused
//!   naming `mooncake.shared_memory_bytes` and a size that fits; leased memory stays usable
//!   after the client is closed; a real-client address where nothing listens is refused
//!   naming `mooncake.real_client_address`.
//!
//! A module of `mooncake_replay.rs` (one test binary less to link), sharing its replay rig.

use kv_connector::config::MIB;
use kv_connector::gpu::StagingPool;
use kv_connector::pool::mooncake::{
    MooncakeError, MooncakeMaster, MooncakePool, MooncakeRealClient, MooncakeSettings,
    RealClientSettings,
};
use kv_connector::pool::{Pool, PoolError};

use crate::common::mooncake::{install, start_master};
use crate::{field, replay, TestResult, TRACE, TRACE_SLICE};

/// Every instance a dummy client of one real client: every loaded page verifies, and the
/// replay reuses what the embedded pool does (neither evicts).
#[test]
fn a_replay_through_the_real_client_matches_the_embedded_pool() -> TestResult {
    if install().is_none() {
        return Ok(());
    }
    let (memory, _) = replay(&[&["--trace", TRACE, "--pool", "memory"], TRACE_SLICE].concat())?;
    let flags = ["--trace", TRACE, "--pool", "mooncake", "--real-client"];
    let (dummy, _) = replay(&[&flags, TRACE_SLICE].concat())?;
    assert_eq!(dummy["setup"]["pool"], "mooncake");
    for report in [&memory, &dummy] {
        assert_eq!(field(report, "mismatched_pages")?, 0, "{report}");
        assert_eq!(field(report, "completed")?, field(report, "requests")?);
        assert_eq!(field(report, "loads_failed")?, 0, "{report}");
        assert_eq!(field(report, "saves_failed")?, 0, "{report}");
    }
    let oracle = field(&memory, "oracle_reusable_tokens")?;
    let (reused_memory, reused_dummy) = (
        field(&memory, "reused_tokens")?,
        field(&dummy, "reused_tokens")?,
    );
    assert!(field(&dummy, "verified_pages")? > 0, "{dummy}");
    assert!(
        reused_dummy.abs_diff(reused_memory) * 100 <= oracle * 3,
        "through the real client {reused_dummy}, embedded {reused_memory} of oracle {oracle}"
    );
    Ok(())
}

/// A dummy client of a real client holding 64 MiB, with `shared_memory_bytes` of shared
/// memory; the real client and the master live as long as the returned guard.
fn dummy_pool(
    name: &str,
    shared_memory_bytes: u64,
) -> Result<Option<(MooncakePool, Processes)>, Box<dyn std::error::Error>> {
    let Some(install) = install() else {
        return Ok(None);
    };
    let master = start_master(&install, name)?;
    let real_client =
        MooncakeRealClient::start(&master, &RealClientSettings::new(&install, 64 * MIB))?;
    let settings = MooncakeSettings {
        venv_dir: install.venv_dir.clone(),
        real_client_address: real_client.address(),
        shared_memory_bytes,
        local_buffer_size_bytes: 4 * MIB,
        fallback_staging_bytes: 1 << 20,
        ..master.client_settings(MooncakeSettings::default())
    };
    let pool = MooncakePool::connect(settings)?;
    Ok(Some((
        pool,
        Processes {
            real_client,
            _master: master,
        },
    )))
}

/// The processes behind a dummy client: the real client stops before the master.
struct Processes {
    real_client: MooncakeRealClient,
    _master: MooncakeMaster,
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.real_client.stop();
    }
}

#[test]
fn a_dummy_client_stages_other_buffers_in_its_shared_memory_and_refuses_what_does_not_fit(
) -> TestResult {
    let Some((pool, _processes)) = dummy_pool("dummy-calls", 64 * MIB)? else {
        return Ok(());
    };
    let values: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i + 1; 100_000]).collect();
    let keys = ["dummy/a", "dummy/b", "dummy/c", "dummy/d"];
    let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let put = pool.put(&keys, &slices);
    assert!(put.iter().all(Result::is_ok), "{put:?}");
    let mut read = vec![vec![0u8; 100_000]; 4];
    let mut buffers: Vec<&mut [u8]> = read.iter_mut().map(Vec::as_mut_slice).collect();
    let got = pool.get_into(&keys, &mut buffers);
    assert!(got.iter().all(|answer| answer == &Ok(100_000)), "{got:?}");
    assert_eq!(
        read, values,
        "the bytes came back through the shared memory"
    );

    let too_much = usize::try_from(64 * MIB)?;
    let refused = match pool.lend_staging(too_much) {
        Some(Err(err)) => err,
        other => {
            return Err(format!(
                "a lease beyond the shared memory: {:?}",
                other.map(|r| r.is_ok())
            )
            .into())
        }
    };
    assert!(
        matches!(refused, PoolError::TransferMemory { .. }),
        "{refused:?}"
    );
    let message = refused.to_string();
    assert!(
        message
            .contains("raise mooncake.shared_memory_bytes, e.g. mooncake.shared_memory_bytes = "),
        "{message}"
    );
    Ok(())
}

/// A staging pool in leased shared memory outlives the client's close: the close leaves
/// the mapping to the last lease.
#[test]
fn leased_shared_memory_stays_usable_after_the_client_closes() -> TestResult {
    let Some((pool, _processes)) = dummy_pool("dummy-lease", 64 * MIB)? else {
        return Ok(());
    };
    let lease = pool
        .lend_staging(usize::try_from(4 * MIB)?)
        .ok_or("a dummy client lends its shared memory")??;
    let mut staging = StagingPool::lent_host(usize::try_from(4 * MIB)?, lease)?;
    staging.slot_mut(0)?[..8].copy_from_slice(b"pageone!");
    pool.close()?;
    staging.slot_mut(0)?[8..16].copy_from_slice(b"pagetwo!");
    assert_eq!(&staging.slot(0)?[..16], b"pageone!pagetwo!");
    assert!(
        pool.get_into(&["any"], &mut [&mut [0u8; 8][..]])[0].is_err(),
        "closed"
    );
    // The last lease destroys the client, while its real client still runs.
    drop(staging);
    Ok(())
}

#[test]
fn a_real_client_address_where_nothing_listens_is_refused_naming_the_setting() -> TestResult {
    let Some(install) = install() else {
        return Ok(());
    };
    let master = start_master(&install, "dummy-unreachable")?;
    let (_listener, free) = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?.to_string();
        drop(listener);
        ((), address)
    };
    let settings = MooncakeSettings {
        venv_dir: install.venv_dir.clone(),
        real_client_address: free.clone(),
        ..master.client_settings(MooncakeSettings::default())
    };
    let refused = MooncakePool::connect(settings)
        .err()
        .ok_or("nothing listens there")?;
    assert!(
        matches!(refused, MooncakeError::Unreachable { .. }),
        "{refused:?}"
    );
    let message = refused.to_string();
    assert!(
        message.contains(&format!("mooncake.real_client_address = {free:?}")),
        "{message}"
    );
    assert!(message.contains("the node's mooncake_client"), "{message}");
    Ok(())
}
