//! Several nodes sharing one Mooncake pool (R36, R25, R30), on a multi-host test bed built
//! from network namespaces (`nodes/net.rs`): a `mooncake_master` in its own namespace and
//! three nodes, each its own namespace on a bridge the test creates, each running its own
//! engine process (`kv-connector replay --node I/N --pace F --start-at T`, one simulated
//! time 0 for all) with its own Mooncake client and segment at its own address. KV crosses
//! veth pairs between namespaces as it would cross a network between hosts.
//!
//! Why the replay and not the Python package with the tiny model: the replay checks every
//! loaded page byte for byte and closes its own accounting (exit status 3 otherwise), and
//! its JSON report gives per node the reuse, failed loads and outages; a few hundred
//! requests run in seconds on two cores, where the tiny model's forward passes would not.
//!
//! Scenarios (docs/RELIABILITY.md, "Several nodes", has their summary lines):
//! - [`sharing_across_nodes`]: prefixes one node saved are loaded by the others, and the
//!   nodes together reuse about what one host with three instances reuses;
//! - [`node_killed_mid_run`]: SIGKILL of one node; the survivors finish with no wrong page
//!   and no hang, never see an outage, and reuse again after its segment is gone;
//! - [`node_cut_off_and_restored`]: one node's link goes down and up; the outage is that
//!   node's only, and it shares again afterwards;
//! - [`master_restarted_and_a_node_joining_late`]: the master restarts under running
//!   nodes, then a third node joins and loads what the first two saved since.
//!
//! Each scenario prints one summary line on stderr (`scripts/nodes` collects them). The
//! scenarios run one at a time (two cores). Root is needed for namespaces: without it the
//! tests skip, or fail when built with `KV_CONNECTOR_REQUIRE_MOONCAKE=1` (`scripts/test`),
//! as the other real-Mooncake tests do.
#![cfg(all(feature = "mooncake", feature = "cli"))]

#[path = "nodes/bed.rs"]
mod bed;
mod common;
#[path = "nodes/net.rs"]
mod net;
#[path = "nodes/procs.rs"]
mod procs;
#[path = "nodes/report.rs"]
mod report;

use std::time::{Duration, Instant};

use bed::{
    finish, one_at_a_time, sim_at, single_host, sleep_until, test_bed, Bed, SharedStart, NODES,
};
use kv_connector::replay::report::share;
use report::summary_line;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The nodes' labels, node `i` first as `node{i}`.
const LABELS: [&str; NODES] = ["node0", "node1", "node2"];

#[test]
fn sharing_across_nodes() -> TestResult {
    let Some(venv) = test_bed() else {
        return Ok(());
    };
    let _serial = one_at_a_time();
    let started = Instant::now();
    let bed = Bed::up(venv, "sharing", 10)?;
    let one_host = single_host(&bed)?;
    let start = SharedStart::soon()?;
    let nodes = bed.start_nodes(&start, &LABELS)?;
    let results = nodes
        .into_iter()
        .zip(LABELS)
        .map(|(node, label)| finish(node, label, &bed.dir))
        .collect::<Result<Vec<_>, _>>()?;
    let link_bytes = (0..NODES)
        .map(|i| bed.net.node_link_bytes(i))
        .collect::<Result<Vec<_>, _>>()?;
    let reused: u64 = results.iter().map(|r| r.reused_tokens).sum();
    let own_oracles: u64 = results.iter().map(|r| r.oracle_reusable_tokens).sum();
    let first: Vec<f64> = results
        .iter()
        .map(report::NodeResult::first_prompts_reuse)
        .collect::<Result<_, _>>()?;
    eprintln!(
        "{} single_host_reused={} nodes_reused={reused} ratio={:.2} own_oracles={own_oracles} \
         first_prompts_reuse={first:.2?} link_rx_tx={link_bytes:?}",
        summary_line("sharing", &results, started.elapsed()),
        one_host.reused_tokens,
        share(reused, one_host.reused_tokens),
    );
    one_host.assert_clean()?;
    for result in &results {
        result.assert_clean()?;
        result.assert_no_outage()?;
    }
    // A node's oracle counts what its own requests could give each other: reuse above it
    // is of prefixes only another node saved. Not asserted on the first prompts alone:
    // node 1's first comes 0.2 s of wall time after node 0's, whose save may still be on
    // its way on two busy cores.
    for result in &results[1..] {
        assert!(
            result.reused_tokens > result.oracle_reusable_tokens,
            "{}: reused no more than its own requests could give: {}",
            result.label,
            result.line()
        );
    }
    assert!(
        reused * 10 >= one_host.reused_tokens * 8,
        "the nodes reused {reused} tokens, one host {}",
        one_host.reused_tokens
    );
    Ok(())
}

#[test]
fn node_killed_mid_run() -> TestResult {
    let Some(venv) = test_bed() else {
        return Ok(());
    };
    let _serial = one_at_a_time();
    let started = Instant::now();
    let client_ttl_s = 2;
    let bed = Bed::up(venv, "killed", client_ttl_s)?;
    let start = SharedStart::soon()?;
    let mut nodes = bed.start_nodes(&start, &LABELS)?;
    let kill_at = Duration::from_secs(4);
    sleep_until(start.instant, kill_at);
    let mut killed = nodes.pop().ok_or("no node")?;
    killed.proc.kill();
    let gone_after = sim_at(kill_at + Duration::from_secs(client_ttl_s + 1));
    let results = nodes
        .into_iter()
        .zip(LABELS)
        .map(|(node, label)| finish(node, label, &bed.dir))
        .collect::<Result<Vec<_>, _>>()?;
    let after: Vec<f64> = results
        .iter()
        .map(|r| r.reuse_after(gone_after))
        .collect::<Result<_, _>>()?;
    eprintln!(
        "{} killed=node2 at_wall_s={} reuse_after_sim_s_{gone_after:.0}={after:.2?}",
        summary_line("node-killed", &results, started.elapsed()),
        kill_at.as_secs()
    );
    for (result, after) in results.iter().zip(&after) {
        result.assert_clean()?;
        result.assert_no_outage()?;
        assert!(
            *after > 0.0,
            "{}: no reuse once node2's segment was gone",
            result.label
        );
    }
    // The master placed some of the survivors' objects in node 2's segment, and went on
    // placing puts there until its client's time to live ran out: some met it.
    let met: u64 = results
        .iter()
        .map(|r| r.loads_failed + r.saves_failed)
        .sum();
    assert!(
        met > 0,
        "no load or save of a survivor met node 2's segment"
    );
    Ok(())
}

#[test]
fn node_cut_off_and_restored() -> TestResult {
    let Some(venv) = test_bed() else {
        return Ok(());
    };
    let _serial = one_at_a_time();
    let started = Instant::now();
    let bed = Bed::up(venv, "cut-off", 10)?;
    let start = SharedStart::soon()?;
    let nodes = bed.start_nodes(&start, &LABELS)?;
    let (cut_at, restore_at) = (Duration::from_secs(3), Duration::from_secs(6));
    sleep_until(start.instant, cut_at);
    bed.net.set_node_link(2, false)?;
    sleep_until(start.instant, restore_at);
    bed.net.set_node_link(2, true)?;
    // Back once its background retry has found the pool again (R30), a second or so.
    let back_after = sim_at(restore_at + Duration::from_secs(3));
    let results = nodes
        .into_iter()
        .zip(LABELS)
        .map(|(node, label)| finish(node, label, &bed.dir))
        .collect::<Result<Vec<_>, _>>()?;
    let after: Vec<f64> = results
        .iter()
        .map(|r| r.reuse_after(back_after))
        .collect::<Result<_, _>>()?;
    eprintln!(
        "{} cut=node2 wall_s={}..{} reuse_after_sim_s_{back_after:.0}={after:.2?}",
        summary_line("node-cut-off", &results, started.elapsed()),
        cut_at.as_secs(),
        restore_at.as_secs()
    );
    for result in &results {
        result.assert_clean()?;
    }
    for result in &results[..2] {
        result.assert_no_outage()?;
    }
    let cut = &results[2];
    assert!(
        cut.outages >= 1,
        "node2 saw no outage while cut off: {}",
        cut.line()
    );
    assert!(
        after[2] > 0.0,
        "node2 did not share again after it came back: {}",
        cut.line()
    );
    Ok(())
}

#[test]
fn master_restarted_and_a_node_joining_late() -> TestResult {
    let Some(venv) = test_bed() else {
        return Ok(());
    };
    let _serial = one_at_a_time();
    let started = Instant::now();
    let mut bed = Bed::up(venv, "master-restart", 10)?;
    let start = SharedStart::soon()?;
    let first = bed.start_nodes(&start, &LABELS[..2])?;
    let (restart_at, join_at) = (Duration::from_secs(3), Duration::from_secs(7));
    sleep_until(start.instant, restart_at);
    bed.restart_master()?;
    sleep_until(start.instant, join_at);
    let late = bed.node(2, "node2-late", &bed.report_dir("node2-late"))?;
    let mut results = Vec::new();
    for (node, label) in first.into_iter().zip(LABELS) {
        results.push(finish(node, label, &bed.dir)?);
    }
    results.push(finish(late, "node2-late", &bed.dir)?);
    // Back once the clients re-mounted and the background retry found the pool (R30).
    let back_after = sim_at(restart_at + Duration::from_secs(3));
    let after: Vec<f64> = results[..2]
        .iter()
        .map(|r| r.reuse_after(back_after))
        .collect::<Result<_, _>>()?;
    let late_first = results[2].first_prompts_reuse()?;
    eprintln!(
        "{} master_restarted_at_wall_s={} reuse_after_sim_s_{back_after:.0}={after:.2?} \
         node2_joined_at_wall_s={} its_first_prompts_reuse={late_first:.2}",
        summary_line("master-restart-late-join", &results, started.elapsed()),
        restart_at.as_secs(),
        join_at.as_secs()
    );
    for result in &results {
        result.assert_clean()?;
    }
    for (result, after) in results.iter().zip(&after) {
        assert!(
            *after > 0.0,
            "{}: no reuse after the master came back",
            result.label
        );
    }
    results[2].assert_no_outage()?;
    assert!(
        late_first > 0.0,
        "the late node's first prompts loaded nothing the others saved"
    );
    Ok(())
}
