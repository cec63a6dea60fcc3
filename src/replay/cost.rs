//! The cost model of simulated time: how long prefill chunks, decoding and prefix loads
//! take on one serving instance (`docs/DESIGN.md` section 11, "time is simulated").
//!
//! Simulated time is kept in whole microseconds ([`SimMicros`]) so that the event order
//! of a replay is exact and reproducible; the model itself works in seconds.
//!
//! A step that computes prompt chunks takes
//!
//! ```text
//! step_overhead_s + sum over chunks [ tokens / prefill_tokens_per_s
//!                                     + attention_pairs(chunk) / attention_pairs_per_s ]
//! ```
//!
//! where `attention_pairs` counts the (query, key) token pairs of full-attention layers
//! (a chunk of `n` tokens after `b` computed ones reads `n*b + n*(n+1)/2` pairs), so long
//! prompts pay their quadratic attention. Window layers read at most `W` keys per token;
//! their cost is folded into the linear rate. With a tensor-parallel world of `N` ranks the
//! compute rates are multiplied by `N * TP_EFFICIENCY`.
//!
//! A load of `b` bytes per rank takes `load_latency_s + b / load_bytes_per_s` (ranks load
//! in parallel over their own links); loads of one instance share its link, one after the
//! other. Decoding an answer of `k` tokens takes `(k - 1) / decode_tokens_per_s` after the
//! first token, which the last prefill chunk produces.
//!
//! # Where the numbers come from
//!
//! They are estimates for one NVIDIA H200-class GPU per rank (989 TFLOP/s dense bf16,
//! 141 GB of HBM at 4.8 TB/s, a PCI Express 5 or 400 Gb/s RDMA path to the pool), not
//! measurements:
//!
//! - `prefill_tokens_per_s`: `2 * active parameters` FLOP per token at roughly 40-60 % of
//!   peak (llama-3.1-8b: 16 GFLOP/token -> 25k tokens/s; llama-3.1-8b-eagle adds the
//!   drafter's decoder layer, about 4 % more per token and one more full layer of
//!   attention pairs -> 24k and 8.7e8; gpt-oss-120b: 5.1 B active
//!   parameters, discounted for expert routing -> 12k; gemma-3-27b: 54 GFLOP/token -> 8k);
//! - `attention_pairs_per_s`: `4 * head_dim * query heads * full layers` FLOP per pair at
//!   about 500 TFLOP/s (flash attention, causal): llama 524k FLOP/pair -> 9e8 pairs/s,
//!   gpt-oss 295k -> 1.6e9, gemma 164k -> 3e9;
//! - `decode_tokens_per_s`: per request under a busy batch, bounded by HBM bandwidth over
//!   the bytes read per token;
//! - `load_bytes_per_s`: 25 GB/s per rank, between what a Mooncake get over RDMA and a
//!   pinned host-to-device copy sustain;
//! - `kv_memory_bytes`: HBM per rank left for the KV cache after weights and activations.
//!
//! The `tiny-*` presets are toys for tests and demos: fast enough that simulated time is
//! dominated by nothing in particular. A layout without a preset of its own uses the
//! llama-3.1-8b numbers, and the report names the model used.

use serde::Serialize;

/// Simulated time or duration in microseconds.
pub type SimMicros = u64;

/// Efficiency of tensor parallelism: a world of `N` ranks computes `N * 0.85` times as fast
/// as one rank.
pub const TP_EFFICIENCY: f64 = 0.85;

/// The cost of one preset; see the module docs for the formula and the numbers' origin.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostModel {
    /// The preset these numbers are for (`generic` for a layout without one).
    pub name: String,
    /// Prompt tokens per second through the linear layers, at world size 1.
    pub prefill_tokens_per_s: f64,
    /// Full-attention (query, key) token pairs per second, at world size 1.
    pub attention_pairs_per_s: f64,
    /// Fixed cost of one engine step (scheduling, launches), in seconds.
    pub step_overhead_s: f64,
    /// Answer tokens per second of one request in the generation stage.
    pub decode_tokens_per_s: f64,
    /// Bytes per second one rank loads from the pool into its pages.
    pub load_bytes_per_s: f64,
    /// Fixed cost of one load (pool round trip, copy launch), in seconds.
    pub load_latency_s: f64,
    /// Bytes of KV cache one rank holds, for `--kv-pages` when it is not given.
    pub kv_memory_bytes: u64,
    /// Tensor-parallel ranks per instance; multiplies the compute rates (module docs).
    pub world_size: u32,
}

/// One row of the preset table: (name, prefill, attention pairs, overhead, decode, load
/// bytes/s, load latency, KV memory).
type PresetRow = (&'static str, f64, f64, f64, f64, f64, f64, u64);

/// GiB, for the table.
const GIB: u64 = 1 << 30;

/// The preset table; the module docs say where each number comes from.
const PRESETS: &[PresetRow] = &[
    (
        "llama-3.1-8b",
        25_000.0,
        9.0e8,
        3.0e-3,
        60.0,
        25.0e9,
        5.0e-4,
        100 * GIB,
    ),
    (
        "llama-3.1-8b-eagle",
        24_000.0,
        8.7e8,
        3.0e-3,
        60.0,
        25.0e9,
        5.0e-4,
        100 * GIB,
    ),
    (
        "gpt-oss-120b",
        12_000.0,
        1.6e9,
        3.0e-3,
        80.0,
        25.0e9,
        5.0e-4,
        60 * GIB,
    ),
    (
        "gemma-3-27b",
        8_000.0,
        3.0e9,
        3.0e-3,
        35.0,
        25.0e9,
        5.0e-4,
        70 * GIB,
    ),
    (
        "tiny-hybrid",
        1.0e6,
        1.0e12,
        1.0e-4,
        1_000.0,
        25.0e9,
        5.0e-4,
        64 << 20,
    ),
    (
        "tiny-full",
        1.0e6,
        1.0e12,
        1.0e-4,
        1_000.0,
        25.0e9,
        5.0e-4,
        64 << 20,
    ),
];

/// The preset whose numbers stand in for layouts without one.
const GENERIC_BASE: &str = "llama-3.1-8b";

/// Seconds to whole simulated microseconds, rounded up (a nonzero cost never rounds to 0).
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "clamped to [0, 2^53] before the cast; simulated runs are far shorter"
)]
pub fn seconds_to_micros(seconds: f64) -> SimMicros {
    if seconds.is_nan() || seconds <= 0.0 {
        return 0;
    }
    (seconds * 1e6).ceil().min(9.0e15) as SimMicros
}

/// Simulated microseconds to seconds, for reports.
#[expect(
    clippy::cast_precision_loss,
    reason = "exact below 2^53 us (285 years)"
)]
pub fn micros_to_seconds(micros: SimMicros) -> f64 {
    micros as f64 / 1e6
}

/// A count as `f64` for the model's arithmetic.
#[expect(clippy::cast_precision_loss, reason = "token counts far below 2^53")]
fn as_f64(value: usize) -> f64 {
    value as f64
}

impl CostModel {
    /// The names of the presets with cost numbers.
    #[cfg(feature = "internals")]
    pub fn preset_names() -> impl Iterator<Item = &'static str> {
        PRESETS.iter().map(|row| row.0)
    }

    /// The numbers of preset `name` at world size 1, if the table has it.
    pub fn preset(name: &str) -> Option<CostModel> {
        PRESETS
            .iter()
            .find(|row| row.0 == name)
            .map(|row| CostModel {
                name: row.0.to_owned(),
                prefill_tokens_per_s: row.1,
                attention_pairs_per_s: row.2,
                step_overhead_s: row.3,
                decode_tokens_per_s: row.4,
                load_bytes_per_s: row.5,
                load_latency_s: row.6,
                kv_memory_bytes: row.7,
                world_size: 1,
            })
    }

    /// The model for a layout named `layout_name` on `world_size` ranks: its preset, or the
    /// llama-3.1-8b numbers named `generic` when the table has no such preset.
    pub fn for_layout(layout_name: &str, world_size: u32) -> CostModel {
        let model = CostModel::preset(layout_name).unwrap_or_else(|| {
            let mut generic = CostModel::preset(GENERIC_BASE).unwrap_or_else(CostModel::toy);
            "generic".clone_into(&mut generic.name);
            generic
        });
        CostModel {
            world_size: world_size.max(1),
            ..model
        }
    }

    /// A last-resort toy model (only if the table lost its base row).
    fn toy() -> CostModel {
        CostModel {
            name: "generic".to_owned(),
            prefill_tokens_per_s: 1.0e6,
            attention_pairs_per_s: 1.0e12,
            step_overhead_s: 1.0e-4,
            decode_tokens_per_s: 1_000.0,
            load_bytes_per_s: 25.0e9,
            load_latency_s: 5.0e-4,
            kv_memory_bytes: 64 << 20,
            world_size: 1,
        }
    }

    /// How much faster than one rank the instance computes.
    fn compute_speedup(&self) -> f64 {
        if self.world_size <= 1 {
            1.0
        } else {
            f64::from(self.world_size) * TP_EFFICIENCY
        }
    }

    /// Seconds to compute a chunk of `tokens` prompt tokens after `computed_before` ones.
    pub fn chunk_seconds(&self, computed_before: usize, tokens: usize) -> f64 {
        let n = as_f64(tokens);
        let pairs = n * as_f64(computed_before) + n * (n + 1.0) / 2.0;
        (n / self.prefill_tokens_per_s + pairs / self.attention_pairs_per_s)
            / self.compute_speedup()
    }

    /// Simulated duration of a step computing `chunks` (`(computed_before, tokens)` each);
    /// a step that computes nothing costs nothing.
    pub fn step_micros(&self, chunks: impl IntoIterator<Item = (usize, usize)>) -> SimMicros {
        let mut seconds = 0.0;
        let mut any = false;
        for (before, tokens) in chunks {
            any = true;
            seconds += self.chunk_seconds(before, tokens);
        }
        if any {
            seconds_to_micros(self.step_overhead_s + seconds)
        } else {
            0
        }
    }

    /// Simulated time from the first answer token to the last.
    pub fn decode_micros(&self, output_tokens: u32) -> SimMicros {
        let rest = f64::from(output_tokens.saturating_sub(1));
        seconds_to_micros(rest / self.decode_tokens_per_s)
    }

    /// Simulated duration of a load moving `bytes_per_rank` into every rank's pages.
    #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^53")]
    pub fn load_micros(&self, bytes_per_rank: u64) -> SimMicros {
        seconds_to_micros(self.load_latency_s + bytes_per_rank as f64 / self.load_bytes_per_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_preset_has_cost_numbers() {
        for name in crate::core::layout::Layout::preset_names() {
            assert!(CostModel::preset(name).is_some(), "{name}");
        }
    }

    #[test]
    fn unknown_layouts_use_the_generic_model() {
        let model = CostModel::for_layout("my-model", 2);
        assert_eq!(model.name, "generic");
        assert_eq!(model.world_size, 2);
        let base = CostModel::preset(GENERIC_BASE).map_or(0.0, |base| base.prefill_tokens_per_s);
        assert!((model.prefill_tokens_per_s - base).abs() < f64::EPSILON);
    }

    #[test]
    fn attention_makes_later_chunks_dearer() {
        let model = CostModel::for_layout("llama-3.1-8b", 1);
        let first = model.chunk_seconds(0, 8192);
        let late = model.chunk_seconds(120_000, 8192);
        assert!(late > 2.0 * first, "{first} vs {late}");
        // 128k tokens of llama-3.1-8b prefill take seconds, not minutes or milliseconds.
        let whole: f64 = (0..16).map(|i| model.chunk_seconds(i * 8192, 8192)).sum();
        assert!((5.0..60.0).contains(&whole), "{whole}");
    }

    #[test]
    fn tensor_parallel_ranks_speed_up_compute_only() {
        let one = CostModel::for_layout("llama-3.1-8b", 1);
        let four = CostModel::for_layout("llama-3.1-8b", 4);
        assert!(four.chunk_seconds(0, 4096) < one.chunk_seconds(0, 4096) / 3.0);
        assert_eq!(four.load_micros(1 << 30), one.load_micros(1 << 30));
    }

    #[test]
    fn empty_steps_cost_nothing_and_others_at_least_the_overhead() {
        let model = CostModel::for_layout("tiny-full", 1);
        assert_eq!(model.step_micros([]), 0);
        assert!(model.step_micros([(0, 1)]) >= seconds_to_micros(model.step_overhead_s));
    }

    #[test]
    fn loads_and_decode_scale_with_size() {
        let model = CostModel::for_layout("llama-3.1-8b", 1);
        // 25 GB at 25 GB/s: one second plus the latency.
        assert_eq!(model.load_micros(25_000_000_000), 1_000_500);
        assert_eq!(model.decode_micros(1), 0);
        assert_eq!(model.decode_micros(61), 1_000_000);
    }

    #[test]
    fn seconds_round_up_to_microseconds() {
        assert_eq!(seconds_to_micros(0.0), 0);
        assert_eq!(seconds_to_micros(-1.0), 0);
        assert_eq!(seconds_to_micros(f64::NAN), 0);
        assert_eq!(seconds_to_micros(1e-9), 1);
        assert_eq!(seconds_to_micros(1.5), 1_500_000);
        assert!((micros_to_seconds(2_500_000) - 2.5).abs() < 1e-12);
    }
}
