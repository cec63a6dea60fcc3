//! The checks a finished replay must pass (`docs/DESIGN.md` section 11: every loaded page
//! is checked, and the required number of mismatches is zero), and the reasons a replay
//! that ran to its end failed them.
//!
//! A replay passes when:
//! - `checks::C1`. no page loaded from the pool or shared from a local prefix cache differs
//!   from what computing its block gives (`mismatched_pages = 0`);
//! - `checks::C2`. nothing was published past the chunk end (R16, R18): neither the
//!   connectors' own count (`published_past_chunk_end`) nor the pool's witness
//!   (`published_uncomputed_pages`, [`super::witness`]) saw any;
//! - `checks::C3`. the accounting closes ([`ReplayReport::accounting_closed`]): every save
//!   and every load is settled exactly once.
//!
//! `kv-connector replay` writes its whole report (stdout, `--json`, `--report-dir`) before
//! it looks at the checks, then fails with every failed check named on one line
//! (`cli::replay`); a replay stopped by a signal reports the signal instead.

use std::fmt;

use super::report::ReplayReport;

/// One check a finished replay failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailedCheck {
    /// `checks::C1`: pages whose bytes differ from what computing them gives.
    MismatchedPages {
        /// `mismatched_pages`.
        pages: u64,
    },
    /// `checks::C2`: pages published past the chunk end of their step.
    PublishedPastChunkEnd {
        /// `published_past_chunk_end`: counted by the connectors.
        counted: u64,
        /// `published_uncomputed_pages`: seen at the pool.
        witnessed: u64,
    },
    /// `checks::C3`: saves or loads not settled exactly once.
    AccountingOpen {
        /// `saves_enqueued`.
        saves_enqueued: u64,
        /// `saves_done + saves_skipped_present + saves_dropped + saves_failed`.
        saves_settled: u128,
        /// `loads_started`.
        loads_started: u64,
        /// `loads_done + loads_failed`.
        loads_settled: u128,
    },
}

impl fmt::Display for FailedCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::MismatchedPages { pages } => write!(
                f,
                "{pages} mismatched pages (loaded or shared pages whose bytes differ from what \
                 computing them gives; must be 0)"
            ),
            Self::PublishedPastChunkEnd { counted, witnessed } => write!(
                f,
                "pages published past the chunk end (R16; must be 0): {counted} counted by the \
                 connectors, {witnessed} uncomputed pages seen at the pool"
            ),
            Self::AccountingOpen {
                saves_enqueued,
                saves_settled,
                loads_started,
                loads_settled,
            } => write!(
                f,
                "the accounting does not close: {saves_enqueued} saves enqueued, {saves_settled} \
                 settled (done, skipped, dropped or failed); {loads_started} loads started, \
                 {loads_settled} settled (done or failed)"
            ),
        }
    }
}

/// Every check a finished replay failed, in the order of the module docs; displayed on
/// one line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the replay failed its checks: {}", join(.0))]
pub struct FailedChecks(pub Vec<FailedCheck>);

fn join(failed: &[FailedCheck]) -> String {
    failed
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks a finished replay's report (module docs).
///
/// # Errors
///
/// [`FailedChecks`] naming every check the report fails.
pub fn check(report: &ReplayReport) -> Result<(), FailedChecks> {
    let mut failed = Vec::new();
    if report.mismatched_pages > 0 {
        failed.push(FailedCheck::MismatchedPages {
            pages: report.mismatched_pages,
        });
    }
    if report.published_past_chunk_end > 0 || report.published_uncomputed_pages > 0 {
        failed.push(FailedCheck::PublishedPastChunkEnd {
            counted: report.published_past_chunk_end,
            witnessed: report.published_uncomputed_pages,
        });
    }
    if !report.accounting_closed() {
        failed.push(FailedCheck::AccountingOpen {
            saves_enqueued: report.saves_enqueued,
            saves_settled: u128::from(report.saves_done)
                + u128::from(report.saves_skipped_present)
                + u128::from(report.saves_dropped)
                + u128::from(report.saves_failed),
            loads_started: report.loads_started,
            loads_settled: u128::from(report.loads_done) + u128::from(report.loads_failed),
        });
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(FailedChecks(failed))
    }
}
