//! SIGINT and SIGTERM for long subcommands (`kv-connector replay`): the first signal asks
//! for a graceful stop, a second one of the same kind ends the process at once.
//!
//! Workflow:
//! 1. [`StopSignal::install`] registers both signals with `signal-hook` (no hand-written
//!    handler: the handler only stores the signal number in an atomic);
//! 2. the subcommand polls [`StopSignal::received`] between units of work (the replay
//!    driver between event-loop turns), stops admitting work, lets the connector run its
//!    shutdown protocol and prints its partial report;
//! 3. `main` exits with [`Signal::exit_code`] (128 + the signal number: 130, 143).
//!
//! A second SIGINT or SIGTERM while the graceful stop runs exits at once with the same
//! code (signal-hook's conditional shutdown), so a stuck pool cannot trap the user.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};

/// A signal that asks the process to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (a service manager or `kill`).
    Terminate,
}

impl Signal {
    /// The signal number.
    pub fn number(self) -> i32 {
        match self {
            Self::Interrupt => SIGINT,
            Self::Terminate => SIGTERM,
        }
    }

    /// The shell convention for a process stopped by this signal: 128 + its number.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Interrupt => 130,
            Self::Terminate => 143,
        }
    }

    /// The name, lower-case, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interrupt => "sigint",
            Self::Terminate => "sigterm",
        }
    }

    fn from_number(number: usize) -> Option<Self> {
        let number = i32::try_from(number).ok()?;
        [Self::Interrupt, Self::Terminate]
            .into_iter()
            .find(|signal| signal.number() == number)
    }
}

/// Whether a stop signal arrived (shared: clones see the same flag).
#[derive(Clone, Debug, Default)]
pub struct StopSignal {
    /// 0 until a signal arrives, then its number.
    received: Arc<AtomicUsize>,
}

impl StopSignal {
    /// A flag no signal sets (library callers and tests); [`request`](Self::request) sets it.
    #[cfg(feature = "internals")]
    pub fn never() -> Self {
        Self::default()
    }

    /// Registers SIGINT and SIGTERM for this process.
    ///
    /// # Errors
    /// The `io::Error` of signal registration (not expected on Linux).
    pub fn install() -> io::Result<Self> {
        let stop = Self::default();
        for signal in [Signal::Interrupt, Signal::Terminate] {
            let number = signal.number();
            let again = Arc::new(AtomicBool::new(false));
            // Registered first, so it sees the flag as the previous signal left it.
            signal_hook::flag::register_conditional_shutdown(
                number,
                i32::from(signal.exit_code()),
                Arc::clone(&again),
            )?;
            signal_hook::flag::register(number, again)?;
            signal_hook::flag::register_usize(
                number,
                Arc::clone(&stop.received),
                usize::try_from(number).unwrap_or(0),
            )?;
        }
        Ok(stop)
    }

    /// The stop signal received, if any.
    pub fn received(&self) -> Option<Signal> {
        Signal::from_number(self.received.load(Ordering::SeqCst))
    }

    /// Asks for a stop as if `signal` had arrived.
    #[cfg(feature = "internals")]
    pub fn request(&self, signal: Signal) {
        self.received.store(
            usize::try_from(signal.number()).unwrap_or(0),
            Ordering::SeqCst,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_128_plus_the_signal_number() {
        for signal in [Signal::Interrupt, Signal::Terminate] {
            assert_eq!(i32::from(signal.exit_code()), 128 + signal.number());
        }
    }

    #[test]
    fn a_requested_stop_is_seen_by_every_clone() {
        let stop = StopSignal::never();
        let seen_by = stop.clone();
        assert_eq!(seen_by.received(), None);
        stop.request(Signal::Terminate);
        assert_eq!(seen_by.received(), Some(Signal::Terminate));
    }
}
