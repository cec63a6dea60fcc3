//! What an engine that copies window blocks aside before handing them over (vLLM's bounce
//! pages) needs to know of a request's window saves (R17, R28): the blocks one chunk saves
//! ([`ConnectorHandle::window_blocks_to_save`]), or every chunk's at once, point by point
//! ([`ConnectorHandle::window_save_schedule`], `save_plan::S4`), for a scheduler that reads
//! the blocks' ids once a request rather than once a chunk. Both read only: `on_step`
//! plans each step itself.

use std::collections::BTreeMap;
use std::ops::Range;

use super::ConnectorHandle;
use crate::core::ids::RequestId;
use crate::core::layout::GroupKind;
use crate::core::save_plan::{block_ranges_to_save, window_save_schedule, SaveCap, SaveStep};

impl ConnectorHandle {
    /// The blocks of each window group that `on_step` would save for `request`'s chunk
    /// `computed` of a `prompt_len`-token prompt (R17, R28), per layout group: empty for a
    /// full group, and for a request whose saves are off (unknown, or disputed, R32).
    pub fn window_blocks_to_save(
        &self,
        request: RequestId,
        prompt_len: usize,
        computed: Range<usize>,
    ) -> Vec<Vec<usize>> {
        let mut planned = vec![Vec::new(); self.groups.len()];
        let mut ranges = Vec::new();
        for (position, step) in self.window_steps(request, prompt_len, computed) {
            block_ranges_to_save(self.groups[position].attention, &step, SaveCap::ChunkEnd, &mut ranges);
            planned[position] = ranges.iter().flat_map(|(blocks, _)| blocks.clone()).collect();
        }
        planned
    }

    /// Each save point of `request`'s prompt (a window checkpoint, and the prompt end while
    /// the window is not saved yet), ascending, with per layout group the blocks a chunk
    /// passing that point saves. What `window_blocks_to_save` gives for any chunk lies in
    /// the union of the points the chunk passes (`save_plan::S4`), which lists beyond it
    /// only sink blocks the chunk has not computed yet. Empty where that one gives nothing
    /// for every chunk.
    pub fn window_save_schedule(
        &self,
        request: RequestId,
        prompt_len: usize,
    ) -> Vec<(usize, Vec<Vec<usize>>)> {
        let mut points: BTreeMap<usize, Vec<Vec<usize>>> = BTreeMap::new();
        // A chunk ending at the prompt end: its `last_chunk` says whether the window is
        // still to be saved, which is what the schedule reads.
        for (position, step) in self.window_steps(request, prompt_len, prompt_len..prompt_len) {
            for (point, ranges) in window_save_schedule(self.groups[position].attention, &step) {
                let groups = points.entry(point).or_insert_with(|| vec![Vec::new(); self.groups.len()]);
                groups[position] = ranges.into_iter().flatten().collect();
            }
        }
        points.into_iter().collect()
    }

    /// The save step of each window group this connector saves (its layout position), for
    /// `request`'s chunk `computed`; none for a request whose saves are off (unknown, not
    /// looked up yet, or disputed).
    fn window_steps(
        &self,
        request: RequestId,
        prompt_len: usize,
        computed: Range<usize>,
    ) -> Vec<(usize, SaveStep)> {
        let Some(state) = self.requests.get(&request).filter(|state| !state.disputed) else {
            return Vec::new();
        };
        let Some((_, hashes)) = &state.lookup else {
            return Vec::new();
        };
        let step = self.save_step(state.reused_until, state.window_saved, prompt_len, computed);
        let windows = self.groups.iter().enumerate().filter(|(_, group)| group.attention.kind == GroupKind::Window);
        windows
            .filter_map(|(position, _)| {
                let keys = self.keys.group(position)?;
                let hashed_blocks = hashes.names(keys.naming).len();
                Some((position, SaveStep { hashed_blocks, ..step }))
            })
            .collect()
    }
}
