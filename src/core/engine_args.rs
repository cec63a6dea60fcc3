//! `validate_llm_args` (R8): engine settings the connector cannot work with.
//!
//! The engine passes the parts of its configuration that change what a page means; each
//! refusal names the setting and the value that works:
//! - `kv_cache_config.enable_swa_scratch_reuse = true`: window pages would be overwritten
//!   in place while the connector may still save or load them;
//! - a nonzero `speculative_config.context_recompute_tail`: the engine would recompute
//!   (and so rewrite) prompt pages the connector already published or loaded;
//! - context or pipeline parallelism: a page would no longer hold all layers of a group
//!   for all tokens of its block on one rank.
//!
//! Engine configuration files carry many more fields (batch sizes, memory fractions, ...):
//! the structs here ignore them, and [`CHECKED_FIELDS`] names the ones they read, so a tool
//! can tell the user which fields were not checked. vLLM's names for the same settings are
//! accepted as aliases (`num_speculative_tokens`, `decode_context_parallel_size`).

use serde::{Deserialize, Serialize};

/// The dotted paths of every field [`LlmArgs`] reads (aliases included); any other field
/// of an engine configuration is ignored.
pub const CHECKED_FIELDS: [&str; 7] = [
    "kv_cache_config.enable_swa_scratch_reuse",
    "speculative_config.max_draft_len",
    "speculative_config.num_speculative_tokens",
    "speculative_config.context_recompute_tail",
    "context_parallel_size",
    "decode_context_parallel_size",
    "pipeline_parallel_size",
];

/// The engine arguments the connector checks, as the engine would pass them. Other fields
/// are ignored ([`CHECKED_FIELDS`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LlmArgs {
    /// KV cache settings.
    pub kv_cache_config: KvCacheArgs,
    /// Speculative decoding settings; absent without a drafter.
    pub speculative_config: Option<SpeculativeArgs>,
    /// Context-parallel size (1 = off); vLLM calls it `decode_context_parallel_size`.
    #[serde(alias = "decode_context_parallel_size")]
    pub context_parallel_size: u32,
    /// Pipeline-parallel size (1 = off).
    pub pipeline_parallel_size: u32,
}

/// `kv_cache_config` fields the connector checks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KvCacheArgs {
    /// Reuse of window scratch pages in place.
    pub enable_swa_scratch_reuse: bool,
}

/// `speculative_config` fields the connector checks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpeculativeArgs {
    /// Draft tokens per step; vLLM calls it `num_speculative_tokens`.
    #[serde(alias = "num_speculative_tokens")]
    pub max_draft_len: u32,
    /// Prompt tokens the drafter recomputes at the end of the context phase.
    pub context_recompute_tail: u32,
}

/// A setting the connector refuses (R8).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineArgsError {
    /// Window scratch reuse is on.
    #[error("kv_cache_config.enable_swa_scratch_reuse = true is not supported with the connector: set it to false")]
    SwaScratchReuse,
    /// The drafter recomputes prompt pages.
    #[error("speculative_config.context_recompute_tail = {tail} is not supported with the connector: set it to 0")]
    ContextRecomputeTail {
        /// The value given.
        tail: u32,
    },
    /// Context parallelism is on.
    #[error("context_parallel_size = {size} is not supported with the connector: set it to 1")]
    ContextParallel {
        /// The value given.
        size: u32,
    },
    /// Pipeline parallelism is on.
    #[error("pipeline_parallel_size = {size} is not supported with the connector: set it to 1")]
    PipelineParallel {
        /// The value given.
        size: u32,
    },
}

impl EngineArgsError {
    /// A short, stable label for metrics and logs.
    #[cfg(feature = "internals")]
    pub fn kind(&self) -> &'static str {
        match self {
            EngineArgsError::SwaScratchReuse => "swa_scratch_reuse",
            EngineArgsError::ContextRecomputeTail { .. } => "context_recompute_tail",
            EngineArgsError::ContextParallel { .. } => "context_parallel",
            EngineArgsError::PipelineParallel { .. } => "pipeline_parallel",
        }
    }
}

/// R8: every refusal, in the order above (empty when the connector is admitted).
pub fn validate_llm_args(args: &LlmArgs) -> Vec<EngineArgsError> {
    let mut refusals = Vec::new();
    if args.kv_cache_config.enable_swa_scratch_reuse {
        refusals.push(EngineArgsError::SwaScratchReuse);
    }
    if let Some(tail) = args
        .speculative_config
        .as_ref()
        .map(|spec| spec.context_recompute_tail)
        .filter(|&tail| tail != 0)
    {
        refusals.push(EngineArgsError::ContextRecomputeTail { tail });
    }
    if args.context_parallel_size > 1 {
        refusals.push(EngineArgsError::ContextParallel {
            size: args.context_parallel_size,
        });
    }
    if args.pipeline_parallel_size > 1 {
        refusals.push(EngineArgsError::PipelineParallel {
            size: args.pipeline_parallel_size,
        });
    }
    refusals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_speculation_without_recompute_are_admitted_r8() {
        assert!(validate_llm_args(&LlmArgs::default()).is_empty());
        let args = LlmArgs {
            speculative_config: Some(SpeculativeArgs {
                max_draft_len: 3,
                context_recompute_tail: 0,
            }),
            context_parallel_size: 1,
            pipeline_parallel_size: 1,
            ..LlmArgs::default()
        };
        assert!(validate_llm_args(&args).is_empty());
    }

    #[test]
    fn each_refusal_names_the_setting_and_a_working_value_r8() {
        let args = LlmArgs {
            kv_cache_config: KvCacheArgs {
                enable_swa_scratch_reuse: true,
            },
            speculative_config: Some(SpeculativeArgs {
                max_draft_len: 3,
                context_recompute_tail: 8,
            }),
            context_parallel_size: 2,
            pipeline_parallel_size: 4,
        };
        let messages: Vec<String> = validate_llm_args(&args)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(messages.len(), 4);
        assert!(
            messages[0].contains("enable_swa_scratch_reuse")
                && messages[0].contains("set it to false")
        );
        assert!(
            messages[1].contains("context_recompute_tail = 8")
                && messages[1].contains("set it to 0")
        );
        assert!(
            messages[2].contains("context_parallel_size = 2")
                && messages[2].contains("set it to 1")
        );
        assert!(
            messages[3].contains("pipeline_parallel_size = 4")
                && messages[3].contains("set it to 1")
        );
    }

    /// R8 as an engine passes it: any draft length is admitted; only the recompute tail is
    /// refused, alone, with the setting, the value given and the value that works.
    #[test]
    fn speculation_is_admitted_and_only_a_recompute_tail_refused_r8() -> Result<(), toml::de::Error>
    {
        let eagle: LlmArgs = toml::from_str("[speculative_config]\nmax_draft_len = 7\n")?;
        assert!(validate_llm_args(&eagle).is_empty());
        let tail: LlmArgs = toml::from_str(
            "[speculative_config]\nmax_draft_len = 7\ncontext_recompute_tail = 16\n",
        )?;
        let refusals = validate_llm_args(&tail);
        assert_eq!(
            refusals,
            vec![EngineArgsError::ContextRecomputeTail { tail: 16 }]
        );
        assert_eq!(refusals[0].kind(), "context_recompute_tail");
        assert_eq!(
            refusals[0].to_string(),
            "speculative_config.context_recompute_tail = 16 is not supported with the \
             connector: set it to 0"
        );
        Ok(())
    }

    /// Engine files carry many fields the connector does not check; they are ignored here
    /// (the `validate` command lists them, so a misspelt checked field is visible there).
    #[test]
    fn llm_args_ignore_fields_they_do_not_check() -> Result<(), toml::de::Error> {
        let parsed: LlmArgs = toml::from_str(
            "max_batch_size = 8\n[kv_cache_config]\nenable_swa_scratch_reus = true\n",
        )?;
        assert_eq!(parsed, LlmArgs::default());
        Ok(())
    }
}
