//! Which part of a deployment one connector serves (R33): a run of the tensor-parallel
//! ranks, the layer groups of one pipeline stage, or nothing at all (a lookup-only
//! connector, for a scheduler that lives apart from every rank).
//!
//! A deployment whose ranks run in several processes has one connector per process, each
//! on its own part: the connector of a pipeline stage knows only its stage's layout, and
//! keys its pages by that layout's fingerprint (R4) as any connector does. The scheduler's
//! lookup-only connector looks up every stage's groups at once: its layout is the union of
//! the stages' layouts, and each group is keyed under its own stage's fingerprint, so it
//! probes exactly the keys the stages save under.
//!
//! Invariants:
//!
//! - `share::S1`. A connector's devices are the ranks `first_rank..first_rank + devices`,
//!   all within the layout's world size.
//! - `share::S2`. With stages, the layout is their union: the same block size and world
//!   size, every stage's groups in it unchanged, and every group of it in exactly one stage.
//!   A group is keyed under its stage's fingerprint; without stages, under the layout's.

use crate::core::layout::{GroupId, Layout, LayoutFingerprint};

/// The part of a deployment a connector serves; the default is all of it (every rank of
/// its layout, which is the whole deployment's).
#[derive(Clone, Debug, Default)]
pub struct RankShare {
    /// The tensor-parallel rank of the first device (`share::S1`).
    pub first_rank: u32,
    /// The pipeline stages' layouts whose union is the connector's layout (`share::S2`);
    /// empty for a connector of one stage or of a deployment without pipeline stages.
    pub stages: Vec<Layout>,
}

/// Why a share does not fit the connector's layout and devices.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// Devices past the world size (`share::S1`).
    #[error(
        "{devices} devices from rank {first_rank} do not fit world size {world_size}; give at \
         most {} devices from rank {first_rank}, or a first rank below the world size",
        world_size.saturating_sub(*first_rank)
    )]
    Ranks {
        /// Devices given.
        devices: usize,
        /// The rank of the first.
        first_rank: u32,
        /// World size of the layout.
        world_size: u32,
    },
    /// The layout is not the union of the stages' layouts (`share::S2`).
    #[error("layout {layout:?} is not the union of its pipeline stages' layouts: {why}")]
    NotTheStages {
        /// The connector's layout.
        layout: String,
        /// What differs.
        why: String,
    },
}

impl RankShare {
    /// The share of rank `first_rank` (one device per rank from it).
    pub fn from_rank(first_rank: u32) -> Self {
        Self {
            first_rank,
            stages: Vec::new(),
        }
    }

    /// Checks `share::S1` and `share::S2` for a connector on `layout` with `devices` devices.
    ///
    /// # Errors
    /// [`ShareError`] naming what does not fit.
    pub fn check(&self, layout: &Layout, devices: usize) -> Result<(), ShareError> {
        let fits = u64::from(self.first_rank) + devices as u64 <= u64::from(layout.world_size);
        if !fits || (devices > 0 && self.first_rank >= layout.world_size) {
            return Err(ShareError::Ranks {
                devices,
                first_rank: self.first_rank,
                world_size: layout.world_size,
            });
        }
        if self.stages.is_empty() {
            Ok(())
        } else {
            union_of(layout, &self.stages)
        }
    }

    /// The fingerprint each group of `layout` is keyed under (`share::S2`), by group id.
    pub fn fingerprints(&self, layout: &Layout) -> Vec<(GroupId, LayoutFingerprint)> {
        if self.stages.is_empty() {
            let own = layout.fingerprint();
            return layout.groups.iter().map(|group| (group.id, own)).collect();
        }
        self.stages
            .iter()
            .flat_map(|stage| {
                let fingerprint = stage.fingerprint();
                stage.groups.iter().map(move |group| (group.id, fingerprint))
            })
            .collect()
    }

    /// Whether this connector saves the pages stored once for every rank (replicated
    /// groups): the one holding rank 0 does.
    pub fn saves_replicated(&self) -> bool {
        self.first_rank == 0
    }
}

/// `share::S2`: `layout` is the union of `stages`.
fn union_of(layout: &Layout, stages: &[Layout]) -> Result<(), ShareError> {
    let refuse = |why: String| ShareError::NotTheStages {
        layout: layout.name.clone(),
        why,
    };
    for stage in stages {
        if (stage.tokens_per_block, stage.world_size) != (layout.tokens_per_block, layout.world_size) {
            return Err(refuse(format!(
                "stage {:?} has {} tokens per block and world size {}, the layout {} and {}",
                stage.name,
                stage.tokens_per_block,
                stage.world_size,
                layout.tokens_per_block,
                layout.world_size
            )));
        }
        for group in &stage.groups {
            if !layout.groups.contains(group) {
                return Err(refuse(format!("group {} of stage {:?} differs or is missing", group.id.0, stage.name)));
            }
        }
    }
    for group in &layout.groups {
        let holders = stages
            .iter()
            .filter(|stage| stage.groups.iter().any(|other| other.id == group.id))
            .count();
        if holders != 1 {
            return Err(refuse(format!("group {} is in {holders} stages, not one", group.id.0)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::layout::LayoutError;

    /// tiny-hybrid's two groups, each as a stage of its own.
    fn stages() -> Result<(Layout, Vec<Layout>), LayoutError> {
        let union = Layout::preset("tiny-hybrid")?;
        let stages = union
            .groups
            .iter()
            .map(|group| Layout {
                groups: vec![group.clone()],
                ..union.clone()
            })
            .collect();
        Ok((union, stages))
    }

    /// `share::S1`: devices from `first_rank` must fit the world.
    #[test]
    fn devices_past_the_world_are_refused() -> Result<(), LayoutError> {
        let layout = Layout {
            world_size: 2,
            ..Layout::preset("tiny-hybrid")?
        };
        assert!(RankShare::from_rank(1).check(&layout, 1).is_ok());
        assert!(RankShare::from_rank(0).check(&layout, 2).is_ok());
        assert!(RankShare::from_rank(0).check(&layout, 0).is_ok(), "lookup-only");
        let refused = RankShare::from_rank(1).check(&layout, 2);
        assert!(matches!(refused, Err(ShareError::Ranks { first_rank: 1, .. })));
        assert!(RankShare::from_rank(2).check(&layout, 1).is_err());
        Ok(())
    }

    /// `share::S2`: each group keyed under its own stage's fingerprint, and only a true
    /// union of the stages is taken.
    #[test]
    fn stages_key_their_groups_and_must_make_the_layout() -> Result<(), LayoutError> {
        let (union, stages) = stages()?;
        let share = RankShare {
            first_rank: 0,
            stages: stages.clone(),
        };
        assert!(share.check(&union, 0).is_ok());
        let named = share.fingerprints(&union);
        for (stage, (group, fingerprint)) in stages.iter().zip(&named) {
            assert_eq!((stage.groups[0].id, stage.fingerprint()), (*group, *fingerprint));
        }
        assert_ne!(named[0].1, named[1].1);
        let missing = RankShare {
            first_rank: 0,
            stages: stages[..1].to_vec(),
        };
        assert!(matches!(missing.check(&union, 0), Err(ShareError::NotTheStages { .. })));
        let mut changed = stages.clone();
        changed[1].groups[0].head_dim *= 2;
        let differs = RankShare {
            first_rank: 0,
            stages: changed,
        };
        assert!(differs.check(&union, 0).is_err());
        let twice = RankShare {
            first_rank: 0,
            stages: vec![stages[0].clone(), stages[0].clone(), stages[1].clone()],
        };
        assert!(twice.check(&union, 0).is_err(), "a group in two stages");
        Ok(())
    }

    /// Without stages every group is keyed under the layout's own fingerprint.
    #[test]
    fn without_stages_the_layout_names_every_group() -> Result<(), LayoutError> {
        let layout = Layout::preset("tiny-hybrid")?;
        let named = RankShare::default().fingerprints(&layout);
        assert!(named.iter().all(|(_, fingerprint)| *fingerprint == layout.fingerprint()));
        assert!(RankShare::default().saves_replicated());
        assert!(!RankShare::from_rank(1).saves_replicated());
        Ok(())
    }
}
