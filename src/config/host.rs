//! The host-memory check of a configuration: the memory it takes on a node (R9: the pool
//! memory it contributes and every staging pool, [`Config::node_memory`]) against the
//! host's memory, refused naming the largest part and a value of it with which everything
//! fits. `kv-connector validate` runs it against `MemTotal`; a Python connector at start
//! against what the host can give now (the share of `MemAvailable` a pool may reserve,
//! plus what a pool it was given holds already), with that pool counted as
//! `pool.capacity_bytes`.

use super::runtime::RuntimeConfig;
use super::{bytes_text, Config, NodeMemory, MIB};

/// The configuration takes more memory than the host has.
#[derive(Debug, thiserror::Error)]
#[error(
    "the configuration takes {} of host memory ({} {} + loader staging {} + saver staging \
     {}), more than this host has ({} {host_field}); lower {fits_key}, e.g. {fits_key}={}MiB",
    bytes_text(memory.total_bytes()), memory.pool_key, bytes_text(memory.pool_bytes),
    bytes_text(memory.loader_staging_bytes), bytes_text(memory.saver_staging_bytes),
    bytes_text(*host_bytes), fits_bytes / MIB
)]
pub struct HostMemoryExceeded {
    /// What the configuration takes.
    pub memory: NodeMemory,
    /// The host's memory checked against.
    pub host_bytes: u64,
    /// What `host_bytes` is: `MemTotal`, or what the host can give now.
    pub host_field: &'static str,
    /// The key of the largest part.
    pub fits_key: &'static str,
    /// A value of that key with which everything fits (whole MiB).
    pub fits_bytes: u64,
}

impl HostMemoryExceeded {
    /// A short, stable label for metrics and logs.
    #[allow(clippy::unused_self, reason = "every error kind() takes the error; this one has a single kind")]
    pub fn kind(&self) -> &'static str {
        "host_memory_exceeded"
    }
}

impl Config {
    /// Checks the memory this configuration takes on a node against `host_bytes` of the
    /// host's memory, `host_field` saying which (`MemTotal`, ...); `runtime` is what
    /// [`Config::validate`] gave.
    ///
    /// # Errors
    /// [`HostMemoryExceeded`] naming the largest part and a value of it that fits.
    pub fn check_host_memory(
        &self,
        runtime: &RuntimeConfig,
        host_bytes: u64,
        host_field: &'static str,
    ) -> Result<(), HostMemoryExceeded> {
        let memory = self.node_memory(runtime);
        let Some(excess) = memory
            .total_bytes()
            .checked_sub(host_bytes)
            .filter(|&excess| excess > 0)
        else {
            return Ok(());
        };
        let loader_threads = runtime.loaders.load_threads.get() as u64;
        // The largest part, and how many pools of its key it is.
        let parts = [
            (memory.pool_key, memory.pool_bytes, 1),
            (
                "loaders.staging_bytes_per_loader",
                memory.loader_staging_bytes,
                loader_threads,
            ),
            ("saver.staging_bytes", memory.saver_staging_bytes, 1),
        ];
        // The last of equal parts, as `max_by_key` picks.
        let (fits_key, part_bytes, pools) =
            parts.into_iter().fold(
                parts[0],
                |largest, part| {
                    if part.1 >= largest.1 {
                        part
                    } else {
                        largest
                    }
                },
            );
        let per_pool = part_bytes.saturating_sub(excess) / pools;
        Err(HostMemoryExceeded {
            memory,
            host_bytes,
            host_field,
            fits_key,
            fits_bytes: (per_pool / MIB).max(1) * MIB,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GIB;

    #[test]
    fn the_largest_part_is_named_with_a_value_that_fits() -> Result<(), Box<dyn std::error::Error>>
    {
        let mut config = Config::default();
        config.pool.capacity_bytes = 64 * GIB;
        let runtime = config.validate()?;
        let refused = config
            .check_host_memory(&runtime, 24 * GIB, "MemTotal")
            .err()
            .ok_or("64 GiB of pool on 24 GiB was accepted")?;
        assert_eq!(refused.fits_key, "pool.capacity_bytes");
        let text = refused.to_string();
        assert!(
            text.contains(&format!(
                "pool.capacity_bytes={}MiB",
                refused.fits_bytes / MIB
            )),
            "{text}"
        );
        config.pool.capacity_bytes = refused.fits_bytes;
        let runtime = config.validate()?;
        assert!(
            config
                .check_host_memory(&runtime, 24 * GIB, "MemTotal")
                .is_ok(),
            "the advice fits"
        );
        Ok(())
    }
}
