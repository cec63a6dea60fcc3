//! [`FaultyPool`], the pool wrapper that fires the pool points (module docs of
//! `pool::faults`, workflow step 3), and the injector's per-key decisions it uses. Built
//! where something wraps pools: the replay (`--faults`) and the crate's own tests; the
//! actor points and the memory pool's corruption aid (`faults` alone) need none of it.

use std::sync::Arc;
use std::time::Duration;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{FaultInjector, FaultPoint};
use crate::core::object::HEADER_BYTES;
use crate::pool::{Pool, PoolCounters, PoolError};

/// The kinds of pool call whose attempts are counted per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum CallKind {
    Exists,
    Put,
    Get,
    Touch,
}

impl FaultInjector {
    /// The attempt number of every key of one call of `kind`.
    pub(super) fn attempts(&self, kind: CallKind, keys: &[&str]) -> Vec<u32> {
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
/// was reached (a pool that cannot be reached is an [`Outage`](super::Outage), R30).
pub(super) const BATCH_FAULT: PoolError = PoolError::Backend { code: -1 };

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

    fn lend_staging(
        &self,
        bytes: usize,
    ) -> Option<Result<Box<dyn crate::gpu::LentHostMemory>, PoolError>> {
        self.inner.lend_staging(bytes)
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
