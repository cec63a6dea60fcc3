//! What one node's replay reported, the checks every scenario makes of it, and the
//! scenario's summary line.
//!
//! A node's `--json` report is this node's share only: its `oracle_reusable_tokens`
//! counts what its own requests could give each other, so reuse above it is reuse of
//! prefixes other nodes saved (the report's note on shares above 100 %).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use kv_connector::replay::report::share;
use serde_json::Value;

use super::procs::Finished;

type TestError = Box<dyn std::error::Error>;

/// The figures of one node's report the scenarios check.
pub struct NodeResult {
    /// `node0`, `node2-late`, ...
    pub label: String,
    /// Exit status: 0 ran to its end and passed its checks (3: failed one).
    pub code: i32,
    pub requests: u64,
    pub completed: u64,
    pub prompt_tokens: u64,
    pub reused_tokens: u64,
    pub oracle_reusable_tokens: u64,
    pub mismatched_pages: u64,
    pub verified_pages: u64,
    pub loads_started: u64,
    pub loads_failed: u64,
    pub saves_failed: u64,
    pub saves_outage: u64,
    /// `pool_health.outages`: times the pool became unreachable (R30).
    pub outages: u64,
    /// `lookups.outage`: lookups lost to an outage.
    pub lookups_lost: u64,
    /// `lookups.full_miss`.
    pub full_misses: u64,
    /// Whether the accounting closed (`checks::C3`).
    pub accounting_closed: bool,
    /// The timeline's buckets with `--report-dir`: (simulated start, prompt tokens, reused).
    buckets: Option<Vec<(f64, u64, u64)>>,
}

fn number(report: &Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(report, |value, key| &value[*key])
        .as_u64()
        .unwrap_or(0)
}

impl NodeResult {
    /// Reads `finished`'s report, and its timeline from `dir/label/timeline.json` when the
    /// node ran with `--report-dir`.
    ///
    /// # Errors
    ///
    /// When the timeline exists and is not JSON.
    pub fn read(label: &str, finished: &Finished, dir: &Path) -> Result<Self, TestError> {
        let report = &finished.report;
        let get = |key: &str| number(report, &[key]);
        let settled_saves = [
            "saves_done",
            "saves_skipped_present",
            "saves_dropped",
            "saves_failed",
        ]
        .iter()
        .map(|key| get(key))
        .sum::<u64>();
        let timeline = dir.join(label).join("timeline.json");
        let buckets = match std::fs::read_to_string(&timeline) {
            Ok(text) => Some(buckets(&serde_json::from_str(&text)?)),
            Err(_) => None,
        };
        Ok(Self {
            label: label.to_owned(),
            code: finished.code,
            requests: get("requests"),
            completed: get("completed"),
            prompt_tokens: get("prompt_tokens"),
            reused_tokens: get("reused_tokens"),
            oracle_reusable_tokens: get("oracle_reusable_tokens"),
            mismatched_pages: get("mismatched_pages"),
            verified_pages: get("verified_pages"),
            loads_started: get("loads_started"),
            loads_failed: get("loads_failed"),
            saves_failed: get("saves_failed"),
            saves_outage: get("saves_outage"),
            outages: number(report, &["pool_health", "outages"]),
            lookups_lost: number(report, &["lookups", "outage"]),
            full_misses: number(report, &["lookups", "full_miss"]),
            accounting_closed: get("saves_enqueued") == settled_saves
                && get("loads_started") == get("loads_done") + get("loads_failed"),
            buckets,
        })
    }

    /// Every node's checks: it ran to its end (exit 0, every request completed), no page
    /// was wrong, the accounting closed.
    ///
    /// # Errors
    ///
    /// Naming the node and its figures.
    pub fn assert_clean(&self) -> Result<(), TestError> {
        let clean = self.code == 0
            && self.completed == self.requests
            && self.requests > 0
            && self.mismatched_pages == 0
            && self.accounting_closed;
        if clean {
            Ok(())
        } else {
            Err(format!("{} did not finish clean: {}", self.label, self.line()).into())
        }
    }

    /// The pool never became unreachable for this node and no lookup was lost to an
    /// outage (R30, R36: an outage elsewhere is not this node's).
    ///
    /// # Errors
    ///
    /// Naming the node and its figures.
    pub fn assert_no_outage(&self) -> Result<(), TestError> {
        if self.outages == 0 && self.lookups_lost == 0 && self.saves_outage == 0 {
            Ok(())
        } else {
            Err(format!("{} saw an outage: {}", self.label, self.line()).into())
        }
    }

    /// Reused share of the prompt tokens whose first token came at simulated `from_s` or
    /// later (the timeline of `--report-dir`).
    ///
    /// # Errors
    ///
    /// When the node ran without `--report-dir`, or nothing completed after `from_s`.
    pub fn reuse_after(&self, from_s: f64) -> Result<f64, TestError> {
        let buckets = self
            .buckets
            .as_ref()
            .ok_or_else(|| format!("{} ran without --report-dir", self.label))?;
        let (prompt, reused) = buckets
            .iter()
            .filter(|(start, _, _)| *start >= from_s)
            .fold((0, 0), |(p, r), (_, prompt, reused)| {
                (p + prompt, r + reused)
            });
        if prompt == 0 {
            return Err(format!(
                "{}: no prompt completed after simulated {from_s} s",
                self.label
            )
            .into());
        }
        Ok(share(reused, prompt))
    }

    /// Reused share of the first prompts this node completed (its first timeline bucket
    /// with any): above 0 only with prefixes another node saved, since this node had saved
    /// nothing yet.
    ///
    /// # Errors
    ///
    /// When the node ran without `--report-dir` or completed nothing.
    pub fn first_prompts_reuse(&self) -> Result<f64, TestError> {
        let buckets = self
            .buckets
            .as_ref()
            .ok_or_else(|| format!("{} ran without --report-dir", self.label))?;
        let (_, prompt, reused) = buckets
            .iter()
            .find(|(_, prompt, _)| *prompt > 0)
            .ok_or_else(|| format!("{}: no prompt completed", self.label))?;
        Ok(share(*reused, *prompt))
    }

    /// Reused share of all prompt tokens.
    pub fn reuse(&self) -> f64 {
        share(self.reused_tokens, self.prompt_tokens)
    }

    /// The node's part of a summary line.
    pub fn line(&self) -> String {
        format!(
            "{}: exit {} requests {}/{} reuse {:.2} (own-oracle {:.2}) verified {} mismatched {} \
             loads failed {}/{} saves failed {} outages {} lookups lost {} saves lost {} \
             full misses {}",
            self.label,
            self.code,
            self.completed,
            self.requests,
            self.reuse(),
            share(self.oracle_reusable_tokens, self.prompt_tokens),
            self.verified_pages,
            self.mismatched_pages,
            self.loads_failed,
            self.loads_started,
            self.saves_failed,
            self.outages,
            self.lookups_lost,
            self.saves_outage,
            self.full_misses,
        )
    }
}

/// (start, prompt tokens, reused tokens) of every bucket of a `timeline.json`.
fn buckets(timeline: &Value) -> Vec<(f64, u64, u64)> {
    timeline["buckets"]
        .as_array()
        .map(|buckets| {
            buckets
                .iter()
                .map(|bucket| {
                    (
                        bucket["start_s"].as_f64().unwrap_or(0.0),
                        number(bucket, &["prompt_tokens"]),
                        number(bucket, &["reused_tokens"]),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One line for a scenario: its name, wall time, and each node's figures.
pub fn summary_line(scenario: &str, results: &[NodeResult], wall: Duration) -> String {
    let mut line = format!("nodes scenario={scenario} wall_s={:.1}", wall.as_secs_f64());
    for result in results {
        let _ = write!(line, " | {}", result.line());
    }
    line
}
