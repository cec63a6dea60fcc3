//! One node's share of a workload (`replay --node I/N`) and the real-time pace that keeps
//! the nodes of a multi-host replay on one timeline (`replay --pace F`), R36.
//!
//! A deployment runs one engine per GPU on many hosts, all sharing one Mooncake pool. The
//! replay models that with one process per node, each with its own engine and Mooncake
//! client (its own segment), all against one master:
//!
//! 1. every node process builds the same workload (same flags, same seed);
//! 2. [`NodeShare::split`] keeps this node's requests: every turn of a conversation on the
//!    node `session % N`, so a conversation's own history stays on one node while the
//!    prefixes conversations share (the system prompt, the shared documents) are saved by
//!    one node and loaded by the others; requests without a session (Mooncake traces) go
//!    in turn, `position % N`;
//! 3. each node replays its share with its simulated clock tied to the wall clock by
//!    [`Pace`]: simulated time `t` is reached no earlier than `t / F` real seconds after
//!    the replay started. Without a pace each process would race through its share in
//!    its own time and what one node finds of another's saves would depend on process
//!    start-up; with it the nodes advance together, so a prefix one node saved at
//!    simulated time `t` is in the pool when another node asks for it later in simulated
//!    time, give or take the start-up skew (`F` times a second or so), and a run lasts
//!    about the workload's simulated span divided by `F`: a bounded time in which nodes
//!    can be killed, cut off, restarted or started late. With `--start-at UNIX_MS` every
//!    node's simulated time 0 is that one wall-clock instant, so the skew of their
//!    start-ups (a Mooncake client takes a second or so to connect) drops out.
//!
//! Invariants:
//! - `replay::nodes::N1`. The shares of `0/N` .. `N-1/N` partition the workload: every
//!   request is in exactly one, with its position, arrival and content unchanged.
//! - `replay::nodes::N2`. Every turn of a conversation is in the same share, in order.
//! - `replay::nodes::N3`. A paced replay never reaches simulated time `t` before `t / F`
//!   real seconds have passed since its start; it never waits otherwise (a replay behind
//!   the pace runs at full speed until it catches up).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::workload::WorkloadRequest;

/// Longest single sleep of a paced replay, so that a stop signal is seen promptly.
const PACE_SLICE: Duration = Duration::from_millis(50);

/// Instance `index` of `count` nodes (`--node I/N`, `I` from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeShare {
    /// This node, `0 <= index < count`.
    pub index: u64,
    /// Nodes sharing the workload, at least 1.
    pub count: u64,
}

/// Why a `--node` value was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeShareError {
    /// Not `I/N` with two whole numbers.
    #[error("{text:?} is not I/N (this node's index from 0, then the number of nodes), e.g. 0/3")]
    Syntax {
        /// The value given.
        text: String,
    },
    /// `N` is 0 or `I` is not below it.
    #[error("node {index} of {count} does not exist: the index runs from 0 to N-1, N at least 1")]
    OutOfRange {
        /// `I`.
        index: u64,
        /// `N`.
        count: u64,
    },
}

impl NodeShareError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Syntax { .. } => "node_syntax",
            Self::OutOfRange { .. } => "node_out_of_range",
        }
    }
}

impl FromStr for NodeShare {
    type Err = NodeShareError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let syntax = || NodeShareError::Syntax {
            text: text.to_owned(),
        };
        let (index, count) = text.split_once('/').ok_or_else(syntax)?;
        let index: u64 = index.trim().parse().map_err(|_| syntax())?;
        let count: u64 = count.trim().parse().map_err(|_| syntax())?;
        if count == 0 || index >= count {
            return Err(NodeShareError::OutOfRange { index, count });
        }
        Ok(Self { index, count })
    }
}

impl fmt::Display for NodeShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl serde::Serialize for NodeShare {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl NodeShare {
    /// Whether the request at `position` of the whole workload, of conversation `session`,
    /// is this node's (module workflow 2; `replay::nodes::N1`, `N2`).
    pub fn keeps(&self, position: u64, session: Option<u64>) -> bool {
        session.unwrap_or(position) % self.count == self.index
    }

    /// This node's requests of `workload`, in their order, unchanged (`replay::nodes::N1`).
    pub fn split(&self, workload: Vec<WorkloadRequest>) -> Vec<WorkloadRequest> {
        workload
            .into_iter()
            .enumerate()
            .filter(|(position, request)| {
                self.keeps(u64::try_from(*position).unwrap_or(u64::MAX), request.session)
            })
            .map(|(_, request)| request)
            .collect()
    }
}

/// Simulated seconds a paced replay covers per real second (`--pace F`, `F > 0`), and
/// optionally the wall-clock instant of simulated time 0 (`--start-at`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    /// `F`.
    pub sim_seconds_per_second: f64,
    /// Simulated time 0 as Unix milliseconds (`--start-at`): processes given the same one
    /// share a timeline whatever their start-up took. `None`: when the engines start.
    pub start_at_unix_ms: Option<u64>,
}

impl Pace {
    /// The pace `F` from the engines' start, or `None` unless `F` is finite and positive.
    pub fn new(sim_seconds_per_second: f64) -> Option<Self> {
        (sim_seconds_per_second.is_finite() && sim_seconds_per_second > 0.0).then_some(Self {
            sim_seconds_per_second,
            start_at_unix_ms: None,
        })
    }

    /// The instant of simulated time 0 for a replay whose engines start `now`: `now`
    /// itself, or `--start-at` (later when it is to come, earlier when it has passed: the
    /// replay then runs at full speed until it catches up, `replay::nodes::N3`).
    pub fn origin(&self, now: Instant) -> Instant {
        let Some(unix_ms) = self.start_at_unix_ms else {
            return now;
        };
        let at = UNIX_EPOCH + Duration::from_millis(unix_ms);
        match at.duration_since(SystemTime::now()) {
            Ok(ahead) => now.checked_add(ahead).unwrap_or(now),
            Err(behind) => now.checked_sub(behind.duration()).unwrap_or(now),
        }
    }

    /// Real time after the start at which simulated time `sim_seconds` is due.
    pub fn due_after(&self, sim_seconds: f64) -> Duration {
        Duration::try_from_secs_f64(sim_seconds.max(0.0) / self.sim_seconds_per_second)
            .unwrap_or(Duration::MAX)
    }

    /// Sleeps until simulated time `sim_seconds` is due, counted from `started`
    /// (`replay::nodes::N3`), in slices of at most [`PACE_SLICE`]; returns early, with
    /// `false`, as soon as `stop()` says so.
    pub fn wait_until(
        &self,
        started: Instant,
        sim_seconds: f64,
        stop: &mut dyn FnMut() -> bool,
    ) -> bool {
        let due = started.checked_add(self.due_after(sim_seconds));
        loop {
            if stop() {
                return false;
            }
            let now = Instant::now();
            let left = due.map_or(PACE_SLICE, |due| due.saturating_duration_since(now));
            if left.is_zero() {
                return true;
            }
            std::thread::sleep(left.min(PACE_SLICE));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::workload::{PromptSource, WorkloadRequest};

    fn request(id: u64, session: Option<u64>) -> WorkloadRequest {
        WorkloadRequest {
            id,
            arrival_ms: id * 10,
            session,
            prompt: PromptSource::MooncakeBlocks {
                hash_ids: vec![id],
                prompt_len: 512,
            },
            output_tokens: 1,
        }
    }

    #[test]
    fn node_share_parses_i_of_n_and_refuses_the_rest() {
        assert_eq!("1/3".parse(), Ok(NodeShare { index: 1, count: 3 }));
        assert_eq!("0/1".parse::<NodeShare>().map(|s| s.to_string()), Ok("0/1".into()));
        for bad in ["", "1", "a/3", "1/b", "1/3/4", "-1/3"] {
            assert!(
                matches!(bad.parse::<NodeShare>(), Err(NodeShareError::Syntax { .. })),
                "{bad}"
            );
        }
        for (bad, index, count) in [("3/3", 3, 3), ("0/0", 0, 0), ("5/2", 5, 2)] {
            assert_eq!(
                bad.parse::<NodeShare>(),
                Err(NodeShareError::OutOfRange { index, count })
            );
        }
    }

    /// `replay::nodes::N1` and `N2`: the shares partition the workload, a conversation's
    /// turns stay together and in order, requests without a session go in turn.
    #[test]
    fn shares_partition_the_workload_and_keep_conversations_together() {
        let workload: Vec<WorkloadRequest> = (0..40)
            .map(|id| request(id, (id < 30).then_some(id % 7)))
            .collect();
        let nodes = 3;
        let mut seen = vec![0_u32; workload.len()];
        for index in 0..nodes {
            let share = NodeShare {
                index,
                count: nodes,
            };
            let mine = share.split(workload.clone());
            assert!(mine.windows(2).all(|pair| pair[0].id < pair[1].id), "order kept");
            for request in &mine {
                seen[usize::try_from(request.id).unwrap_or(usize::MAX)] += 1;
                assert_eq!(request, &workload[usize::try_from(request.id).unwrap_or(0)]);
                match request.session {
                    Some(session) => assert_eq!(session % nodes, index),
                    None => assert_eq!(request.id % nodes, index),
                }
            }
            assert!(!mine.is_empty(), "every node gets requests here");
        }
        assert!(seen.iter().all(|&count| count == 1), "{seen:?}");
    }

    #[test]
    fn one_node_keeps_everything() {
        let workload: Vec<WorkloadRequest> = (0..5).map(|id| request(id, Some(id))).collect();
        let all = NodeShare { index: 0, count: 1 }.split(workload.clone());
        assert_eq!(all, workload);
    }

    /// `replay::nodes::N3`: simulated time `t` is due `t / F` after the start; a replay
    /// already behind does not wait; a stop ends the wait.
    #[test]
    fn pace_maps_simulated_to_real_time_and_honours_a_stop() {
        assert_eq!(Pace::new(0.0), None);
        assert_eq!(Pace::new(f64::NAN), None);
        let pace = Pace::new(100.0).unwrap_or(Pace {
            sim_seconds_per_second: 100.0,
            start_at_unix_ms: None,
        });
        assert_eq!(pace.due_after(50.0), Duration::from_millis(500));
        assert_eq!(pace.due_after(-1.0), Duration::ZERO);
        let long_ago = Instant::now().checked_sub(Duration::from_secs(10));
        let started = long_ago.unwrap_or_else(Instant::now);
        let before = Instant::now();
        assert!(pace.wait_until(started, 5.0, &mut || false));
        assert!(before.elapsed() < Duration::from_millis(40), "behind: no wait");
        let before = Instant::now();
        assert!(!pace.wait_until(Instant::now(), 1.0e6, &mut || true));
        assert!(before.elapsed() < Duration::from_millis(40), "a stop ends the wait");
    }

    /// `--start-at`: simulated time 0 is that wall-clock instant, past or to come.
    #[test]
    fn a_start_instant_sets_the_origin_of_simulated_time() {
        let now = Instant::now();
        let unix_ms = |offset_ms: i64| {
            let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            u64::try_from(i64::try_from(since.as_millis()).unwrap_or(0) + offset_ms).unwrap_or(0)
        };
        let pace = |start_at_unix_ms| Pace {
            sim_seconds_per_second: 10.0,
            start_at_unix_ms,
        };
        assert_eq!(pace(None).origin(now), now);
        let ahead = pace(Some(unix_ms(5_000))).origin(now).duration_since(now);
        assert!(ahead > Duration::from_millis(4_900) && ahead <= Duration::from_secs(5));
        let behind = now.duration_since(pace(Some(unix_ms(-5_000))).origin(now));
        assert!(behind >= Duration::from_millis(4_990) && behind < Duration::from_millis(5_100));
    }
}
