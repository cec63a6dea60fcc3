//! What the connector buys: the same workload replayed with no connector, side by side
//! with the connector's run (`replay --compare-baseline`, on by default for the built-in
//! demo).
//!
//! Both runs see the same requests, instances, cost model and KV memory; only the
//! connector differs, so the ratios are the connector's effect on simulated time to first
//! token, throughput and the prefill work the engines did. The figures are simulated (the
//! cost model's), like the report's `sim` section.

use std::io::{self, Write};

use serde::Serialize;

use super::report::{share, ReplayReport};

/// The figures compared, for one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunFigures {
    /// Median simulated time to first token.
    pub ttft_p50_s: f64,
    /// 99th percentile simulated time to first token.
    pub ttft_p99_s: f64,
    /// Completed requests per simulated second.
    pub throughput_rps: f64,
    /// Prompt tokens the engines computed (prefill work).
    pub computed_tokens: u64,
}

impl RunFigures {
    fn of(report: &ReplayReport) -> Self {
        Self {
            ttft_p50_s: report.sim.ttft_p50_s,
            ttft_p99_s: report.sim.ttft_p99_s,
            throughput_rps: report.sim.throughput_rps,
            computed_tokens: report.computed_tokens,
        }
    }
}

/// The connector's run against the run without one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BaselineComparison {
    /// The run with the connector (the report's own figures).
    pub with_connector: RunFigures,
    /// The same workload with no connector.
    pub without_connector: RunFigures,
    /// `without / with` median TTFT: above 1, the connector's first tokens come sooner.
    pub ttft_p50_speedup: f64,
    /// `without / with` p99 TTFT.
    pub ttft_p99_speedup: f64,
    /// `with / without` throughput: above 1, the connector completes more per second.
    pub throughput_ratio: f64,
    /// `with / without` prompt tokens computed: below 1, the connector saved prefill work.
    pub computed_tokens_ratio: f64,
}

impl BaselineComparison {
    /// Compares the connector's report with the no-connector report of the same workload.
    pub fn new(with: &ReplayReport, without: &ReplayReport) -> Self {
        let (with, without) = (RunFigures::of(with), RunFigures::of(without));
        Self {
            ttft_p50_speedup: ratio(without.ttft_p50_s, with.ttft_p50_s),
            ttft_p99_speedup: ratio(without.ttft_p99_s, with.ttft_p99_s),
            throughput_ratio: ratio(with.throughput_rps, without.throughput_rps),
            computed_tokens_ratio: share(with.computed_tokens, without.computed_tokens),
            with_connector: with,
            without_connector: without,
        }
    }

    /// The table section: one row per figure, both runs and the ratio.
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn write_table(&self, out: &mut dyn Write) -> io::Result<()> {
        let (with, without) = (&self.with_connector, &self.without_connector);
        writeln!(
            out,
            "against no connector (same workload, simulated)\n  {:<20}{:>14} {:>14} {:>9}",
            "", "with", "without", "ratio"
        )?;
        let rows = [
            (
                "ttft p50 (s)",
                with.ttft_p50_s,
                without.ttft_p50_s,
                self.ttft_p50_speedup,
                "faster",
            ),
            (
                "ttft p99 (s)",
                with.ttft_p99_s,
                without.ttft_p99_s,
                self.ttft_p99_speedup,
                "faster",
            ),
            (
                "throughput (req/s)",
                with.throughput_rps,
                without.throughput_rps,
                self.throughput_ratio,
                "",
            ),
        ];
        for (name, with, without, ratio, note) in rows {
            writeln!(
                out,
                "  {name:<20}{with:>14.3} {without:>14.3} {ratio:>8.2}x {note}"
            )?;
        }
        writeln!(
            out,
            "  {:<20}{:>14} {:>14} {:>8.2}x",
            "prefill tokens",
            with.computed_tokens,
            without.computed_tokens,
            self.computed_tokens_ratio
        )
    }
}

/// `part / whole` for simulated seconds and rates; 0 when `whole` is not positive.
fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_say_what_the_connector_bought_and_survive_empty_runs() {
        assert!((ratio(3.0, 1.5) - 2.0).abs() < 1e-12);
        assert!(ratio(1.0, 0.0).abs() < 1e-12);
        assert!(ratio(1.0, -1.0).abs() < 1e-12);
    }
}
