//! The counter sets: what each actor counts per interval (R27), declared once each
//! (`stats::declare`), plus the pool's health (R30).

use super::declare::counter_set;

counter_set! {
    /// Lookup counters of one interval (R27), kept by the lookup planner.
    #[derive(Clone, Debug, Default, PartialEq)]
    pub struct LookupStats in "lookups" {
        extra {}
        counters {
            /// Outcome `full`: resumed at the end of the longest present prefix.
            full: Sum => "lookup_outcomes" / "full";
            /// Outcome `rewound`: resumed earlier, within the rewind range (R12).
            rewound: Sum => "lookup_outcomes" / "rewound";
            /// Outcome `checkpoint`: resumed at a window checkpoint (R28).
            checkpoint: Sum => "lookup_outcomes" / "checkpoint";
            /// Outcome `recovered`: resumed at an earlier complete window (R13).
            recovered: Sum => "lookup_outcomes" / "recovered";
            /// Outcome `window_miss`: a prefix was present but no window complete (R13).
            window_miss: Sum => "lookup_outcomes" / "window_miss";
            /// Outcome `full_miss`: no block present.
            full_miss: Sum => "lookup_outcomes" / "full_miss";
            /// Lookups that failed (pool error, bad request): counted as offering nothing.
            failed: Sum => "lookup_failed";
            /// Lookups lost to a pool outage (R30): a probe found the pool unreachable or
            /// missed its deadline, or the lookup missed its own, so it offered nothing.
            /// Never counted as `full_miss`.
            outage: Sum => "lookup_outage";
            /// Lookups a full planner mailbox deferred to a later step (counted by the
            /// handle).
            deferred: Sum;
            /// Lookups that arrived to a full planner queue (`planner.mailbox_capacity`
            /// lookups waiting for one of `planner.max_concurrent_lookups`): nothing offered.
            shed: Sum => "lookup_shed";
            /// Tokens offered to the engine.
            tokens_offered: Sum => "lookup_offered_tokens";
            /// Keys probed.
            keys_probed: Sum => "lookup_probed_keys";
        }
        derived {
            /// Lookups that ended with an outcome (R11-R13, R28).
            lookups = |s: &Self| s.full + s.rewound + s.checkpoint + s.recovered
                + s.window_miss + s.full_miss;
        }
        latencies {
            /// Time spent probing per lookup.
            probe_time => "lookup_probe";
        }
    }
}

impl LookupStats {
    /// Adds another interval's counts.
    pub fn merge(&mut self, other: &LookupStats) {
        self.merge_counters(other);
    }

    /// Lookups that ended with an outcome.
    pub fn lookups(&self) -> u64 {
        self.full
            + self.rewound
            + self.checkpoint
            + self.recovered
            + self.window_miss
            + self.full_miss
    }

    /// Every lookup answered with an outcome or lost to an outage.
    pub fn with_outage(&self) -> u64 {
        self.lookups() + self.outage
    }
}

counter_set! {
    /// Load counters of one interval, kept by the reservation manager (which sees every
    /// rank's report).
    #[derive(Clone, Debug, Default, PartialEq)]
    pub struct LoadStats in "loads" {
        extra {}
        counters {
            /// Reservations whose load started.
            loads_started: Sum => "load_started";
            /// Reservations filled (every rank, R24).
            loads_done: Sum => "load_done";
            /// Reservations failed (R25).
            loads_failed: Sum;
            /// Failed by cause: an object missing since the probe.
            failed_evicted: Sum => "load_failed" / "evicted";
            /// Failed by cause: an object that failed verification (R5).
            failed_corrupt: Sum => "load_failed" / "corrupt";
            /// Completions ignored as stale (R26).
            stale_completions: Sum => "load_stale_completions";
            /// Pages placed on devices (all ranks).
            pages_loaded: Sum => "load_pages";
            /// Payload bytes placed on devices (all ranks).
            bytes_loaded: Sum => "load";
        }
        derived {
            /// Failed by neither named cause (pool errors, timeouts).
            failed_other = |s: &Self| s.loads_failed.saturating_sub(s.failed_evicted + s.failed_corrupt)
                => "load_failed" / "other";
        }
        latencies {
            /// Time from `StartLoad` to the last rank's report.
            load_time => "load";
        }
    }
}

impl LoadStats {
    /// Adds another interval's counts.
    pub fn merge(&mut self, other: &LoadStats) {
        self.merge_counters(other);
    }
}

counter_set! {
    /// Save counters of one interval, kept by each rank's saver.
    #[derive(Clone, Debug, Default, PartialEq)]
    pub struct SaveStats in "saves" {
        extra {}
        counters {
            /// Pages enqueued.
            saves_enqueued: Sum => "save_enqueued_pages";
            /// Pages stored.
            saves_done: Sum => "save_pages" / "stored";
            /// Pages skipped because the key was present (R19).
            saves_skipped_present: Sum => "save_pages" / "skipped_present";
            /// Pages shed by the bounded queue or refused by a full mailbox (R22), and pages
            /// lost to a pool outage (`saves_outage`).
            saves_dropped: Sum => "save_pages" / "dropped";
            /// Pages dropped because the pool was unreachable or missed a deadline (R30);
            /// also counted in `saves_dropped`.
            saves_outage: Sum => "save_outage_pages";
            /// Re-saved pages found present and refreshed (R20); also counted as skipped.
            saves_refreshed: Sum => "save_refreshed_pages";
            /// Pages that could not be stored.
            saves_failed: Sum => "save_pages" / "failed";
            /// Pages the pool refused for want of room: full, or no segment mounted yet (a
            /// restarted Mooncake master, until the clients' segments are mounted again);
            /// also counted in `saves_failed`.
            saves_no_space: Sum => "save_no_space_pages";
            /// Pages a pool refused for want of room and that were saved again (R35), each
            /// once however many times; they end as done, skipped or failed like any page.
            saves_retried: Sum => "save_retried_pages";
            /// Payload bytes stored.
            bytes_saved: Sum => "save";
            /// Largest queue depth seen.
            max_queue_depth: Max => "save_queue_depth_max_pages";
            /// Pages handed to the savers past the chunk end of their step (R16; must be 0).
            published_past_chunk_end: Sum;
            /// Window pages handed to the savers for window checkpoints alone (R28), not for
            /// a prompt end's sinks and tail (counted by the handle; part of
            /// `saves_enqueued`).
            checkpoint_pages_planned: Sum;
        }
        derived {}
        latencies {
            /// Time from enqueue to settle.
            queue_time => "save_queue";
        }
    }
}

impl SaveStats {
    /// Adds another interval's counts.
    pub fn merge(&mut self, other: &SaveStats) {
        self.merge_counters(other);
    }
}

counter_set! {
    /// The pool's health as the connector saw it (R30): totals since start, read from the
    /// connector's guarded pool (`pool::guard`) at each collection rather than per interval.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct PoolHealthStats in "pool" {
        extra {
            /// The state now: `healthy`, `degraded` or `unreachable`.
            pub state: &'static str,
        }
        counters {
            /// Times the pool became unreachable.
            outages: Sum => "pool_outages";
            /// Milliseconds it was unreachable, the current outage included.
            unreachable_ms: Sum;
            /// Calls refused at once because the pool was unreachable.
            calls_refused: Sum => "pool_calls_lost" / "refused";
            /// Probe calls that missed their deadline (`pool.probe_timeout_ms`).
            calls_timed_out: Sum => "pool_calls_lost" / "timed_out";
        }
        derived {
            /// 1 while the pool is marked unreachable, else 0.
            unreachable = |s: &Self| u64::from(s.is_unreachable()) => "pool_unreachable";
        }
        latencies {}
    }
}

impl Default for PoolHealthStats {
    fn default() -> Self {
        Self {
            state: "healthy",
            outages: 0,
            unreachable_ms: 0,
            calls_refused: 0,
            calls_timed_out: 0,
        }
    }
}

impl PoolHealthStats {
    /// Whether the pool is marked unreachable now.
    pub fn is_unreachable(&self) -> bool {
        self.state == "unreachable"
    }

    /// Adds another connector's counts; the state becomes the worse of the two.
    pub fn merge(&mut self, other: &PoolHealthStats) {
        let rank = |state: &str| match state {
            "unreachable" => 2,
            "degraded" => 1,
            _ => 0,
        };
        if rank(other.state) > rank(self.state) {
            self.state = other.state;
        }
        self.merge_counters(other);
    }
}
