//! The lookup procedure (R10-R15, R30): hash a prompt, then run the planner's probe rounds
//! against the pool, each round's keys probed in concurrent chunks, until the pure state
//! machine [`crate::core::planner::Lookup`] has its plan.
//!
//! A plain blocking function over a [`Pool`], so the lookup planner actor (which runs it on
//! tokio's blocking pool) and `kv-connector inspect` (which runs it in place) share it, and
//! it is testable without an actor system.
//!
//! Invariants:
//! - `lookup::L1`. Every shard key of an item is probed, and the item is present only if
//!   all are (R3); a probe thread that panicked counts its keys absent: a miss, never KV.
//! - `lookup::L2`. A lookup past its deadline, or a probe call whose every key answered that
//!   the pool is unreachable or late, ends with nothing offered, marked lost to an outage
//!   (R30).

use std::num::NonZeroUsize;
use std::time::Instant;

use crate::core::hash::BlockHash;
use crate::core::page_names::PromptHashes;
use crate::core::request_scope::RequestScope;
use crate::core::keys::KeySpace;
use crate::core::layout::Layout;
use crate::core::planner::{Lookup, LookupPlan, LookupRequest, PlannerGroup};
use crate::pool::Pool;

/// What every lookup of this deployment shares.
#[derive(Debug)]
pub struct PlannerSettings {
    /// `T`.
    pub tokens_per_block: usize,
    /// The layout's groups as the planner sees them.
    pub groups: Vec<PlannerGroup>,
    /// `R` (R12).
    pub rewind_tokens: usize,
    /// R13.
    pub window_fallback: bool,
    /// `saver.window_checkpoint_tokens` (R28); `None`: off.
    pub checkpoint_tokens: Option<NonZeroUsize>,
    /// Keys per concurrent probe (R10).
    pub probe_chunk_keys: NonZeroUsize,
    /// Scope seed of the chain (R1).
    pub seed: BlockHash,
    /// Deadline of one lookup from when its work starts (R30).
    pub lookup_timeout: std::time::Duration,
}

impl PlannerSettings {
    /// The settings of the validated configuration (`[planner]`, and the checkpoint
    /// interval of `[saver]`) for `layout`, chaining from `seed`.
    pub fn new(
        config: &crate::config::runtime::RuntimeConfig,
        layout: &Layout,
        seed: BlockHash,
    ) -> Self {
        let planner = &config.planner;
        PlannerSettings {
            tokens_per_block: layout.tokens_per_block as usize,
            groups: PlannerGroup::of_layout(layout),
            rewind_tokens: planner.rewind_tokens,
            window_fallback: planner.window_fallback,
            checkpoint_tokens: config.saver.window_checkpoint_tokens,
            probe_chunk_keys: planner.probe_chunk,
            seed,
            lookup_timeout: planner.lookup_timeout,
        }
    }

    /// The names of `prompt`'s pages under `keys`, chained from the seed of `scope` (R34):
    /// its chain hashes, and its next-token hashes when a group is named by them (R37).
    ///
    /// # Errors
    ///
    /// [`crate::core::hash::HashError`] when `T` is 0.
    pub fn prompt_hashes(
        &self,
        keys: &KeySpace,
        prompt: &[i64],
        scope: &RequestScope,
    ) -> Result<PromptHashes, crate::core::hash::HashError> {
        PromptHashes::of_prompt(
            scope.seed(self.seed),
            prompt,
            self.tokens_per_block,
            keys.needs_next_token(),
        )
    }
}

/// What one lookup produced.
#[derive(Debug)]
pub struct LookupResult {
    /// The plan, or `None` when the lookup failed.
    pub plan: Option<LookupPlan>,
    /// The names of the prompt's pages: chain hashes, and next-token hashes where the
    /// layout has draft groups (R37).
    pub hashes: PromptHashes,
    /// Keys probed.
    pub keys_probed: u64,
    /// Time spent probing.
    pub probe_time: std::time::Duration,
    /// The lookup offered nothing because the pool was unreachable or a deadline passed
    /// (R30).
    pub lost_to_outage: bool,
}

impl LookupResult {
    /// A lookup that offers nothing and hashed nothing.
    pub fn failed() -> Self {
        LookupResult {
            plan: None,
            hashes: PromptHashes::default(),
            keys_probed: 0,
            probe_time: std::time::Duration::ZERO,
            lost_to_outage: false,
        }
    }
}

/// A lookup that probes nothing: the prompt's chain hashes (so its computed pages are still
/// saved) and nothing offered. The planner answers a shed lookup with it.
pub fn hash_only(
    settings: &PlannerSettings,
    keys: &KeySpace,
    prompt: &[i64],
    scope: &RequestScope,
) -> LookupResult {
    match settings.prompt_hashes(keys, prompt, scope) {
        Ok(hashes) => LookupResult {
            hashes,
            ..LookupResult::failed()
        },
        Err(_) => LookupResult::failed(),
    }
}

/// Hashes the prompt and runs the planner's probe rounds against the pool (blocking).
pub fn run_lookup(
    pool: &dyn Pool,
    keys: &KeySpace,
    settings: &PlannerSettings,
    prompt: &[i64],
    local_match_tokens: usize,
    scope: &RequestScope,
) -> LookupResult {
    let Ok(hashes) = settings.prompt_hashes(keys, prompt, scope) else {
        return LookupResult::failed();
    };
    let shard_keys = keys
        .groups
        .iter()
        .map(crate::core::keys::GroupKeys::shard_count)
        .max()
        .unwrap_or(1)
        .max(1);
    let request = LookupRequest {
        tokens_per_block: settings.tokens_per_block,
        prompt_tokens: prompt.len(),
        local_match_tokens,
        groups: settings.groups.clone(),
        rewind_tokens: settings.rewind_tokens,
        window_fallback: settings.window_fallback,
        checkpoint_tokens: settings.checkpoint_tokens,
        // A chunk smaller than one item's shard keys still probes one item.
        probe_chunk_items: (settings.probe_chunk_keys.get() / shard_keys).max(1),
    };
    let Ok(mut lookup) = Lookup::new(request) else {
        return LookupResult {
            hashes,
            ..LookupResult::failed()
        };
    };
    let started = Instant::now();
    let mut keys_probed = 0;
    let ended = |keys_probed, lost_to_outage| LookupResult {
        hashes: hashes.clone(),
        keys_probed,
        probe_time: started.elapsed(),
        plan: None,
        lost_to_outage,
    };
    while let Some(round) = lookup.next_round() {
        if started.elapsed() >= settings.lookup_timeout {
            return ended(keys_probed, true);
        }
        let probed = probe_round(
            pool,
            keys,
            &hashes,
            round.items(),
            settings.probe_chunk_keys,
        );
        keys_probed += probed.keys;
        if probed.pool_gone {
            return ended(keys_probed, true);
        }
        if lookup.record(&round, &probed.present).is_err() {
            return ended(keys_probed, false);
        }
    }
    LookupResult {
        plan: Some(lookup.finish()),
        hashes,
        keys_probed,
        probe_time: started.elapsed(),
        lost_to_outage: false,
    }
}

/// What one probe round found.
struct Probed {
    /// Per item: every shard key present.
    present: Vec<bool>,
    /// Keys probed.
    keys: u64,
    /// Some probe call found the pool unreachable or late for every key (R30).
    pool_gone: bool,
}

/// Probes every shard key of every item, in concurrent chunks of `chunk_keys` keys (R10);
/// an item is present only if all its shard keys are (R3).
fn probe_round(
    pool: &dyn Pool,
    keys: &KeySpace,
    hashes: &PromptHashes,
    items: &[crate::core::planner::ProbeItem],
    chunk_keys: NonZeroUsize,
) -> Probed {
    let mut all_keys: Vec<String> = Vec::new();
    let mut owner: Vec<usize> = Vec::new();
    let mut present = vec![true; items.len()];
    for (index, item) in items.iter().enumerate() {
        let group = keys
            .index_of(item.group)
            .and_then(|position| keys.group(position));
        match (group, keys.page_hash(hashes, item.group, item.block)) {
            (Some(group), Some(hash)) => {
                for key in group.all_shard_keys(&hash) {
                    all_keys.push(key);
                    owner.push(index);
                }
            }
            _ => present[index] = false,
        }
    }
    let refs: Vec<&str> = all_keys.iter().map(String::as_str).collect();
    let chunk_keys = chunk_keys.get();
    let (answers, pool_gone): (Vec<bool>, bool) = if refs.len() <= chunk_keys {
        present_flags(pool, &refs)
    } else {
        std::thread::scope(|scope| {
            let workers: Vec<_> = refs
                .chunks(chunk_keys)
                .map(|chunk| (chunk.len(), scope.spawn(move || present_flags(pool, chunk))))
                .collect();
            // A probe thread that panicked counts its keys as absent: a miss, never KV.
            let mut answers = Vec::with_capacity(refs.len());
            let mut pool_gone = false;
            for (len, worker) in workers {
                let (flags, gone) = worker.join().unwrap_or_else(|_| (vec![false; len], false));
                answers.extend(flags);
                pool_gone |= gone;
            }
            (answers, pool_gone)
        })
    };
    for (position, index) in owner.iter().enumerate() {
        if !answers.get(position).copied().unwrap_or(false) {
            present[*index] = false;
        }
    }
    Probed {
        present,
        keys: refs.len() as u64,
        pool_gone,
    }
}

/// One `exists` batch as exactly one flag per key (a short answer counts as absent), and
/// whether every key answered that the pool is unreachable or late (R30).
fn present_flags(pool: &dyn Pool, keys: &[&str]) -> (Vec<bool>, bool) {
    let answers = pool.exists(keys);
    let pool_gone = !answers.is_empty()
        && answers.iter().all(|answer| {
            answer
                .as_ref()
                .is_err_and(crate::pool::PoolError::is_outage)
        });
    let mut flags: Vec<bool> = answers
        .into_iter()
        .map(|answer| matches!(answer, Ok(true)))
        .collect();
    flags.resize(keys.len(), false);
    (flags, pool_gone)
}
