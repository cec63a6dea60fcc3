//! What one request's chain is scoped to beyond the deployment's own scope (R34): the
//! request's cache salt and its `LoRA` adapter, as the engine names them.
//!
//! The deployment's seed (R1: the scope seed of its salt) seeds every request without a
//! scope of its own, so those requests keep their keys. A request with a cache salt or an
//! adapter chains from
//!
//! ```text
//! seed = BLAKE2b-16( deployment seed || part(cache salt) || part(adapter) )
//!        part(None)    = 0x00
//!        part(Some(s)) = 0x01 || u32 LE length || s as UTF-8
//! ```
//!
//! An adapter is named by what identifies its weights across instances (vLLM: its name and
//! path), never by an id one process assigned, which another instance may give to other
//! weights.
//!
//! ## Invariants
//!
//! - `request_scope::Q1`. An empty scope leaves the deployment's seed unchanged.
//! - `request_scope::Q2`. Two scopes give the same seed only when the deployment seed, the
//!   salt and the adapter are all equal (up to `BLAKE2b` collisions): each part is framed
//!   with its presence and length, so no two different scopes encode to the same bytes, and
//!   an empty scope never collides with a salted one (the framed input is longer than 16
//!   bytes, so a salted seed is a digest, never the deployment seed itself, barring a
//!   collision).

use crate::core::hash::{digest_params, to_block_hash, BlockHash};

/// A request's own scope: `None` fields are absent (R34).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RequestScope {
    /// The request's cache salt (a tenant's isolation within one engine).
    pub cache_salt: Option<String>,
    /// The request's `LoRA` adapter, named by what identifies its weights.
    pub adapter: Option<String>,
}

impl RequestScope {
    /// Whether the request has no scope of its own (`request_scope::Q1`).
    pub fn is_empty(&self) -> bool {
        self.cache_salt.is_none() && self.adapter.is_none()
    }

    /// The seed of the request's chain under a deployment seed (module docs).
    pub fn seed(&self, deployment: BlockHash) -> BlockHash {
        if self.is_empty() {
            return deployment;
        }
        let mut state = digest_params().to_state();
        state.update(&deployment.0);
        for part in [&self.cache_salt, &self.adapter] {
            match part {
                None => {
                    state.update(&[0]);
                }
                Some(text) => {
                    let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
                    state.update(&[1]);
                    state.update(&len.to_le_bytes());
                    state.update(text.as_bytes());
                }
            }
        }
        to_block_hash(state.finalize().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hash::{scope_seed, Scope};
    use proptest::prelude::*;

    fn deployment(salt: Option<&str>) -> BlockHash {
        scope_seed(&Scope {
            salt: salt.map(str::to_owned),
            ..Scope::default()
        })
    }

    #[test]
    fn an_empty_scope_keeps_the_deployment_seed_q1() {
        let seed = deployment(Some("engine"));
        assert_eq!(RequestScope::default().seed(seed), seed);
    }

    fn scope(salt: Option<String>, adapter: Option<String>) -> RequestScope {
        RequestScope {
            cache_salt: salt,
            adapter,
        }
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x7363_6f70),
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]
        /// `request_scope::Q2`: seeds are equal exactly when every part is.
        #[test]
        fn seeds_differ_when_any_part_differs_q2(
            a in (proptest::option::of("[a-c/]{0,3}"), proptest::option::of("[a-c/]{0,3}"), proptest::option::of("[ab]{0,2}")),
            b in (proptest::option::of("[a-c/]{0,3}"), proptest::option::of("[a-c/]{0,3}"), proptest::option::of("[ab]{0,2}")),
        ) {
            let seed_a = scope(a.0.clone(), a.1.clone()).seed(deployment(a.2.as_deref()));
            let seed_b = scope(b.0.clone(), b.1.clone()).seed(deployment(b.2.as_deref()));
            // Deployment salts None and "" encode alike (R1), so compare them as one.
            let engine = |salt: &Option<String>| salt.clone().unwrap_or_default();
            let equal = a.0 == b.0 && a.1 == b.1 && engine(&a.2) == engine(&b.2);
            prop_assert_eq!(seed_a == seed_b, equal);
        }
    }

    #[test]
    fn salt_and_adapter_are_not_interchangeable_q2() {
        let seed = deployment(None);
        let salted = scope(Some("x".into()), None).seed(seed);
        let adapted = scope(None, Some("x".into())).seed(seed);
        assert_ne!(salted, adapted);
        assert_ne!(salted, seed);
    }
}
