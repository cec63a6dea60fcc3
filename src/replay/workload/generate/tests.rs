//! Unit and property tests of the conversation generator (`generate::I1`..I4).

use proptest::prelude::*;

use super::*;

fn segment(seed: u64, len: u32) -> TokenSegment {
    TokenSegment { seed, len }
}

#[test]
fn truncate_segments_cuts_inside_and_between_segments() {
    let full = vec![segment(1, 10), segment(2, 5), segment(3, 7)];
    let mut cut = full.clone();
    truncate_segments(&mut cut, 12);
    assert_eq!(cut, [segment(1, 10), segment(2, 2)]);
    let mut cut = full.clone();
    truncate_segments(&mut cut, 15);
    assert_eq!(cut, [segment(1, 10), segment(2, 5)]);
    let mut cut = full.clone();
    truncate_segments(&mut cut, 22);
    assert_eq!(cut, full);
    truncate_segments(&mut cut, 0);
    assert!(cut.is_empty());
}

#[test]
fn g2_turn_lengths_run_from_first_to_last() {
    let params = LongMultiturnParams::default();
    assert_eq!(params.turn_prompt_len(0), 100_000);
    assert_eq!(params.turn_prompt_len(23), 170_000);
    let single = LongMultiturnParams {
        turns_per_session: 1,
        ..params
    };
    assert_eq!(single.turn_prompt_len(0), 100_000);
    assert_eq!(single.total_prompt_tokens(), 200_000);
}

#[test]
fn defaults_are_valid_and_keep_prompts_exact_prefixes() {
    let params = LongMultiturnParams::default();
    assert_eq!(params.validate(), Ok(()));
    assert_eq!(params.divergence_tokens_max, 0);
    assert!(
        params.session_spacing_ms < params.think_time_ms,
        "sessions interleave"
    );
}

#[test]
fn params_deserialize_with_defaults_and_refuse_unknown_keys() -> Result<(), toml::de::Error> {
    let params: LongMultiturnParams = toml::from_str("sessions = 5\nseed = 9")?;
    assert_eq!(
        params,
        LongMultiturnParams {
            sessions: 5,
            seed: 9,
            ..LongMultiturnParams::default()
        }
    );
    assert!(toml::from_str::<LongMultiturnParams>("session = 5").is_err());
    Ok(())
}

#[test]
fn the_shared_documents_preset_ends_no_first_turn_within_the_rewind_of_its_document() {
    let params = LongMultiturnParams::shared_documents();
    assert_eq!(params.validate(), Ok(()));
    assert_eq!(params.shared_prefix_tokens(), 50_000);
    assert_eq!(params.total_prompt_tokens(), 3_520_000);
    let question = u64::from(params.first_turn_tokens) - params.shared_prefix_tokens();
    let rewind = crate::config::Config::default()
        .planner
        .swa_endpoint_rewind_tokens;
    assert!(question > rewind, "{question} > {rewind}");
    assert_eq!(params.document_of(6), Some(2));
    assert_eq!(LongMultiturnParams::default().document_of(6), None);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, rng_seed: proptest::test_runner::RngSeed::Fixed(0x6e6e), ..ProptestConfig::default() })]

    /// `generate::I2`, `generate::I3` and `generate::I4`: each turn has the planned length
    /// and keeps all but at most `divergence_tokens_max` of the previous turn, never less
    /// than the shared prefix; first turns of sessions with one document share it.
    #[test]
    fn g2_g3_g4_hold_for_small_parameters(
        sessions in 1u32..5,
        turns in 1u32..6,
        first in 50u32..200,
        growth in 0u32..300,
        output in 1u32..20,
        system in 0u32..50,
        divergence in 0u32..40,
        documents in 0u32..3,
        document in 1u32..60,
        seed in any::<u64>(),
    ) {
        let document_tokens = if documents > 0 { document } else { 0 };
        let params = LongMultiturnParams {
            sessions,
            turns_per_session: turns,
            first_turn_tokens: first,
            last_turn_tokens: first + growth,
            output_tokens: output,
            system_prefix_tokens: system,
            documents,
            document_tokens,
            divergence_tokens_max: divergence,
            seed,
            ..LongMultiturnParams::default()
        };
        let Ok(requests) = generate_long_multiturn(&params) else {
            prop_assert!(params.validate().is_err());
            return Ok(());
        };
        prop_assert_eq!(requests.len(), (sessions * turns) as usize);
        let shared_prefix = (system + document_tokens) as usize;
        let first_turns: Vec<Vec<i64>> = (0..u64::from(sessions))
            .filter_map(|session| requests.iter().find(|request| request.session == Some(session)))
            .map(WorkloadRequest::prompt_tokens)
            .collect();
        for (session, first) in (0..sessions).zip(&first_turns) {
            let same_document = (0..sessions)
                .zip(&first_turns)
                .filter(|&(other, _)| params.document_of(other) == params.document_of(session));
            for (_, other) in same_document {
                prop_assert_eq!(&first[..shared_prefix], &other[..shared_prefix]);
            }
        }
        for session in 0..u64::from(sessions) {
            let turns_of: Vec<&WorkloadRequest> =
                requests.iter().filter(|request| request.session == Some(session)).collect();
            for (turn, request) in (0..).zip(&turns_of) {
                prop_assert_eq!(request.prompt_len() as u64, params.turn_prompt_len(turn));
            }
            for pair in turns_of.windows(2) {
                let (before, after) = (pair[0].prompt_tokens(), pair[1].prompt_tokens());
                let shared = before.iter().zip(&after).take_while(|(a, b)| a == b).count();
                prop_assert!(shared + divergence as usize >= before.len());
                prop_assert!(shared >= shared_prefix);
            }
        }
    }
}
