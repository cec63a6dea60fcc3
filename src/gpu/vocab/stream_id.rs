//! Stream ids: [`StreamId`] names a copy stream in logs and errors (`s0`, `s1`, ...), unique
//! per device. Plain data, so errors and backends can carry it without the stream.

use std::fmt;

/// Identifies a stream in logs and errors (`s0`, `s1`, ...), unique per device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_id_displays_with_prefix() {
        assert_eq!(StreamId(3).to_string(), "s3");
    }
}
