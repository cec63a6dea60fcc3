//! Unit tests of the health machine, and property tests of `pool_health::H1`-H6 over
//! random sequences of calls, puts, probes and elapsed time (fixed seed).

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use super::*;

fn policy(unreachable_after: u32, initial_ms: u64, max_ms: u64) -> HealthPolicy {
    HealthPolicy {
        unreachable_after: NonZeroU32::new(unreachable_after).unwrap_or(NonZeroU32::MIN),
        retry_initial: Duration::from_millis(initial_ms),
        retry_max: Duration::from_millis(max_ms),
    }
}

fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}

#[test]
fn three_failures_in_a_row_make_the_pool_unreachable_and_an_answer_in_between_resets() {
    let start = Instant::now();
    let mut health = HealthMachine::new(policy(3, 100, 1000));
    assert_eq!(
        health.record(start, CallOutcome::Failed),
        Some(Transition::Degraded)
    );
    assert_eq!(health.record(start, CallOutcome::Failed), None);
    assert_eq!(
        health.record(start, CallOutcome::Answered),
        Some(Transition::Healthy)
    );
    assert_eq!(health.state(), PoolHealth::Healthy);
    health.record(start, CallOutcome::Failed);
    health.record(start, CallOutcome::Failed);
    assert_eq!(health.gate(start), Gate::Call, "degraded still calls");
    assert_eq!(
        health.record(start, CallOutcome::Failed),
        Some(Transition::BecameUnreachable {
            failures: 3,
            retry_in: ms(100)
        })
    );
    assert_eq!(
        health.gate(start + ms(30)),
        Gate::Refuse { retry_in: ms(70) }
    );
}

#[test]
fn a_refused_put_degrades_until_a_put_stores_h6() {
    let start = Instant::now();
    let mut health = HealthMachine::new(policy(3, 100, 1000));
    assert_eq!(
        health.record(start, CallOutcome::PutRefused),
        Some(Transition::Degraded)
    );
    assert_eq!(health.record(start, CallOutcome::Answered), None);
    assert_eq!(
        health.state(),
        PoolHealth::Degraded,
        "an answered probe does not make a pool that refuses puts healthy"
    );
    assert_eq!(health.record(start, CallOutcome::PutRefused), None);
    assert_eq!(
        health.record(start, CallOutcome::PutStored),
        Some(Transition::Healthy)
    );
    health.record(start, CallOutcome::PutRefused);
    for _ in 0..2 {
        health.record(start, CallOutcome::Failed);
    }
    assert!(matches!(
        health.record(start, CallOutcome::Failed),
        Some(Transition::BecameUnreachable { failures: 3, .. })
    ));
    assert!(health.begin_probe(start + ms(100)));
    health.record_probe(start + ms(100), CallOutcome::Answered);
    assert_eq!(
        health.state(),
        PoolHealth::Healthy,
        "refusals before an outage are forgotten"
    );
}

#[test]
fn probes_back_off_doubling_to_the_cap_and_an_answered_probe_recovers() {
    let start = Instant::now();
    let mut health = HealthMachine::new(policy(1, 100, 350));
    health.record(start, CallOutcome::Failed);
    assert_eq!(health.state(), PoolHealth::Unreachable);
    assert!(!health.begin_probe(start + ms(99)), "not due yet");
    let mut now = start + ms(100);
    let mut waits = Vec::new();
    for _ in 0..4 {
        assert!(health.begin_probe(now));
        assert!(!health.begin_probe(now), "one probe at a time");
        assert_eq!(health.record_probe(now, CallOutcome::Failed), None);
        let wait = health.probe_due(now).unwrap_or_default();
        waits.push(wait);
        now += wait;
    }
    assert_eq!(waits, [ms(200), ms(350), ms(350), ms(350)]);
    assert!(health.begin_probe(now));
    assert_eq!(
        health.record_probe(now, CallOutcome::Answered),
        Some(Transition::Recovered {
            down_for: now - start,
            failed_probes: 4
        })
    );
    assert_eq!(health.state(), PoolHealth::Healthy);
    assert_eq!(health.gate(now), Gate::Call);
    assert_eq!(health.probe_due(now), None, "nothing to probe when healthy");
}

#[test]
fn late_answers_of_calls_made_before_the_outage_do_not_end_it() {
    let start = Instant::now();
    let mut health = HealthMachine::new(policy(1, 100, 100));
    health.record(start, CallOutcome::Failed);
    assert_eq!(health.record(start + ms(5), CallOutcome::Answered), None);
    assert_eq!(health.state(), PoolHealth::Unreachable);
    assert_eq!(
        health.record_probe(start, CallOutcome::Answered),
        None,
        "no probe ran"
    );
    assert_eq!(health.state(), PoolHealth::Unreachable);
}

#[test]
fn a_retry_max_below_the_initial_wait_is_raised_to_it() {
    let start = Instant::now();
    let mut health = HealthMachine::new(policy(1, 300, 10));
    health.record(start, CallOutcome::Failed);
    assert_eq!(health.probe_due(start), Some(ms(300)));
    let due = start + ms(300);
    assert!(health.begin_probe(due));
    health.record_probe(due, CallOutcome::Failed);
    assert_eq!(health.probe_due(due), Some(ms(300)));
}

/// One step of a random history.
#[derive(Clone, Debug)]
enum Step {
    /// Time passes.
    Wait(u64),
    /// An ordinary call ends.
    Call(CallOutcome),
    /// The prober tries to start a probe, which then ends.
    Probe(bool),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        2 => (0u64..400).prop_map(Step::Wait),
        3 => prop::sample::select(vec![
            CallOutcome::Answered,
            CallOutcome::Failed,
            CallOutcome::Failed,
            CallOutcome::PutStored,
            CallOutcome::PutRefused,
        ])
        .prop_map(Step::Call),
        2 => any::<bool>().prop_map(Step::Probe),
    ];
    prop::collection::vec(step, 0..120)
}

fn outcome(answered: bool) -> CallOutcome {
    if answered {
        CallOutcome::Answered
    } else {
        CallOutcome::Failed
    }
}

fn config() -> Config {
    Config {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x706f_6f6c_6865_616c),
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// H1-H6 against a naive model: a counter of failures in a row, whether the last put
    /// was refused, the list of transitions, and the probe waits of each outage.
    #[test]
    fn the_machine_keeps_h1_to_h5(
        unreachable_after in 1u32..5,
        initial in 1u64..200,
        extra in 0u64..2000,
        history in steps(),
    ) {
        let policy = policy(unreachable_after, initial, initial + extra);
        let mut health = HealthMachine::new(policy);
        let mut now = Instant::now();
        let mut in_a_row = 0u32;
        let mut refused = false;
        let mut down = false;
        let mut waits: Vec<Duration> = Vec::new();
        for step in history {
            let gate = health.gate(now);
            // H1: refused exactly while unreachable.
            prop_assert_eq!(matches!(gate, Gate::Refuse { .. }), down);
            prop_assert_eq!(health.state() == PoolHealth::Unreachable, down);
            match step {
                Step::Wait(millis) => now += ms(millis),
                Step::Call(call) => {
                    let transition = health.record(now, call);
                    if down {
                        prop_assert_eq!(transition, None);
                    } else if call != CallOutcome::Failed {
                        in_a_row = 0;
                        match call {
                            CallOutcome::PutRefused => refused = true,
                            CallOutcome::PutStored => refused = false,
                            _ => {}
                        }
                        // H2, H6: healthy unless the last put was refused.
                        let expected = if refused { PoolHealth::Degraded } else { PoolHealth::Healthy };
                        prop_assert_eq!(health.state(), expected);
                    } else {
                        in_a_row += 1;
                        // H2: unreachable exactly at the threshold.
                        if in_a_row >= unreachable_after {
                            prop_assert_eq!(
                                transition,
                                Some(Transition::BecameUnreachable {
                                    failures: in_a_row,
                                    retry_in: policy.retry_initial,
                                })
                            );
                            down = true;
                            in_a_row = 0;
                            waits = vec![policy.retry_initial];
                        } else {
                            prop_assert_eq!(health.state(), PoolHealth::Degraded);
                        }
                    }
                }
                Step::Probe(answered) => {
                    let due = health.probe_due(now);
                    let started = health.begin_probe(now);
                    // H4: probes only during an outage, when due.
                    prop_assert_eq!(started, down && due == Some(Duration::ZERO));
                    prop_assert!(!health.begin_probe(now), "a second probe started");
                    let transition = health.record_probe(now, outcome(answered));
                    if !started {
                        prop_assert_eq!(transition, None);
                    } else if answered {
                        // H3: only an answered probe recovers.
                        let recovered = matches!(transition, Some(Transition::Recovered { .. }));
                        prop_assert!(recovered, "an answered probe did not recover");
                        down = false;
                        refused = false;
                    } else {
                        prop_assert_eq!(transition, None);
                        let wait = health.probe_due(now).unwrap_or_default();
                        waits.push(wait);
                    }
                }
            }
        }
        // H5: the waits of the last outage double from the initial one up to the cap.
        for pair in waits.windows(2) {
            prop_assert_eq!(pair[1], (pair[0] * 2).min(policy.retry_max));
        }
        prop_assert!(waits.iter().all(|wait| *wait <= policy.retry_max));
    }

    /// H3: transitions to unreachable and recoveries alternate, starting with an outage.
    #[test]
    fn outages_and_recoveries_alternate(
        unreachable_after in 1u32..4,
        history in steps(),
    ) {
        let mut health = HealthMachine::new(policy(unreachable_after, 10, 40));
        let mut now = Instant::now();
        let mut outages = 0u32;
        let mut recoveries = 0u32;
        for step in history {
            let transition = match step {
                Step::Wait(millis) => {
                    now += ms(millis);
                    None
                }
                Step::Call(call) => health.record(now, call),
                Step::Probe(answered) => {
                    health.begin_probe(now);
                    health.record_probe(now, outcome(answered))
                }
            };
            match transition {
                Some(Transition::BecameUnreachable { .. }) => outages += 1,
                Some(Transition::Recovered { .. }) => recoveries += 1,
                _ => {}
            }
            prop_assert!(outages == recoveries || outages == recoveries + 1);
        }
    }
}
