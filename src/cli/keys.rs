//! `kv-connector keys`: the chain hash and pool keys of every full block of a token list.
//!
//! An operator's tool to find which pool objects a prompt maps to, and a check that the Rust
//! port matches `../shared/reference/hash_reference.py` on any input (R1, R3).
//!
//! ## Workflow
//!
//! 1. Check the flags (`--tokens-per-block`, `--world`, `--rank`) before reading anything.
//! 2. Read the token ids from the file argument, or stdin when it is absent or `-`: a JSON
//!    array of integers, or integers separated by whitespace.
//! 3. Hash the full blocks from the scope seed of `--salt`, `--lora` and `--media-digest`.
//! 4. Build one key column per `--group`, in the order given, with the runtime's own
//!    validation of the key fields (`KeyPrefix::validated`): a namespace or model key the
//!    runtime would refuse is refused here too, so every printed key is one the runtime can
//!    produce.
//! 5. Print one line per full block, `block<TAB>hash<TAB>key...`, or with `--json` one JSON
//!    array of `{"block": i, "hash": "<hex>", "keys": [...]}`. Input without a full block
//!    is an error that says so.
//!
//! The keys are those of target-model groups: a drafter's group names its pages by the
//! chain extended with the next token (R37), which this tool does not compute; the Python
//! package's `Connector.keys` gives them for a layout with draft groups.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::num::ParseIntError;
use std::path::{Path, PathBuf};

use crate::core::hash::{hash_blocks, scope_seed, BlockHash, HashError, Scope};
use crate::core::keys::{KeyColumn, KeyError, KeyPrefix, KeySpec, Shard};
use crate::core::layout::GroupId;

/// Arguments of `kv-connector keys`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeysArgs {
    /// File holding the token ids: a JSON array of integers, or integers separated by
    /// whitespace. Reads stdin when absent or `-`.
    #[arg(value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Tokens per KV block (T); at least 1. Only full blocks are hashed.
    #[arg(long, short = 't', value_name = "T", default_value_t = 32)]
    pub tokens_per_block: usize,
    /// Namespace, the first key segment, as the runtime is configured with.
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    pub namespace: String,
    /// Model key, the second key segment, as the runtime is configured with.
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    pub model_key: String,
    /// Tensor-parallel world size of per-rank keys (`w{WORLD}r{RANK}`); at least 1.
    #[arg(
        long,
        value_name = "WORLD",
        default_value_t = 1,
        conflicts_with = "replicated"
    )]
    pub world: u32,
    /// Rank of per-rank keys, below --world.
    #[arg(
        long,
        value_name = "RANK",
        default_value_t = 0,
        conflicts_with = "replicated"
    )]
    pub rank: u32,
    /// Print keys of pages identical on every rank (`replicated`) instead of per-rank keys.
    #[arg(long)]
    pub replicated: bool,
    /// Layer group to print keys for; repeat for several groups, printed in the order given.
    #[arg(long = "group", value_name = "ID", default_values_t = [0u32])]
    pub groups: Vec<u32>,
    /// Bytes of one page of a group on one rank (the `b{BYTES}` in the key).
    #[arg(long, value_name = "BYTES")]
    pub bytes_per_page: u64,
    /// Cache salt (tenant) the chain is scoped to; absent and empty encode the same.
    #[arg(long, value_name = "SALT", allow_hyphen_values = true)]
    pub salt: Option<String>,
    /// Adapter task id the chain is scoped to (a 64-bit signed integer), as the engine
    /// passes it for requests under a low-rank adapter.
    #[arg(long, value_name = "ID", allow_negative_numbers = true)]
    pub lora: Option<i64>,
    /// 32-byte digest of a multimodal item, as 64 hex digits; repeat in prompt order.
    #[arg(long = "media-digest", value_name = "HEX", value_parser = parse_media_digest)]
    pub media_digests: Vec<[u8; 32]>,
    /// Print one JSON array of {"block", "hash", "keys"} objects instead of text lines.
    #[arg(long)]
    pub json: bool,
}

/// Why `kv-connector keys` failed.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// `--tokens-per-block 0`.
    #[error("--tokens-per-block must be at least 1 (for example 32), got 0")]
    ZeroTokensPerBlock,
    /// `--world 0`.
    #[error("--world must be at least 1 (use --replicated for replicated pages), got 0")]
    ZeroWorld,
    /// `--rank` is not below `--world`.
    #[error("--rank {rank} must be below --world {world}; use a rank from 0 to {last}", last = world - 1)]
    RankOutOfRange {
        /// The `--world` value.
        world: u32,
        /// The `--rank` value.
        rank: u32,
    },
    /// A `--media-digest` is not 64 characters long.
    #[error("--media-digest takes 64 hex digits (32 bytes), got {len} characters")]
    MediaDigestLength {
        /// Length of the value, in bytes.
        len: usize,
    },
    /// A `--media-digest` holds a character that is not a hex digit.
    #[error("--media-digest: character {position} is not a hex digit")]
    MediaDigestDigit {
        /// Zero-based position of the bad character.
        position: usize,
    },
    /// The token file or stdin could not be read.
    #[error("cannot read token ids from {input}")]
    ReadInput {
        /// The file path, or `stdin`.
        input: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A whitespace-separated token is not a 64-bit signed integer.
    #[error("line {line} of the token ids: {word:?} is not a token id (a 64-bit signed integer)")]
    BadToken {
        /// One-based line number.
        line: usize,
        /// The offending word.
        word: String,
        /// Why it did not parse.
        #[source]
        source: ParseIntError,
    },
    /// The input starts with `[` but is not a JSON array of 64-bit signed integers.
    #[error(
        "token ids at line {line}, column {column} are not a JSON array of 64-bit signed integers"
    )]
    BadJson {
        /// One-based line of the error.
        line: usize,
        /// One-based column of the error.
        column: usize,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// Hashing failed.
    #[error("hashing the token ids failed")]
    Hash(#[from] HashError),
    /// A key field the runtime would refuse.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The input holds fewer tokens than one block.
    #[error(
        "no full block: {tokens} token ids are fewer than one block of {tokens_per_block} \
         (--tokens-per-block); only full blocks have keys"
    )]
    NoFullBlock {
        /// Token ids read.
        tokens: usize,
        /// The `--tokens-per-block` value.
        tokens_per_block: usize,
    },
    /// The output could not be written.
    #[error("cannot write the output")]
    Write(#[source] io::Error),
}

impl KeysError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ZeroTokensPerBlock => "zero_tokens_per_block",
            Self::ZeroWorld => "zero_world",
            Self::RankOutOfRange { .. } => "rank_out_of_range",
            Self::MediaDigestLength { .. } => "media_digest_length",
            Self::MediaDigestDigit { .. } => "media_digest_digit",
            Self::ReadInput { .. } => "read_input",
            Self::BadToken { .. } => "bad_token",
            Self::BadJson { .. } => "bad_json",
            Self::Hash(err) => err.kind(),
            Self::Key(err) => err.kind(),
            Self::NoFullBlock { .. } => "no_full_block",
            Self::Write(_) => "write",
        }
    }
}

impl KeysArgs {
    /// The shard the keys are for, after checking `--world` and `--rank`.
    fn shard(&self) -> Result<Shard, KeysError> {
        if self.replicated {
            return Ok(Shard::Replicated);
        }
        if self.world == 0 {
            return Err(KeysError::ZeroWorld);
        }
        if self.rank >= self.world {
            return Err(KeysError::RankOutOfRange {
                world: self.world,
                rank: self.rank,
            });
        }
        Ok(Shard::Rank {
            world: self.world,
            rank: self.rank,
        })
    }

    /// The scope the chain is seeded from.
    fn scope(&self) -> Scope {
        Scope {
            salt: self.salt.clone(),
            lora: self.lora,
            media: self.media_digests.clone(),
        }
    }
}

/// Runs `kv-connector keys`: reads token ids from the file argument (or `stdin`), writes
/// the hashes and keys to `output`.
///
/// # Errors
///
/// A [`KeysError`] naming the bad flag, the unreadable input, the line of a bad token id, or
/// the failed write. Flags are checked before any input is read.
pub fn run(args: &KeysArgs, stdin: impl Read, output: impl Write) -> Result<(), KeysError> {
    let shard = args.shard()?;
    if args.tokens_per_block == 0 {
        return Err(KeysError::ZeroTokensPerBlock);
    }
    let text = read_input(args.input.as_deref(), stdin)?;
    let tokens = parse_tokens(&text)?;
    let hashes = hash_blocks(scope_seed(&args.scope()), &tokens, args.tokens_per_block)?;
    if hashes.is_empty() {
        return Err(KeysError::NoFullBlock {
            tokens: tokens.len(),
            tokens_per_block: args.tokens_per_block,
        });
    }
    let columns = args
        .groups
        .iter()
        .map(|&group| {
            let spec = KeySpec {
                namespace: &args.namespace,
                model_key: &args.model_key,
                shard,
                group: GroupId(group),
                tokens_per_block: args.tokens_per_block,
                bytes_per_page: args.bytes_per_page,
            };
            Ok(KeyColumn::with_hashes(
                KeyPrefix::validated(&spec)?,
                &hashes,
            ))
        })
        .collect::<Result<Vec<KeyColumn>, KeyError>>()?;
    tracing::debug!(
        tokens = tokens.len(),
        blocks = hashes.len(),
        groups = columns.len(),
        "keys built"
    );
    let mut output = BufWriter::new(output);
    let written = if args.json {
        write_json(&mut output, &hashes, &columns)
    } else {
        write_text(&mut output, &hashes, &columns)
    };
    written
        .and_then(|()| output.flush())
        .map_err(KeysError::Write)
}

/// Reads token ids from the file at `path` (or `stdin` when there is none or it is `-`):
/// a JSON array of integers, or integers separated by whitespace. Shared with `inspect`.
///
/// # Errors
///
/// [`KeysError::ReadInput`], [`KeysError::BadToken`] or [`KeysError::BadJson`].
pub(crate) fn read_token_file(
    path: Option<&Path>,
    stdin: impl Read,
) -> Result<Vec<i64>, KeysError> {
    parse_tokens(&read_input(path, stdin)?)
}

/// Reads the whole input: the file at `path`, or `stdin` when there is none or it is `-`.
fn read_input(path: Option<&Path>, stdin: impl Read) -> Result<String, KeysError> {
    let mut text = String::new();
    let (input, read) = match path {
        Some(path) if path != Path::new("-") => (
            path.display().to_string(),
            File::open(path).and_then(|mut file| file.read_to_string(&mut text)),
        ),
        _ => ("stdin".to_owned(), { stdin }.read_to_string(&mut text)),
    };
    read.map_err(|source| KeysError::ReadInput { input, source })?;
    Ok(text)
}

/// Parses a JSON array (input starting with `[`) or whitespace-separated integers.
fn parse_tokens(text: &str) -> Result<Vec<i64>, KeysError> {
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(text).map_err(|source| KeysError::BadJson {
            line: source.line(),
            column: source.column(),
            source,
        });
    }
    let mut tokens = Vec::new();
    for (index, line) in text.lines().enumerate() {
        for word in line.split_whitespace() {
            let token = word.parse().map_err(|source| KeysError::BadToken {
                line: index + 1,
                word: word.to_owned(),
                source,
            })?;
            tokens.push(token);
        }
    }
    Ok(tokens)
}

/// Parses a `--media-digest` value: 64 hex digits.
fn parse_media_digest(text: &str) -> Result<[u8; 32], KeysError> {
    if text.len() != 64 {
        return Err(KeysError::MediaDigestLength { len: text.len() });
    }
    if let Some(position) = text.bytes().position(|byte| !byte.is_ascii_hexdigit()) {
        return Err(KeysError::MediaDigestDigit { position });
    }
    // 64 ASCII hex digits: both halves are 32-digit hashes.
    let mut digest = [0u8; 32];
    for (slot, half) in digest.chunks_exact_mut(16).zip([&text[..32], &text[32..]]) {
        let hash = BlockHash::from_hex(half)
            .map_err(|_| KeysError::MediaDigestLength { len: text.len() })?;
        slot.copy_from_slice(&hash.0);
    }
    Ok(digest)
}

/// One line per block: `block<TAB>hash<TAB>key...`, keys in `--group` order.
fn write_text(out: &mut impl Write, hashes: &[BlockHash], columns: &[KeyColumn]) -> io::Result<()> {
    let mut keys: Vec<_> = columns.iter().map(KeyColumn::iter).collect();
    for (block, hash) in hashes.iter().enumerate() {
        write!(out, "{block}\t{hash}")?;
        for key in keys.iter_mut().filter_map(Iterator::next) {
            write!(out, "\t{key}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// One row of the `--json` output.
#[derive(serde::Serialize)]
struct BlockRow<'a> {
    /// Block index.
    block: usize,
    /// Chain hash, 32 hex digits.
    hash: String,
    /// One key per `--group`, in the order given.
    keys: Vec<&'a str>,
}

/// One JSON array holding a [`BlockRow`] per block, streamed row by row.
fn write_json(out: &mut impl Write, hashes: &[BlockHash], columns: &[KeyColumn]) -> io::Result<()> {
    let mut keys: Vec<_> = columns.iter().map(KeyColumn::iter).collect();
    out.write_all(b"[")?;
    for (block, hash) in hashes.iter().enumerate() {
        if block > 0 {
            out.write_all(b",")?;
        }
        let row = BlockRow {
            block,
            hash: hash.to_hex(),
            keys: keys.iter_mut().filter_map(Iterator::next).collect(),
        };
        serde_json::to_writer(&mut *out, &row)?;
    }
    out.write_all(b"]\n")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// The reference's `empty_scope_two_blocks` hashes.
    const H0: &str = "2cbd989e68a1d62fe8bebc04262e3dd9";
    const H1: &str = "2a4fd6d9610279f6733a044d56664a9d";

    fn args(extra: &[&str]) -> Result<KeysArgs, clap::Error> {
        let base = [
            "kv-connector",
            "keys",
            "--namespace",
            "ns",
            "--model-key",
            "model-a",
        ];
        let cli = Cli::try_parse_from(base.iter().chain(extra))?;
        if let Command::Keys(args) = cli.command {
            Ok(args)
        } else {
            Err(clap::Error::new(clap::error::ErrorKind::InvalidSubcommand))
        }
    }

    fn run_on(args: &KeysArgs, input: &str) -> Result<String, Box<dyn std::error::Error>> {
        let mut out = Vec::new();
        run(args, input.as_bytes(), &mut out)?;
        Ok(String::from_utf8(out)?)
    }

    /// A reader that fails the test if anything reads it.
    struct MustNotRead;

    impl Read for MustNotRead {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other(
                "flags must be checked before input is read",
            ))
        }
    }

    fn error_of(args: &KeysArgs) -> Option<KeysError> {
        run(args, MustNotRead, Vec::new()).err()
    }

    #[test]
    fn r3_text_output_has_block_hash_and_keys_in_group_order() -> TestResult {
        let flags = [
            "-t",
            "4",
            "--world",
            "2",
            "--rank",
            "1",
            "--bytes-per-page",
            "4096",
        ];
        let args = args(&[&flags[..], &["--group", "3", "--group", "0"]].concat())?;
        let text = run_on(&args, "0 1 2 3\n4 5 6 7 8 9\n")?;
        let expected = format!(
            "0\t{H0}\tns/model-a/w2r1/lg3/t4b4096/{H0}\tns/model-a/w2r1/lg0/t4b4096/{H0}\n\
             1\t{H1}\tns/model-a/w2r1/lg3/t4b4096/{H1}\tns/model-a/w2r1/lg0/t4b4096/{H1}\n"
        );
        assert_eq!(text, expected);
        Ok(())
    }

    #[test]
    fn r3_json_output_is_one_array_of_rows() -> TestResult {
        let args = args(&[
            "-t",
            "4",
            "--replicated",
            "--group",
            "1",
            "--bytes-per-page",
            "512",
            "--json",
        ])?;
        let text = run_on(&args, " [0, 1, 2, 3, 4, 5, 6, 7, 8]")?;
        let value: serde_json::Value = serde_json::from_str(&text)?;
        let expected = serde_json::json!([
            {"block": 0, "hash": H0, "keys": [format!("ns/model-a/replicated/lg1/t4b512/{H0}")]},
            {"block": 1, "hash": H1, "keys": [format!("ns/model-a/replicated/lg1/t4b512/{H1}")]},
        ]);
        assert_eq!(value, expected);
        assert!(text.ends_with("]\n"));
        Ok(())
    }

    #[test]
    fn r1_no_full_block_is_an_error_that_says_so() -> TestResult {
        for (flags, input) in [
            (&["--bytes-per-page", "1"][..], "1 2 3"),
            (&["--bytes-per-page", "1", "--json"][..], ""),
        ] {
            let err = run(&args(flags)?, input.as_bytes(), Vec::new()).err();
            assert!(
                matches!(err, Some(KeysError::NoFullBlock { .. })),
                "{err:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn r1_scope_flags_change_the_hashes_like_the_reference() -> TestResult {
        let args = args(&[
            "-t",
            "4",
            "--bytes-per-page",
            "1",
            "--salt",
            "tenant-a",
            "--lora",
            "7",
        ])?;
        let text = run_on(&args, "0 1 2 3 4 5 6 7")?;
        assert!(
            text.starts_with("0\tb1a17fcc43302ab932e8ebf6d36b0347\t"),
            "{text}"
        );
        let digest = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
        let media = args_with_media(digest)?;
        let text = run_on(&media, "0 1 2 3")?;
        assert!(
            text.starts_with("0\t98fcc5dd0173647898d62d546926acc0\t"),
            "{text}"
        );
        Ok(())
    }

    fn args_with_media(digest: &str) -> Result<KeysArgs, clap::Error> {
        args(&["-t", "4", "--bytes-per-page", "1", "--media-digest", digest])
    }

    #[test]
    fn bad_flags_are_refused_before_reading_input() -> TestResult {
        let zero_t = args(&["-t", "0", "--bytes-per-page", "1"])?;
        assert!(matches!(
            error_of(&zero_t),
            Some(KeysError::ZeroTokensPerBlock)
        ));
        let rank = args(&["--world", "2", "--rank", "2", "--bytes-per-page", "1"])?;
        let err = error_of(&rank);
        assert_eq!(err.as_ref().map(KeysError::kind), Some("rank_out_of_range"));
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some("--rank 2 must be below --world 2; use a rank from 0 to 1")
        );
        let world = args(&["--world", "0", "--bytes-per-page", "1"])?;
        assert!(matches!(error_of(&world), Some(KeysError::ZeroWorld)));
        Ok(())
    }

    #[test]
    fn clap_refuses_rank_with_replicated_and_bad_digests() {
        let conflict = args(&["--replicated", "--rank", "1", "--bytes-per-page", "1"]);
        assert_eq!(
            conflict.err().map(|e| e.kind()),
            Some(clap::error::ErrorKind::ArgumentConflict)
        );
        assert!(args_with_media("00").is_err());
        let hyphens = args(&["--salt", "-h", "--bytes-per-page", "1"]);
        assert_eq!(hyphens.ok().and_then(|a| a.salt).as_deref(), Some("-h"));
        assert!(matches!(
            parse_media_digest(&"0".repeat(63)),
            Err(KeysError::MediaDigestLength { len: 63 })
        ));
        let bad = format!("{}é{}", "0".repeat(30), "0".repeat(32));
        assert!(matches!(
            parse_media_digest(&bad),
            Err(KeysError::MediaDigestDigit { position: 30 })
        ));
    }

    #[test]
    fn bad_tokens_name_their_line() -> TestResult {
        let args = args(&["--bytes-per-page", "1"])?;
        let err = run(&args, "1 2\n3 x4\n".as_bytes(), Vec::new()).err();
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some("line 2 of the token ids: \"x4\" is not a token id (a 64-bit signed integer)")
        );
        let too_big = run(&args, "9223372036854775808".as_bytes(), Vec::new()).err();
        assert_eq!(too_big.as_ref().map(KeysError::kind), Some("bad_token"));
        let json = run(&args, "[1,\n2.5]".as_bytes(), Vec::new()).err();
        assert!(
            matches!(json, Some(KeysError::BadJson { line: 2, .. })),
            "{json:?}"
        );
        Ok(())
    }

    #[test]
    fn input_file_is_read_and_missing_file_is_named() -> TestResult {
        let path = std::env::temp_dir().join(format!("kvc-keys-test-{}.txt", std::process::id()));
        std::fs::write(&path, "0 1 2 3 4 5 6 7")?;
        let path_text = path.display().to_string();
        let from_file = args(&["-t", "4", "--bytes-per-page", "1", &path_text])?;
        let mut out = Vec::new();
        let result = run(&from_file, MustNotRead, &mut out);
        std::fs::remove_file(&path)?;
        result?;
        assert_eq!(String::from_utf8(out)?.lines().count(), 2);
        let missing = args(&["--bytes-per-page", "1", "/nonexistent/kvc-tokens"])?;
        let err = run(&missing, MustNotRead, Vec::new()).err();
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some("cannot read token ids from /nonexistent/kvc-tokens")
        );
        let dash = args(&["-t", "4", "--bytes-per-page", "1", "-"])?;
        assert_eq!(run_on(&dash, "0 1 2 3")?.lines().count(), 1);
        Ok(())
    }
}
