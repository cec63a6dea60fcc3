//! Lent host memory: bytes that another owner maps into this process and lends for as long
//! as a lease lives. Mooncake's one-node layout needs it: a dummy client moves data only
//! between buffers taken from its pool, shared memory that the node's real client maps
//! too, so the loaders' and the saver's staging must live there to move without a copy.
//!
//! The lender promises what Rust cannot check by implementing the `unsafe` trait
//! [`LentHostMemory`]; [`LentBuffer`] turns a lease into owned bytes like a `Box<[u8]>`.
//!
//! Invariants:
//! - `gpu::lent::L1`. The bytes are initialized before they are seen: the buffer zeroes them
//!   when it takes the lease.
//! - `gpu::lent::L2`. The lease outlives every use of the bytes: the buffer holds it and drops
//!   it last, after a CUDA registration of the same range (field order).

use std::fmt;
use std::ptr::NonNull;

/// Host memory lent by another owner (a pool's client) for as long as this value lives.
///
/// # Safety
///
/// An implementor promises that `addr()..addr() + len()` is readable and writable host
/// memory, mapped into this process from the moment the value exists until it is dropped,
/// that `len()` is at least 1 and both answers never change, and that nothing else reads or
/// writes the range while the value lives except transfers its holder asks for.
pub unsafe trait LentHostMemory: Send + Sync + 'static {
    /// The first byte's address.
    fn addr(&self) -> usize;
    /// How many bytes are lent.
    fn len(&self) -> usize;

    /// Never `true` for a lease that keeps the promise (`len() >= 1`).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The bytes of a lease, owned like a `Box<[u8]>` (`gpu::lent::L1`, `gpu::lent::L2`).
pub(crate) struct LentBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// Page-locks the range for a CUDA device's copies; ends before the lease.
    #[cfg(feature = "cuda")]
    registration: Option<super::backend::cuda::HostRegistration>,
    /// Keeps the memory mapped; dropped last (`gpu::lent::L2`).
    _lease: Box<dyn LentHostMemory>,
}

// SAFETY: the buffer owns its range exclusively for the lease's life (the trait's promise),
// like a `Box<[u8]>`, and the lease itself is `Send`.
unsafe impl Send for LentBuffer {}
// SAFETY: `&LentBuffer` only hands out `&[u8]`.
unsafe impl Sync for LentBuffer {}

impl LentBuffer {
    /// Takes `lease` and zeroes its bytes (`gpu::lent::L1`); `None` for a null address.
    pub(crate) fn new(lease: Box<dyn LentHostMemory>) -> Option<Self> {
        let len = lease.len();
        let ptr = NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(lease.addr()))?;
        // SAFETY: the lender maps `len` writable bytes at `ptr` for the lease's life
        // (`LentHostMemory`), and nobody else uses them.
        unsafe { ptr.as_ptr().write_bytes(0, len) };
        Some(Self {
            ptr,
            len,
            #[cfg(feature = "cuda")]
            registration: None,
            _lease: lease,
        })
    }

    /// Takes `lease` for `bytes` bytes of `what` ([`new`](Self::new)).
    ///
    /// # Errors
    /// [`GpuError::HostAllocFailed`](super::GpuError) naming `what` when the lease is
    /// smaller than `bytes` or has no address.
    pub(crate) fn take(
        lease: Box<dyn LentHostMemory>,
        bytes: usize,
        what: &'static str,
    ) -> Result<Self, super::GpuError> {
        let refused = super::GpuError::HostAllocFailed { what, bytes };
        if lease.len() < bytes {
            return Err(refused);
        }
        Self::new(lease).ok_or(refused)
    }

    /// Page-locks the bytes for `cuda`'s copies, once.
    ///
    /// # Errors
    /// [`GpuError::Driver`](super::GpuError) from `cuMemHostRegister`.
    #[cfg(feature = "cuda")]
    pub(crate) fn register_with(
        &mut self,
        cuda: &super::backend::cuda::CudaDevice,
    ) -> Result<(), super::GpuError> {
        if self.registration.is_none() {
            self.registration = Some(cuda.register_host(self.ptr.as_ptr(), self.len)?);
        }
        Ok(())
    }

    /// Whether a CUDA device page-locked the bytes.
    #[cfg_attr(not(feature = "cuda"), expect(clippy::unused_self, reason = "only CUDA registers"))]
    pub(crate) fn is_registered(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.registration.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// The whole buffer.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes (`gpu::lent::L1`) mapped while the lease lives
        // (`gpu::lent::L2`); `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole buffer, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for LentBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentBuffer")
            .field("len", &self.len)
            .field("registered", &self.is_registered())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heap memory lent the way a pool's client lends its shared memory.
    struct HeapLease(Box<[u8]>);

    // SAFETY: the box stays allocated, unmoved and unused elsewhere while the lease lives.
    unsafe impl LentHostMemory for HeapLease {
        fn addr(&self) -> usize {
            self.0.as_ptr().expose_provenance()
        }
        fn len(&self) -> usize {
            self.0.len()
        }
    }

    #[test]
    fn a_lease_is_zeroed_and_writable_through_the_buffer() {
        let lease = HeapLease(vec![7u8; 4096].into_boxed_slice());
        let addr = lease.addr();
        let Some(mut buffer) = LentBuffer::new(Box::new(lease)) else {
            panic!("a heap lease has an address");
        };
        assert!(buffer.as_slice().iter().all(|&byte| byte == 0), "zeroed on taking");
        buffer.as_mut_slice()[4095] = 9;
        assert_eq!(buffer.as_slice()[4095], 9);
        assert_eq!(buffer.as_slice().as_ptr().addr(), addr, "the lent bytes, not a copy");
        assert!(!buffer.is_registered());
    }
}
