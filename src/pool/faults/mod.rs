//! Fault injection (feature `faults`): a [`Pool`](super::Pool) wrapper with named fault points
//! that fire at seeded rates, and the points that actors fire themselves.
//!
//! # Workflow
//!
//! 1. Parse a spec ([`FaultSpec::parse`]): `get=0.01,corrupt_payload=0.005,seed=7`, or
//!    `default` ([`FaultSpec::modest`]: every point on at a modest rate). `seed=N` and
//!    `slow_ms=N` are parameters, every other name a [`FaultPoint`] with its rate in `[0, 1]`.
//! 2. Build one [`FaultInjector`] and wrap each pool in a [`FaultyPool`] sharing it (the
//!    replay wraps every instance's pool: `kv-connector replay --faults SPEC`).
//! 3. Pool calls go through the wrapper, which fires the pool points ([`FaultPoint::is_pool`])
//!    around the inner pool. The actors reach the injector through [`Pool::faults`](super::Pool::faults) (or
//!    [`ActorFaults`](super::ActorFaults), for those without a pool) and fire the actor
//!    points: a full save queue, staging exhaustion, a panicking planner, reservation
//!    manager or stats reporter.
//! 4. [`FaultInjector::counts`] says how often each point fired (the soak figures).
//!
//! # Decisions
//!
//! A decision is `xxh3(point, key, attempt, seed) < rate * 2^64`, where `attempt` counts
//! the earlier calls of the same kind (exists, put, get, touch) on the same key. So the
//! same seed and the same sequence of calls give the same faults, a transient fault on one
//! attempt does not stick to the key, and threads calling on different keys do not change
//! each other's decisions. Batch points decide on the batch's first key; actor points
//! decide on a per-point counter (deterministic per point, whatever thread fires it).
//!
//! # Invariants
//!
//! - `faults::F1`. Every faulted answer is one the real backends can give (an error per key, a
//!   missing object, bytes that fail verification, a late answer), never a shorter
//!   vector: the [`Pool`](super::Pool) contract still holds.
//! - `faults::F2`. A faulted put stores nothing; a faulted get leaves no verified object in its
//!   buffer (R5 makes the corrupt ones a miss).
//! - `faults::F3`. A rate of 0 never fires and never changes an answer; a spec with no point set
//!   wraps a pool without any change in behaviour.

use std::collections::BTreeMap;
#[cfg(any(feature = "replay", feature = "internals"))]
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(any(feature = "replay", feature = "internals"))]
use parking_lot::Mutex;
use xxhash_rust::xxh3::xxh3_64_with_seed;

mod outage;
mod spec;
#[cfg(any(feature = "replay", feature = "internals"))]
mod wrapper;

pub use outage::Outage;
#[cfg(any(feature = "cli", feature = "internals"))]
pub use spec::FaultSpecError;
pub use spec::{FaultPoint, FaultSpec};
#[cfg(any(feature = "replay", feature = "internals"))]
pub use wrapper::FaultyPool;


/// Decides and counts faults; shared by every [`FaultyPool`] of a run and reachable from
/// actors through [`Pool::faults`](super::Pool::faults).
#[derive(Debug)]
pub struct FaultInjector {
    spec: FaultSpec,
    /// How often each point fired, index = [`FaultPoint`] order.
    fired: [AtomicU64; FaultPoint::ALL.len()],
    /// Calls of each point so far (the attempt of actor points).
    calls: [AtomicU64; FaultPoint::ALL.len()],
    /// Earlier calls per (kind, key hash): the attempt of pool decisions.
    #[cfg(any(feature = "replay", feature = "internals"))]
    attempts: Mutex<HashMap<(wrapper::CallKind, u64), u32>>,
    /// The outage switch (`outage.rs`).
    outage: outage::PoolOutage,
}

impl FaultInjector {
    /// An injector for `spec`.
    pub fn new(spec: FaultSpec) -> Self {
        Self {
            spec,
            fired: std::array::from_fn(|_| AtomicU64::new(0)),
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
            #[cfg(any(feature = "replay", feature = "internals"))]
            attempts: Mutex::new(HashMap::new()),
            outage: outage::PoolOutage::default(),
        }
    }

    /// Starts a pool outage: from now on every call of the pools sharing this injector
    /// meets it ([`Outage`]), until [`end_outage`](Self::end_outage).
    pub fn begin_outage(&self, outage: Outage) {
        self.outage.begin(outage);
    }

    /// Ends the outage: calls reach the pool again, and hung calls go on to it.
    pub fn end_outage(&self) {
        self.outage.end();
    }

    /// Calls that met an outage so far.
    pub fn outage_calls(&self) -> u64 {
        self.outage.calls()
    }

    /// The spec it decides by.
    pub fn spec(&self) -> &FaultSpec {
        &self.spec
    }

    /// How often each point fired, by spec name (every point listed).
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        FaultPoint::ALL
            .into_iter()
            .map(|point| (point.as_str(), self.fired(point)))
            .collect()
    }

    /// How often `point` fired.
    pub fn fired(&self, point: FaultPoint) -> u64 {
        self.fired[point.index()].load(Ordering::Relaxed)
    }

    /// Fires an actor point (a per-point counter is the attempt). Counts a firing.
    pub fn fire(&self, point: FaultPoint) -> bool {
        let rate = self.spec.rate(point);
        if rate <= 0.0 {
            return false;
        }
        let call = self.calls[point.index()].fetch_add(1, Ordering::Relaxed);
        self.decide(point, &call.to_le_bytes(), 0)
    }

    /// Whether `point` fires for `material` at `attempt`; counts a firing.
    fn decide(&self, point: FaultPoint, material: &[u8], attempt: u32) -> bool {
        let rate = self.spec.rate(point);
        if rate <= 0.0 {
            return false;
        }
        let seed = self
            .spec
            .seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add((point.index() as u64) << 32 | u64::from(attempt));
        let draw = xxh3_64_with_seed(material, seed);
        #[expect(
            clippy::cast_precision_loss,
            reason = "a uniform draw in [0, 1); 53 bits are plenty"
        )]
        let fires = (draw as f64) / 18_446_744_073_709_551_616.0 < rate;
        if fires {
            self.fired[point.index()].fetch_add(1, Ordering::Relaxed);
        }
        fires
    }

}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::core::eviction::EvictionPolicy;
    use crate::core::object::HEADER_BYTES;
    use super::wrapper::BATCH_FAULT;
    use crate::pool::{MemoryPool, Pool, PoolError, SystemClock};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn faulty(spec: FaultSpec) -> Result<FaultyPool, PoolError> {
        let inner = MemoryPool::new(
            EvictionPolicy::mooncake_defaults(1 << 24),
            Arc::new(SystemClock::new()),
        )?;
        Ok(FaultyPool::new(
            Arc::new(inner),
            Arc::new(FaultInjector::new(spec)),
        ))
    }

    #[test]
    fn specs_parse_points_seed_and_default() -> TestResult {
        let spec = FaultSpec::parse("get=0.01, corrupt_payload=0.005,seed=7,slow_ms=3")?;
        assert!((spec.rate(FaultPoint::Get) - 0.01).abs() < 1e-12);
        assert!((spec.rate(FaultPoint::CorruptPayload) - 0.005).abs() < 1e-12);
        assert!(spec.rate(FaultPoint::Put).abs() < f64::EPSILON);
        assert_eq!((spec.seed, spec.slow_ms), (7, 3));
        let default = FaultSpec::parse("seed=9,default,loader_panic=0")?;
        assert_eq!(default.seed, 9);
        assert!(default.rate(FaultPoint::LoaderPanic).abs() < f64::EPSILON);
        for point in FaultPoint::ALL {
            assert_eq!(FaultPoint::from_name(point.as_str()), Some(point));
            if point != FaultPoint::LoaderPanic {
                assert!(default.rate(point) > 0.0, "{} is off", point.as_str());
            }
        }
        Ok(())
    }

    #[test]
    fn bad_specs_name_what_is_wrong() {
        let cases = [
            ("get", "entry"),
            ("gett=0.1", "unknown_fault"),
            ("get=1.5", "rate"),
            ("get=x", "rate"),
            ("seed=-1", "parameter"),
        ];
        for (text, kind) in cases {
            let err = FaultSpec::parse(text).expect_err(text);
            assert_eq!(err.kind(), kind, "{text}: {err}");
        }
        let err = FaultSpec::parse("gett=0.1").expect_err("unknown");
        assert!(err.to_string().contains("corrupt_payload"), "{err}");
    }

    #[test]
    fn f3_zero_rates_change_nothing() -> TestResult {
        let pool = faulty(FaultSpec::default())?;
        assert_eq!(pool.put(&["a", "b"], &[b"12", b"34"]), vec![Ok(()), Ok(())]);
        assert_eq!(pool.exists(&["a", "c"]), vec![Ok(true), Ok(false)]);
        let (mut one, mut two) = ([0u8; 4], [0u8; 4]);
        let got = pool.get_into(&["a", "b"], &mut [&mut one[..], &mut two[..]]);
        assert_eq!(got, vec![Ok(2), Ok(2)]);
        assert_eq!((&one[..2], &two[..2]), (&b"12"[..], &b"34"[..]));
        assert!(pool.injector().counts().values().all(|&count| count == 0));
        Ok(())
    }

    #[test]
    fn f1_f2_certain_faults_answer_per_key_and_store_nothing() -> TestResult {
        let pool = faulty(FaultSpec::default().with(FaultPoint::Put, 1.0))?;
        let answers = pool.put(&["a", "b"], &[b"12", b"34"]);
        assert_eq!(answers.len(), 2);
        assert!(answers.iter().all(Result::is_err));
        assert_eq!(pool.counters().objects, 0, "faults::F2: nothing stored");
        let pool = faulty(FaultSpec::default().with(FaultPoint::ExistsBatch, 1.0))?;
        assert_eq!(pool.exists(&["a", "b", "c"]), BATCH_FAULT.for_every_key(3));
        assert_eq!(pool.injector().fired(FaultPoint::ExistsBatch), 1);
        let pool = faulty(FaultSpec::default().with(FaultPoint::TouchBatch, 1.0))?;
        assert_eq!(pool.touch(&["a", "b"]), BATCH_FAULT.for_every_key(2));
        let pool = faulty(FaultSpec::default().with(FaultPoint::Touch, 1.0))?;
        assert_eq!(pool.put(&["a"], &[b"12"]), vec![Ok(())]);
        assert_eq!(pool.touch(&["a"]), vec![Err(BATCH_FAULT)]);
        assert_eq!(
            pool.exists(&["a"]),
            vec![Ok(true)],
            "a touch fault stores nothing"
        );
        Ok(())
    }

    #[test]
    fn an_outage_fails_or_hangs_every_call_until_it_ends() -> TestResult {
        let pool = faulty(FaultSpec::default())?;
        assert_eq!(pool.put(&["a"], &[b"12"]), vec![Ok(())]);
        pool.injector().begin_outage(Outage::Down);
        assert_eq!(
            pool.exists(&["a", "b"]),
            PoolError::Unavailable.for_every_key(2)
        );
        assert_eq!(
            pool.put(&["c"], &[b"34"]),
            vec![Err(PoolError::Unavailable)]
        );
        let mut buffer = [0u8; 4];
        let got = pool.get_into(&["a"], &mut [&mut buffer[..]]);
        assert_eq!(got, vec![Err(PoolError::Unavailable)]);
        let backend_timeout = Duration::from_millis(10);
        pool.injector()
            .begin_outage(Outage::Hang { backend_timeout });
        assert_eq!(
            pool.touch(&["a"]),
            vec![Err(PoolError::Timeout { after_ms: 10 })],
            "a hung call answers the backend's timeout"
        );
        assert_eq!(pool.injector().outage_calls(), 4);
        pool.injector().end_outage();
        assert_eq!(
            pool.exists(&["a", "c"]),
            vec![Ok(true), Ok(false)],
            "F2: nothing stored"
        );
        assert_eq!(pool.injector().outage_calls(), 4);
        let injector = Arc::clone(pool.injector());
        injector.begin_outage(Outage::Hang {
            backend_timeout: Duration::from_secs(600),
        });
        let pool = Arc::new(pool);
        let caller = Arc::clone(&pool);
        let waiting = std::thread::spawn(move || caller.exists(&["a"]));
        while injector.outage_calls() < 5 {
            std::thread::yield_now();
        }
        injector.end_outage();
        let answer = waiting.join().map_err(|_| "the hung call panicked")?;
        assert_eq!(
            answer,
            vec![Ok(true)],
            "the end of the outage let the call through"
        );
        Ok(())
    }

    #[test]
    fn evicted_and_corrupt_gets_never_hand_back_the_stored_object() -> TestResult {
        for point in [
            FaultPoint::Evict,
            FaultPoint::Get,
            FaultPoint::CorruptHeader,
            FaultPoint::CorruptPayload,
        ] {
            let pool = faulty(FaultSpec::default().with(point, 1.0))?;
            let object = vec![3u8; HEADER_BYTES + 16];
            assert_eq!(pool.put(&["k"], &[&object]), vec![Ok(())]);
            let mut buffer = vec![0u8; object.len()];
            let got = pool.get_into(&["k"], &mut [&mut buffer[..]]);
            let intact = matches!(got[0], Ok(read) if buffer[..read] == object[..]);
            assert!(!intact, "{} handed back the object", point.as_str());
            assert_eq!(pool.injector().fired(point), 1, "{}", point.as_str());
        }
        Ok(())
    }

    #[test]
    fn decisions_follow_the_seed_and_the_rate() -> TestResult {
        let keys: Vec<String> = (0..4000).map(|i| format!("key-{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let run = |seed: u64| -> Result<Vec<bool>, PoolError> {
            let mut spec = FaultSpec::default().with(FaultPoint::Exists, 0.1);
            spec.seed = seed;
            let pool = faulty(spec)?;
            Ok(pool.exists(&refs).iter().map(Result::is_err).collect())
        };
        let (first, again, other) = (run(7)?, run(7)?, run(8)?);
        assert_eq!(first, again, "same seed, same faults");
        assert_ne!(first, other, "another seed, other faults");
        let fired = first.iter().filter(|&&fired| fired).count();
        assert!((300..=500).contains(&fired), "{fired} of 4000 at rate 0.1");
        Ok(())
    }

    #[test]
    fn a_transient_fault_does_not_stick_to_its_key() -> TestResult {
        let pool = faulty(FaultSpec::default().with(FaultPoint::Exists, 0.5))?;
        let answers: Vec<bool> = (0..64).map(|_| pool.exists(&["k"])[0].is_err()).collect();
        assert!(answers.contains(&true) && answers.contains(&false));
        Ok(())
    }

    #[test]
    fn actor_points_fire_at_their_rate() {
        let injector =
            FaultInjector::new(FaultSpec::default().with(FaultPoint::SaveQueueFull, 0.25));
        let fired = (0..4000)
            .filter(|_| injector.fire(FaultPoint::SaveQueueFull))
            .count();
        assert!((800..=1200).contains(&fired), "{fired}");
        assert_eq!(injector.fired(FaultPoint::SaveQueueFull), fired as u64);
        assert!(!injector.fire(FaultPoint::StagingExhausted));
    }
}
