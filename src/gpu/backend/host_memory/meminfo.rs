//! How much memory the host has: `MemTotal` and `MemAvailable` of `/proc/meminfo`, so that
//! sizes a process would allocate can be checked before it allocates them (a staging pool
//! the heap refuses, a configuration larger than the machine).
//!
//! Linux only; elsewhere, or when the file cannot be read, [`host_memory`] answers `None`
//! and callers skip the check.

/// The host's memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// All memory the kernel manages (`MemTotal`).
    pub total_bytes: u64,
    /// What a new allocation can get without swapping (`MemAvailable`).
    pub available_bytes: u64,
}

/// The host's memory now, or `None` when `/proc/meminfo` cannot be read.
pub fn host_memory() -> Option<HostMemory> {
    parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// Reads `MemTotal` and `MemAvailable` (in kB) from the text of `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Option<HostMemory> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            kib.checked_mul(1024)
        })
    };
    Some(HostMemory {
        total_bytes: field("MemTotal")?,
        available_bytes: field("MemAvailable")?,
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_meminfo, HostMemory};

    #[test]
    fn total_and_available_are_read_in_bytes() {
        let text =
            "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some(HostMemory {
                total_bytes: 24_576_000 * 1024,
                available_bytes: 20_480_000 * 1024,
            })
        );
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None, "no MemAvailable");
        assert_eq!(parse_meminfo("MemTotal: x kB\nMemAvailable: 1 kB"), None);
    }
}
