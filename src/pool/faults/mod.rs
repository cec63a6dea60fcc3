//! Fault injection (feature `faults`): a [`Pool`] wrapper with named fault points
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
//!    around the inner pool. The actors reach the injector through [`Pool::faults`] (or
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
//!   vector: the [`Pool`] contract still holds.
//! - `faults::F2`. A faulted put stores nothing; a faulted get leaves no verified object in its
//!   buffer (R5 makes the corrupt ones a miss).
//! - `faults::F3`. A rate of 0 never fires and never changes an answer; a spec with no point set
//!   wraps a pool without any change in behaviour.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{Pool, PoolCounters, PoolError};
use crate::core::object::HEADER_BYTES;

mod outage;
mod spec;

pub use outage::Outage;
#[cfg(any(feature = "cli", feature = "internals"))]
pub use spec::FaultSpecError;
pub use spec::{FaultPoint, FaultSpec};

/// The kinds of pool call whose attempts are counted per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum CallKind {
    Exists,
    Put,
    Get,
    Touch,
}

/// Decides and counts faults; shared by every [`FaultyPool`] of a run and reachable from
/// actors through [`Pool::faults`].
#[derive(Debug)]
pub struct FaultInjector {
    spec: FaultSpec,
    /// How often each point fired, index = [`FaultPoint`] order.
    fired: [AtomicU64; FaultPoint::ALL.len()],
    /// Calls of each point so far (the attempt of actor points).
    calls: [AtomicU64; FaultPoint::ALL.len()],
    /// Earlier calls per (kind, key hash): the attempt of pool decisions.
    attempts: Mutex<HashMap<(CallKind, u64), u32>>,
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

    /// The attempt number of every key of one call of `kind`.
    fn attempts(&self, kind: CallKind, keys: &[&str]) -> Vec<u32> {
        let mut attempts = self.attempts.lock();
        keys.iter()
            .map(|key| {
                let slot = attempts
                    .entry((kind, xxh3_64_with_seed(key.as_bytes(), 0)))
                    .or_insert(0);
                let attempt = *slot;
                *slot = slot.saturating_add(1);
                attempt
            })
            .collect()
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

    /// Whether a pool point fires for `key` at `attempt`.
    fn key_fires(&self, point: FaultPoint, key: &str, attempt: u32) -> bool {
        self.decide(point, key.as_bytes(), attempt)
    }

    /// A batch point decides on the first key and its attempt.
    fn batch_fires(&self, point: FaultPoint, keys: &[&str], attempts: &[u32]) -> bool {
        match (keys.first(), attempts.first()) {
            (Some(key), Some(&attempt)) => self.key_fires(point, key, attempt),
            _ => false,
        }
    }

    /// [`FaultPoint::Slow`]: answers `slow_ms` late.
    fn maybe_slow(&self, keys: &[&str], attempts: &[u32]) {
        if self.batch_fires(FaultPoint::Slow, keys, attempts) {
            std::thread::sleep(Duration::from_millis(self.spec.slow_ms));
        }
    }
}

/// What a batch fault and a per-key probe fault answer: an error code from a backend that
/// was reached (a pool that cannot be reached is an [`Outage`], R30).
const BATCH_FAULT: PoolError = PoolError::Backend { code: -1 };

/// A pool whose calls pass through named fault points (module docs).
pub struct FaultyPool {
    inner: Arc<dyn Pool>,
    faults: Arc<FaultInjector>,
}

impl FaultyPool {
    /// Wraps `inner`; every wrapper of a run may share one injector.
    pub fn new(inner: Arc<dyn Pool>, faults: Arc<FaultInjector>) -> Self {
        Self { inner, faults }
    }

    /// The injector.
    #[cfg(feature = "internals")]
    pub fn injector(&self) -> &Arc<FaultInjector> {
        &self.faults
    }

    /// The shape of `exists` and `touch`: batch point, per-key point, inner call.
    fn probe(
        &self,
        kind: CallKind,
        (batch, per_key): (FaultPoint, FaultPoint),
        keys: &[&str],
        call: impl FnOnce(&[&str]) -> Vec<Result<bool, PoolError>>,
    ) -> Vec<Result<bool, PoolError>> {
        if let Some(gone) = self.faults.outage.answer(keys.len()) {
            return gone;
        }
        let attempts = self.faults.attempts(kind, keys);
        self.faults.maybe_slow(keys, &attempts);
        if self.faults.batch_fires(batch, keys, &attempts) {
            return BATCH_FAULT.for_every_key(keys.len());
        }
        let mut results = call(keys);
        for ((key, attempt), result) in keys.iter().zip(&attempts).zip(results.iter_mut()) {
            if self.faults.key_fires(per_key, key, *attempt) {
                *result = Err(BATCH_FAULT);
            }
        }
        results
    }
}

impl Pool for FaultyPool {
    fn exists(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        let points = (FaultPoint::ExistsBatch, FaultPoint::Exists);
        self.probe(CallKind::Exists, points, keys, |keys| {
            self.inner.exists(keys)
        })
    }

    fn put(&self, keys: &[&str], values: &[&[u8]]) -> Vec<Result<(), PoolError>> {
        if keys.len() != values.len() {
            return self.inner.put(keys, values);
        }
        if let Some(gone) = self.faults.outage.answer(keys.len()) {
            return gone;
        }
        let attempts = self.faults.attempts(CallKind::Put, keys);
        self.faults.maybe_slow(keys, &attempts);
        if self
            .faults
            .batch_fires(FaultPoint::SaverPanic, keys, &attempts)
        {
            injected_panic("saver_panic: the pool client panicked inside a put");
        }
        if self
            .faults
            .batch_fires(FaultPoint::PutBatch, keys, &attempts)
        {
            return BATCH_FAULT.for_every_key(keys.len());
        }
        // `faults::F2`: a faulted key is not passed on, so nothing is stored under it.
        let faulted: Vec<bool> = keys
            .iter()
            .zip(&attempts)
            .map(|(key, attempt)| self.faults.key_fires(FaultPoint::Put, key, *attempt))
            .collect();
        let (passed_keys, passed_values): (Vec<&str>, Vec<&[u8]>) = keys
            .iter()
            .zip(values)
            .zip(&faulted)
            .filter(|(_, &faulted)| !faulted)
            .map(|((key, value), _)| (*key, *value))
            .unzip();
        let mut passed = self.inner.put(&passed_keys, &passed_values).into_iter();
        faulted
            .iter()
            .map(|&faulted| {
                if faulted {
                    Err(PoolError::Backend { code: -1 })
                } else {
                    passed.next().unwrap_or(Err(PoolError::Unavailable))
                }
            })
            .collect()
    }

    fn get_into(&self, keys: &[&str], buffers: &mut [&mut [u8]]) -> Vec<Result<usize, PoolError>> {
        if keys.len() != buffers.len() {
            return self.inner.get_into(keys, buffers);
        }
        if let Some(gone) = self.faults.outage.answer(keys.len()) {
            return gone;
        }
        let attempts = self.faults.attempts(CallKind::Get, keys);
        self.faults.maybe_slow(keys, &attempts);
        if self
            .faults
            .batch_fires(FaultPoint::LoaderPanic, keys, &attempts)
        {
            injected_panic("loader_panic: the pool client panicked inside a get");
        }
        if self
            .faults
            .batch_fires(FaultPoint::GetBatch, keys, &attempts)
        {
            return BATCH_FAULT.for_every_key(keys.len());
        }
        if self
            .faults
            .batch_fires(FaultPoint::Timeout, keys, &attempts)
        {
            return PoolError::Timeout { after_ms: 0 }.for_every_key(keys.len());
        }
        let refused: Vec<Option<PoolError>> = keys
            .iter()
            .zip(&attempts)
            .map(|(key, &attempt)| {
                if self.faults.key_fires(FaultPoint::Get, key, attempt) {
                    Some(PoolError::Backend { code: -1 })
                } else if self.faults.key_fires(FaultPoint::Evict, key, attempt) {
                    Some(PoolError::NotFound)
                } else {
                    None
                }
            })
            .collect();
        let passed_keys: Vec<&str> = keys
            .iter()
            .zip(&refused)
            .filter(|(_, refused)| refused.is_none())
            .map(|(key, _)| *key)
            .collect();
        let mut passed_buffers: Vec<&mut [u8]> = buffers
            .iter_mut()
            .zip(&refused)
            .filter(|(_, refused)| refused.is_none())
            .map(|(buffer, _)| &mut **buffer)
            .collect();
        let mut passed = self
            .inner
            .get_into(&passed_keys, &mut passed_buffers)
            .into_iter();
        let mut results = Vec::with_capacity(keys.len());
        for (index, refused) in refused.into_iter().enumerate() {
            let result = match refused {
                Some(error) => Err(error),
                None => passed.next().unwrap_or(Err(PoolError::Unavailable)),
            };
            if let Ok(read) = result {
                self.corrupt(keys[index], attempts[index], &mut buffers[index][..read]);
            }
            results.push(result);
        }
        results
    }

    fn touch(&self, keys: &[&str]) -> Vec<Result<bool, PoolError>> {
        let points = (FaultPoint::TouchBatch, FaultPoint::Touch);
        self.probe(CallKind::Touch, points, keys, |keys| self.inner.touch(keys))
    }

    fn counters(&self) -> PoolCounters {
        self.inner.counters()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn register_staging(&self, staging: &[u8]) -> Result<(), PoolError> {
        self.inner.register_staging(staging)
    }

    fn unregister_staging(&self, start_addr: usize) -> Result<(), PoolError> {
        self.inner.unregister_staging(start_addr)
    }

    fn faults(&self) -> Option<&FaultInjector> {
        Some(&self.faults)
    }
}

impl FaultyPool {
    /// [`FaultPoint::CorruptHeader`] / [`FaultPoint::CorruptPayload`]: flips one byte of
    /// the object read into `object` (every header byte is checked on open, R5).
    fn corrupt(&self, key: &str, attempt: u32, object: &mut [u8]) {
        let header = object.len().min(HEADER_BYTES);
        let at =
            usize::try_from(xxh3_64_with_seed(key.as_bytes(), u64::from(attempt))).unwrap_or(0);
        if header > 0
            && self
                .faults
                .key_fires(FaultPoint::CorruptHeader, key, attempt)
        {
            object[at % header] ^= 0x5A;
        }
        let payload = object.len() - header;
        if payload > 0
            && self
                .faults
                .key_fires(FaultPoint::CorruptPayload, key, attempt)
        {
            object[header + at % payload] ^= 0xA5;
        }
    }
}

/// Unwinds like a panic of the pool client, without the panic hook: an injected panic is
/// expected, so it prints no message or backtrace of its own; the actor that catches it
/// logs one line with this payload.
fn injected_panic(what: &str) -> ! {
    std::panic::resume_unwind(Box::new(format!("injected fault {what}")))
}

impl std::fmt::Debug for FaultyPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyPool")
            .field("inner", &self.inner.name())
            .field("spec", self.faults.spec())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::eviction::EvictionPolicy;
    use crate::pool::{MemoryPool, SystemClock};

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
