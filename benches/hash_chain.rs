//! Hash chain and pool key benchmarks (R1-R3) on a long prompt.
//!
//! The prompt is 170k tokens from the reference's LCG (seed 3, vocabulary 201088), hashed
//! in blocks of T = 32 tokens, with keys for 2 layer groups on 1 rank:
//!
//! - `floor_blake2b_only`: BLAKE2b-16 over the same `parent || block` inputs, laid out in
//!   advance; the cost no chain can go below.
//! - `chain_one_shot`: [`hash_blocks`] over the whole prompt (target: within 1.2x the floor).
//! - `chain_and_keys_2_groups`: the chain plus one [`KeyColumn`] per group.
//! - `extend_chain_166k_by_4k`: a 166k-token chain extended by a 4k-token turn (R2).
//! - `extend_chain_and_keys_166k_by_4k`: the same turn, with both key columns extended.
//!
//! Run: `cargo bench --bench hash_chain -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput};
use kv_connector::core::hash::{hash_blocks, scope_seed, BlockHash, HashChain, Scope};
use kv_connector::core::keys::{KeyColumn, KeyPrefix, KeySpec, Shard};
use kv_connector::core::layout::GroupId;

/// Tokens in the prompt.
const PROMPT_TOKENS: usize = 170_000;
/// Tokens of the last turn, appended to a chain of `PROMPT_TOKENS - TURN_TOKENS`.
const TURN_TOKENS: usize = 4_000;
/// Tokens per block.
const TOKENS_PER_BLOCK: usize = 32;
/// Layer groups keyed per block.
const GROUPS: u32 = 2;

/// The reference's `lcg_tokens(n, seed, vocab=201088)`.
fn lcg_tokens(count: usize, seed: u64) -> Vec<i64> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            i64::try_from((state >> 33) % 201_088).unwrap_or_default()
        })
        .collect()
}

/// Every block's `parent || tokens` input, back to back, for the floor.
fn floor_inputs(seed: BlockHash, tokens: &[i64], hashes: &[BlockHash]) -> Vec<u8> {
    let parents = std::iter::once(seed).chain(hashes.iter().copied());
    let mut inputs = Vec::with_capacity(hashes.len() * (16 + 8 * TOKENS_PER_BLOCK));
    for (parent, block) in parents.zip(tokens.chunks_exact(TOKENS_PER_BLOCK)) {
        inputs.extend_from_slice(&parent.0);
        for token in block {
            inputs.extend_from_slice(&token.to_le_bytes());
        }
    }
    inputs
}

/// One validated prefix per group, rank 0 of 1, 64 KiB pages.
fn prefixes() -> Vec<KeyPrefix> {
    (0..GROUPS)
        .filter_map(|group| {
            KeyPrefix::validated(&KeySpec {
                namespace: "ns",
                model_key: "model",
                shard: Shard::Rank { world: 1, rank: 0 },
                group: GroupId(group),
                tokens_per_block: TOKENS_PER_BLOCK,
                bytes_per_page: 65_536,
            })
            .ok()
        })
        .collect()
}

fn bench_prompt(c: &mut Criterion) {
    let tokens = lcg_tokens(PROMPT_TOKENS, 3);
    let seed = scope_seed(&Scope::default());
    let hashes = hash_blocks(seed, &tokens, TOKENS_PER_BLOCK).unwrap_or_default();
    assert_eq!(hashes.len(), PROMPT_TOKENS / TOKENS_PER_BLOCK);
    let inputs = floor_inputs(seed, &tokens, &hashes);
    let prefixes = prefixes();
    assert_eq!(prefixes.len(), 2);

    let mut group = c.benchmark_group("prompt_170k_t32");
    group.throughput(Throughput::Elements(hashes.len() as u64));
    group.bench_function("floor_blake2b_only", |b| {
        let mut params = blake2b_simd::Params::new();
        params.hash_length(16);
        b.iter(|| {
            let mut last = [0u8; 16];
            for input in inputs.chunks_exact(16 + 8 * TOKENS_PER_BLOCK) {
                last.copy_from_slice(params.hash(black_box(input)).as_bytes());
            }
            last
        });
    });
    group.bench_function("chain_one_shot", |b| {
        b.iter(|| hash_blocks(seed, black_box(&tokens), TOKENS_PER_BLOCK));
    });
    group.bench_function("chain_and_keys_2_groups", |b| {
        b.iter(|| {
            let hashes =
                hash_blocks(seed, black_box(&tokens), TOKENS_PER_BLOCK).unwrap_or_default();
            let columns: Vec<KeyColumn> = prefixes
                .iter()
                .map(|prefix| KeyColumn::with_hashes(prefix.clone(), &hashes))
                .collect();
            (hashes, columns)
        });
    });
    group.finish();
}

fn bench_turn(c: &mut Criterion) {
    let tokens = lcg_tokens(PROMPT_TOKENS, 3);
    let seed = scope_seed(&Scope::default());
    let earlier = &tokens[..PROMPT_TOKENS - TURN_TOKENS];
    let mut base = HashChain::new(seed, TOKENS_PER_BLOCK).unwrap_or_else(|_| unreachable!());
    let _ = base.extend_to(earlier);
    let base_columns: Vec<KeyColumn> = prefixes()
        .into_iter()
        .map(|prefix| KeyColumn::with_hashes(prefix, base.hashes()))
        .collect();
    let new_blocks = PROMPT_TOKENS / TOKENS_PER_BLOCK - base.len();

    let mut group = c.benchmark_group("turn_166k_plus_4k_t32");
    group.throughput(Throughput::Elements(new_blocks as u64));
    // Setup (not timed) clones the chain with room for the turn, as a chain that grew turn
    // by turn has; the timed part is the extension alone.
    let grown_chain = || {
        let mut chain = base.clone();
        chain.reserve_for_tokens(PROMPT_TOKENS);
        chain
    };
    group.bench_function("extend_chain_166k_by_4k", |b| {
        b.iter_batched_ref(
            grown_chain,
            |chain| chain.extend_to(black_box(&tokens)).map(<[BlockHash]>::len),
            BatchSize::SmallInput,
        );
    });
    group.bench_function("extend_chain_and_keys_166k_by_4k", |b| {
        b.iter_batched_ref(
            || {
                let mut columns = base_columns.clone();
                for column in &mut columns {
                    column.reserve(new_blocks);
                }
                (grown_chain(), columns)
            },
            |(chain, columns)| {
                let new = chain.extend_to(black_box(&tokens)).unwrap_or_default();
                for column in columns.iter_mut() {
                    column.extend(new);
                }
                new.len()
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

/// What `criterion_group!` / `criterion_main!` expand to, written out so the entry point is
/// documented (the crate denies missing docs).
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench_prompt(&mut criterion);
    bench_turn(&mut criterion);
    criterion.final_summary();
}
