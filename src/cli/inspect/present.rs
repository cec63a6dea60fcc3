//! Which of a prompt's blocks a pool holds, per group and shard (`inspect` workflow step
//! 6), and how runs of blocks are printed.
//!
//! A block counts as present for a lookup only if every shard's key is (R3); this listing
//! shows each shard on its own, so a block missing on one rank stands out.

use std::io::{self, Write};

use serde::Serialize;

use crate::core::page_names::PromptHashes;
use crate::core::keys::KeySpace;
use crate::core::layout::Layout;
use crate::pool::Pool;

/// Keys per `exists` call.
const PROBE_CHUNK: usize = 4096;

/// Runs printed before the rest is summarised.
const RUNS_SHOWN: usize = 12;

/// One shard of one group.
#[derive(Debug, Serialize)]
pub struct ShardPresence {
    /// `w{world}r{rank}` or `replicated`.
    pub shard: String,
    /// The key of block 0 (shows the prefix: namespace, model key, shard, group, size).
    pub first_key: String,
    /// Blocks present.
    pub present_blocks: usize,
    /// Present blocks as half-open runs `[start, end)`.
    pub runs: Vec<(usize, usize)>,
    /// Blocks whose probe failed (a pool error, not an absence).
    pub errors: usize,
    /// Every block's key (only with `--keys`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
}

/// One group of the layout.
#[derive(Debug, Serialize)]
pub struct GroupPresence {
    /// The group id.
    pub group: u32,
    /// `full`, or `window W = .., S = ..`.
    pub attention: String,
    /// Its shards.
    pub shards: Vec<ShardPresence>,
}

/// Probes every shard key of every block and groups the answers (one `exists` per key).
pub fn presence(
    pool: &dyn Pool,
    layout: &Layout,
    keys: &KeySpace,
    hashes: &PromptHashes,
    with_keys: bool,
) -> Vec<GroupPresence> {
    layout
        .groups
        .iter()
        .zip(&keys.groups)
        .map(|(group, group_keys)| {
            let shard_names = group.shards(layout.world_size);
            // keys_by_shard[s][block]
            let mut keys_by_shard: Vec<Vec<String>> = vec![Vec::new(); shard_names.len()];
            // A drafter's group is probed under its next-token names (R37).
            for hash in hashes.names(group_keys.naming).iter() {
                for (shard, key) in group_keys.all_shard_keys(hash).enumerate() {
                    if let Some(column) = keys_by_shard.get_mut(shard) {
                        column.push(key);
                    }
                }
            }
            let shards = shard_names
                .iter()
                .zip(keys_by_shard)
                .map(|(shard, column)| shard_presence(pool, shard.to_string(), column, with_keys))
                .collect();
            let attention = match (group.is_window(), group.window_tokens) {
                (true, Some(window)) => format!("window W = {window}, S = {}", group.sink_tokens),
                _ => "full".to_owned(),
            };
            GroupPresence {
                group: group.id.0,
                attention,
                shards,
            }
        })
        .collect()
}

/// Probes one shard's column of keys.
fn shard_presence(
    pool: &dyn Pool,
    shard: String,
    column: Vec<String>,
    with_keys: bool,
) -> ShardPresence {
    let mut present = Vec::new();
    let mut errors = 0;
    let refs: Vec<&str> = column.iter().map(String::as_str).collect();
    for (chunk_index, chunk) in refs.chunks(PROBE_CHUNK).enumerate() {
        for (offset, answer) in pool.exists(chunk).into_iter().enumerate() {
            match answer {
                Ok(true) => present.push(chunk_index * PROBE_CHUNK + offset),
                Ok(false) => {}
                Err(_) => errors += 1,
            }
        }
    }
    ShardPresence {
        shard,
        first_key: column.first().cloned().unwrap_or_default(),
        present_blocks: present.len(),
        runs: runs(present.into_iter()),
        errors,
        keys: if with_keys { column } else { Vec::new() },
    }
}

/// Ascending block indices as half-open runs.
pub fn runs(blocks: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for block in blocks {
        match runs.last_mut() {
            Some((_, end)) if *end == block => *end += 1,
            _ => runs.push((block, block + 1)),
        }
    }
    runs
}

/// `[0, 10) [20, 25) ... and N more runs`.
pub fn runs_text(runs: &[(usize, usize)]) -> String {
    if runs.is_empty() {
        return "none".to_owned();
    }
    let mut text: Vec<String> = runs
        .iter()
        .take(RUNS_SHOWN)
        .map(|(start, end)| format!("[{start}, {end})"))
        .collect();
    if runs.len() > RUNS_SHOWN {
        text.push(format!("... and {} more runs", runs.len() - RUNS_SHOWN));
    }
    text.join(" ")
}

/// Prints one group: per shard, present blocks and their runs (and every key with
/// `all_keys`).
pub fn write_group(
    out: &mut dyn Write,
    group: &GroupPresence,
    blocks: usize,
    all_keys: bool,
) -> io::Result<()> {
    writeln!(out, "group {} ({})", group.group, group.attention)?;
    for shard in &group.shards {
        writeln!(
            out,
            "  shard {}: {} of {blocks} blocks present: {}{}",
            shard.shard,
            shard.present_blocks,
            runs_text(&shard.runs),
            if shard.errors > 0 {
                format!(" ({} probes failed)", shard.errors)
            } else {
                String::new()
            }
        )?;
        writeln!(out, "    key of block 0: {}", shard.first_key)?;
        if all_keys {
            for (block, key) in shard.keys.iter().enumerate() {
                writeln!(out, "    {block}\t{key}")?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_consecutive_blocks() {
        assert_eq!(
            runs([0, 1, 2, 5, 6, 9].into_iter()),
            vec![(0, 3), (5, 7), (9, 10)]
        );
        assert!(runs(std::iter::empty()).is_empty());
        assert_eq!(runs_text(&[(0, 3), (5, 7)]), "[0, 3) [5, 7)");
        assert_eq!(runs_text(&[]), "none");
        let many: Vec<(usize, usize)> = (0..20).map(|i| (2 * i, 2 * i + 1)).collect();
        assert!(runs_text(&many).ends_with("... and 8 more runs"));
    }
}
