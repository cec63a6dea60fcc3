//! How many pool bytes one prompt occupies once saved, in stored (scaled) bytes: the check
//! behind the replay's "the pool cannot hold even the largest prompt" warning, and the
//! pool size `inspect` seeds with.
//!
//! A full-attention group stores every full block of the prompt (R16); a window group
//! stores only its sink blocks and the blocks of `[P - W - R, P)` (R17), so on a model of
//! mostly window layers a prompt takes far less than `blocks x page bytes`.

use crate::core::layout::Layout;

/// Stored bytes the saves of one prompt of `prompt_len` tokens put in the pool, over all
/// groups and ranks; `stored_page_bytes` is each group's stored page size, layout order;
/// `rewind_tokens` is `R`.
pub fn prompt_stored_bytes(
    layout: &Layout,
    stored_page_bytes: &[u64],
    rewind_tokens: u64,
    prompt_len: u64,
) -> u64 {
    let t = u64::from(layout.tokens_per_block).max(1);
    let blocks = prompt_len / t;
    let per_rank: u64 = layout
        .groups
        .iter()
        .zip(stored_page_bytes)
        .map(|(group, &page)| {
            let stored_blocks = match group.window_tokens {
                None => blocks,
                Some(window) => {
                    let sinks = u64::from(group.sink_tokens).div_ceil(t);
                    let tail = (u64::from(window) + rewind_tokens).div_ceil(t) + 1;
                    blocks.min(sinks + tail)
                }
            };
            let ranks = if group.replicated {
                1
            } else {
                u64::from(layout.world_size)
            };
            stored_blocks.saturating_mul(page).saturating_mul(ranks)
        })
        .fold(0, u64::saturating_add);
    per_rank
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_groups_store_only_sinks_and_the_tail_r17() -> Result<(), Box<dyn std::error::Error>> {
        let layout = Layout::preset("tiny-hybrid")?;
        // T = 16; full group page 4096, window group (W = 64, S = 4) page 4096.
        let pages = [4096, 4096];
        // 10 blocks, no rewind: full stores 10; window 1 sink block + 64/16 + 1 = 6.
        assert_eq!(
            prompt_stored_bytes(&layout, &pages, 0, 160),
            (10 + 6) * 4096
        );
        // A short prompt: the window group cannot store more blocks than it has.
        assert_eq!(
            prompt_stored_bytes(&layout, &pages, 2048, 48),
            (3 + 3) * 4096
        );
        // A long prompt: the window part stops growing with the prompt.
        let long = prompt_stored_bytes(&layout, &pages, 32, 16_000);
        assert_eq!(long, (1000 + 1 + 6 + 1) * 4096);
        Ok(())
    }
}
