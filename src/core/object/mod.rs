//! The stored object format (R5): an integrity header followed by the page payload.
//!
//! ```text
//! +---------------------------- 64 bytes ----------------------------+---- payload ----+
//! | bincode 2, fixed-width little-endian: magic "KVC1", version,     |  page bytes     |
//! | layout fingerprint, chain hash, group, shard, payload len,       |  (all layers    |
//! | checksum of the payload (`checksum.rs`); zero padding to 64 B    |   of a group)   |
//! +------------------------------------------------------------------+-----------------+
//! ```
//!
//! Workflow: the saver gathers a page into a staging slot at offset [`HEADER_BYTES`] and
//! [`seal`]s the slot (writes the header in place: no extra payload copy); a loader gets
//! the object into a staging slot and [`open`]s it against what it asked for, then
//! scatters the returned payload range to the device.
//!
//! Where the device computes page checksums itself (`CopyStream::scatter_checked`,
//! `gather_checked`), the CPU never reads a payload: the saver seals with the device's
//! checksum ([`seal_with_checksum`]) and a loader checks only the header
//! ([`open_header`]), then compares the stored checksum with the one the device computed
//! over the bytes that landed in the page ([`check_checksum`]).
//!
//! Invariants:
//! - `object::I1`. the header has a fixed size, so the payload sits at a fixed, aligned offset;
//! - `object::I2`. [`open`] accepts an object only if every header field equals what the caller
//!   expects and the checksum matches the payload; anything else is a typed
//!   [`ObjectError`], which the loader counts as `corrupt` and treats as a miss (R5).

use bincode::{Decode, Encode};

use super::hash::BlockHash;
use super::keys::Shard;
use super::layout::{GroupId, LayoutFingerprint};

/// Bytes reserved for the header in front of every payload.
pub const HEADER_BYTES: usize = 64;
/// The format version this build writes and accepts.
/// Version 2 replaced version 1's xxh3-64 with the position-keyed sum of `checksum.rs`.
pub const FORMAT_VERSION: u16 = 2;
const MAGIC: [u8; 4] = *b"KVC1";

/// What a stored object claims to be: the fields a loader checks against its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectIdentity {
    /// Fingerprint of the layout that wrote the page.
    pub layout_fingerprint: LayoutFingerprint,
    /// Chain hash of the block.
    pub chain_hash: BlockHash,
    /// Layer group of the page.
    pub group: GroupId,
    /// Shard of the page.
    pub shard: Shard,
}

/// The header as encoded on the wire (private: callers use [`ObjectIdentity`]).
#[derive(Encode, Decode, Debug, PartialEq, Eq)]
struct WireHeader {
    magic: [u8; 4],
    version: u16,
    layout_fingerprint: u64,
    chain_hash: [u8; 16],
    group: u32,
    /// 0 = per-rank, 1 = replicated.
    shard_kind: u8,
    shard_world: u32,
    shard_rank: u32,
    payload_len: u64,
    checksum: u64,
}

/// Why an object was refused (each is counted as `corrupt` by loaders).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ObjectError {
    /// Fewer bytes than a header plus the expected payload.
    #[error("object of {len} bytes is truncated: {needed} bytes expected")]
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes needed.
        needed: usize,
    },
    /// The buffer to seal has no room for the payload length given.
    #[error("buffer of {len} bytes cannot hold a {payload_len}-byte payload after the header")]
    BufferTooSmall {
        /// Buffer length.
        len: usize,
        /// Payload length.
        payload_len: usize,
    },
    /// The header bytes do not decode, or its zero padding is not zero.
    #[error("object header does not decode")]
    Undecodable,
    /// Not an object of this format.
    #[error("object magic {found:?} is not {MAGIC:?}")]
    BadMagic {
        /// Magic found.
        found: [u8; 4],
    },
    /// Written by another format version.
    #[error("object format version {found} is not supported (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion {
        /// Version found.
        found: u16,
    },
    /// Another layout wrote it.
    #[error("layout fingerprint {found:016x} differs from the expected {expected:016x}")]
    FingerprintMismatch {
        /// Expected fingerprint.
        expected: u64,
        /// Found fingerprint.
        found: u64,
    },
    /// Another block's page.
    #[error("chain hash {found} differs from the expected {expected}")]
    HashMismatch {
        /// Expected hash.
        expected: BlockHash,
        /// Found hash.
        found: BlockHash,
    },
    /// Another group's page.
    #[error("group {found} differs from the expected {expected}")]
    GroupMismatch {
        /// Expected group.
        expected: u32,
        /// Found group.
        found: u32,
    },
    /// Another shard's page.
    #[error("shard {found} differs from the expected {expected}")]
    ShardMismatch {
        /// Expected shard.
        expected: Shard,
        /// Found shard (as decoded; an unknown kind reads as replicated).
        found: Shard,
    },
    /// The header's payload length is not the page size.
    #[error("payload length {found} differs from the expected {expected}")]
    PayloadLengthMismatch {
        /// Expected payload length.
        expected: u64,
        /// Length in the header.
        found: u64,
    },
    /// The payload does not match its checksum.
    #[error("payload checksum {computed:016x} differs from the header's {stored:016x}")]
    ChecksumMismatch {
        /// Checksum in the header.
        stored: u64,
        /// Checksum of the payload read.
        computed: u64,
    },
}

impl ObjectError {
    /// A short, stable label for metrics and logs.
    #[cfg(feature = "internals")]
    pub fn kind(&self) -> &'static str {
        match self {
            ObjectError::BufferTooSmall { .. } => "buffer_too_small",
            ObjectError::Truncated { .. } => "truncated",
            ObjectError::ChecksumMismatch { .. } => "checksum",
            _ => "header",
        }
    }
}

fn wire_config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_fixed_int_encoding()
        .with_little_endian()
}

fn shard_fields(shard: Shard) -> (u8, u32, u32) {
    match shard {
        Shard::Rank { world, rank } => (0, world, rank),
        Shard::Replicated => (1, 0, 0),
    }
}

mod checksum;

pub use checksum::checksum;
#[cfg(any(feature = "cuda", feature = "internals"))]
pub use checksum::finish as finish_checksum;
#[cfg(feature = "internals")]
pub use checksum::{word_term, LEN_KEY, MIX, WORD_KEY, WORD_SALT};

/// Total object size for a payload of `payload_len` bytes.
pub fn object_len(payload_len: usize) -> usize {
    HEADER_BYTES + payload_len
}

/// Writes the header for the payload already in `buf[HEADER_BYTES..HEADER_BYTES + payload_len]`.
///
/// Returns the object length (`HEADER_BYTES + payload_len`).
///
/// # Errors
/// [`ObjectError::BufferTooSmall`] when `buf` cannot hold header and payload.
#[cfg(feature = "internals")]
pub fn seal(
    identity: &ObjectIdentity,
    buf: &mut [u8],
    payload_len: usize,
) -> Result<usize, ObjectError> {
    let payload_checksum = checksum(payload_area(buf, payload_len)?);
    seal_with_checksum(identity, buf, payload_len, payload_checksum)
}

/// The payload bytes after the header area of `buf`.
fn payload_area(buf: &[u8], payload_len: usize) -> Result<&[u8], ObjectError> {
    buf.get(HEADER_BYTES..object_len(payload_len))
        .ok_or(ObjectError::BufferTooSmall {
            len: buf.len(),
            payload_len,
        })
}

/// [`seal`] with the payload's checksum already known (computed by the device over the
/// page the payload was gathered from): writes only the header.
///
/// # Errors
/// [`ObjectError::BufferTooSmall`] when `buf` cannot hold header and payload.
pub fn seal_with_checksum(
    identity: &ObjectIdentity,
    buf: &mut [u8],
    payload_len: usize,
    payload_checksum: u64,
) -> Result<usize, ObjectError> {
    payload_area(buf, payload_len)?;
    let total = object_len(payload_len);
    let header_area = &mut buf[..HEADER_BYTES];
    let (shard_kind, shard_world, shard_rank) = shard_fields(identity.shard);
    let header = WireHeader {
        magic: MAGIC,
        version: FORMAT_VERSION,
        layout_fingerprint: identity.layout_fingerprint.0,
        chain_hash: identity.chain_hash.0,
        group: identity.group.0,
        shard_kind,
        shard_world,
        shard_rank,
        payload_len: payload_len as u64,
        checksum: payload_checksum,
    };
    header_area.fill(0);
    // The fixed-width header is 59 bytes, so it always fits the 64-byte area (`object::I1`).
    bincode::encode_into_slice(header, header_area, wire_config()).map_err(|_| {
        ObjectError::BufferTooSmall {
            len: HEADER_BYTES,
            payload_len: 0,
        }
    })?;
    Ok(total)
}

/// Checks an object against what the caller asked for and returns its payload (`object::I2`).
///
/// `expected_payload_len` is the page size of the group; `object` may be longer than the
/// object (a staging slot), but not shorter.
///
/// # Errors
/// The first mismatch found, as an [`ObjectError`].
#[cfg(feature = "internals")]
pub fn open<'a>(
    expected: &ObjectIdentity,
    object: &'a [u8],
    expected_payload_len: usize,
) -> Result<&'a [u8], ObjectError> {
    let stored = open_header(expected, object, expected_payload_len)?;
    let payload = &object[HEADER_BYTES..object_len(expected_payload_len)];
    check_checksum(stored, checksum(payload))?;
    Ok(payload)
}

/// Checks every header field of an object against what the caller asked for, and its
/// length, without reading the payload; returns the stored payload checksum, which the
/// caller must compare ([`check_checksum`]) with the checksum of the bytes it uses (`object::I2`).
///
/// # Errors
/// The first mismatch found, as an [`ObjectError`].
pub fn open_header(
    expected: &ObjectIdentity,
    object: &[u8],
    expected_payload_len: usize,
) -> Result<u64, ObjectError> {
    let needed = object_len(expected_payload_len);
    if object.len() < needed {
        return Err(ObjectError::Truncated {
            len: object.len(),
            needed,
        });
    }
    let (header, used): (WireHeader, usize) =
        bincode::decode_from_slice(&object[..HEADER_BYTES], wire_config())
            .map_err(|_| ObjectError::Undecodable)?;
    if object[used..HEADER_BYTES].iter().any(|&byte| byte != 0) {
        return Err(ObjectError::Undecodable);
    }
    check_header(expected, &header, expected_payload_len as u64)?;
    Ok(header.checksum)
}

/// Compares a header's stored checksum with the checksum computed over the payload.
///
/// # Errors
/// [`ObjectError::ChecksumMismatch`] when they differ.
pub fn check_checksum(stored: u64, computed: u64) -> Result<(), ObjectError> {
    if stored == computed {
        Ok(())
    } else {
        Err(ObjectError::ChecksumMismatch { stored, computed })
    }
}

fn check_header(
    expected: &ObjectIdentity,
    header: &WireHeader,
    payload_len: u64,
) -> Result<(), ObjectError> {
    if header.magic != MAGIC {
        return Err(ObjectError::BadMagic {
            found: header.magic,
        });
    }
    if header.version != FORMAT_VERSION {
        return Err(ObjectError::UnsupportedVersion {
            found: header.version,
        });
    }
    if header.layout_fingerprint != expected.layout_fingerprint.0 {
        return Err(ObjectError::FingerprintMismatch {
            expected: expected.layout_fingerprint.0,
            found: header.layout_fingerprint,
        });
    }
    if header.chain_hash != expected.chain_hash.0 {
        return Err(ObjectError::HashMismatch {
            expected: expected.chain_hash,
            found: BlockHash(header.chain_hash),
        });
    }
    if header.group != expected.group.0 {
        return Err(ObjectError::GroupMismatch {
            expected: expected.group.0,
            found: header.group,
        });
    }
    if (header.shard_kind, header.shard_world, header.shard_rank) != shard_fields(expected.shard) {
        let found = match header.shard_kind {
            0 => Shard::Rank {
                world: header.shard_world,
                rank: header.shard_rank,
            },
            _ => Shard::Replicated,
        };
        return Err(ObjectError::ShardMismatch {
            expected: expected.shard,
            found,
        });
    }
    if header.payload_len != payload_len {
        return Err(ObjectError::PayloadLengthMismatch {
            expected: payload_len,
            found: header.payload_len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
