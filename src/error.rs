//! The crate error: one variant per layer, each wrapping that layer's typed error (G10).

/// Any error the crate returns to a caller outside one layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {}

impl Error {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match *self {}
    }
}

/// Shorthand for results carrying the crate [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
