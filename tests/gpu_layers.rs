//! The floors of `src/gpu` point one way (`gpu::L1`-L3, `backend::F2`, `vocab::W1`/W2 in
//! the module docs of `src/gpu`):
//!
//! - a file of `src/gpu/vocab/` (the vocabulary) imports, of the crate, only `core` and
//!   `gpu::vocab`, and holds no `unsafe`;
//! - a file of `src/gpu/backend/` imports only `core`, `gpu::vocab` and `gpu::backend`, and
//!   inside it `cuda/` and `host.rs` import neither each other nor `host_memory/`;
//! - the front (the other files of `src/gpu`) imports any floor; no file of `src/gpu`
//!   imports a module of the crate other than `core` and `gpu`.
//!
//! The scanner reads each source file, drops comments, strings and character literals,
//! and resolves every path that starts with `crate`, `super` or `self`, in `use` trees
//! (groups included) and inline (`super::cuda::probe()`), from the module the file (and
//! any inline `mod` around the path) declares. A root re-export (`crate::gpu::Device`)
//! counts as the front. The scanner tests feed it known-bad text, so a scanner that finds
//! nothing cannot pass unnoticed.

use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};

/// A floor of `src/gpu`, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Floor {
    Vocab,
    Backend,
    Front,
}

/// Where a module of `gpu` stands: its floor, and for the backends which part (`cuda`,
/// `host`, `host_memory`; `None` for `backend` itself).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    floor: Floor,
    part: Option<String>,
}

/// The place of the module path `module` (from the crate root), or `None` outside `gpu`
/// and for `gpu` itself when `root_is_front` is false.
fn place(module: &[String], root_is_front: bool) -> Option<Place> {
    if module.first().map(String::as_str) != Some("gpu") {
        return None;
    }
    let floor = match module.get(1).map(String::as_str) {
        Some("vocab") => Floor::Vocab,
        Some("backend") => Floor::Backend,
        Some(_) => Floor::Front,
        None if root_is_front => Floor::Front,
        None => return None,
    };
    let part = (floor == Floor::Backend)
        .then(|| module.get(2).cloned())
        .flatten();
    Some(Place { floor, part })
}

/// The module a source file declares, from its path under `src/`:
/// `gpu/vocab/copy.rs` is `gpu::vocab::copy`, `gpu/vocab/mod.rs` is `gpu::vocab`.
fn file_module(relative: &Path) -> Vec<String> {
    let mut out: Vec<String> = relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = out.pop() {
        let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
        if stem != "mod" {
            out.push(stem);
        }
    }
    out
}

/// `text` with comments, string literals and character literals blanked (newlines kept).
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let skip = if rest.starts_with("//") {
            rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            block_comment_len(rest)
        } else if let Some(len) = raw_string_len(rest) {
            len
        } else if rest.starts_with('"') || rest.starts_with("b\"") {
            quoted_len(rest, b'"')
        } else if rest.starts_with('\'') {
            char_literal_len(rest)
        } else {
            0
        };
        if skip == 0 {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        } else {
            out.extend(
                rest[..skip]
                    .chars()
                    .map(|c| if c == '\n' { '\n' } else { ' ' }),
            );
            i += skip;
        }
    }
    out
}

/// Length of the (possibly nested) block comment `text` starts with.
fn block_comment_len(text: &str) -> usize {
    let mut depth = 0_usize;
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with("/*") {
            depth += 1;
            i += 2;
        } else if text[i..].starts_with("*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    text.len()
}

/// Length of the raw string (`r"..."`, `r#"..."#`, `br"..."`) `text` starts with, if any.
fn raw_string_len(text: &str) -> Option<usize> {
    let after_prefix = text.strip_prefix("br").or_else(|| text.strip_prefix('r'))?;
    let hashes = after_prefix.bytes().take_while(|&b| b == b'#').count();
    if after_prefix.as_bytes().get(hashes) != Some(&b'"') {
        return None;
    }
    let body_start = text.len() - after_prefix.len() + hashes + 1;
    let closing = format!("\"{}", "#".repeat(hashes));
    let end = text[body_start..]
        .find(&closing)
        .map_or(text.len(), |at| body_start + at + closing.len());
    Some(end)
}

/// Length of the quoted literal `text` starts with (after an optional `b`), escapes
/// honoured.
fn quoted_len(text: &str, quote: u8) -> usize {
    let bytes = text.as_bytes();
    let mut i = usize::from(bytes[0] == b'b') + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b if b == quote => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Length of the character literal `text` starts with, or 0 for a lifetime (`'a`).
fn char_literal_len(text: &str) -> usize {
    let mut chars = text.char_indices().skip(1);
    match chars.next() {
        Some((_, '\\')) => quoted_len(text, b'\''),
        Some((_, c)) => {
            let after = 1 + c.len_utf8();
            if text[after..].starts_with('\'') {
                after + 1
            } else {
                0
            }
        }
        None => 0,
    }
}

/// Identifiers, `::` and single punctuation characters of code.
fn tokens(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = code.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut end = start + c.len_utf8();
            while let Some(&(at, next)) = chars.peek() {
                if !(next.is_alphanumeric() || next == '_') {
                    break;
                }
                end = at + next.len_utf8();
                chars.next();
            }
            out.push(code[start..end].to_string());
        } else if c == ':' && chars.peek().map(|&(_, next)| next) == Some(':') {
            chars.next();
            out.push("::".to_string());
        } else if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    out
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The paths of the `use` tree starting at `tokens[*at]`, each a list of segments, with
/// `prefix` in front; stops after the tree (at `;`, `,` or `}` of an enclosing group). A
/// `self` inside a group stays a segment (`driver::self`), which names the same module.
fn use_tree(tokens: &[String], at: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        let Some(token) = tokens.get(*at) else {
            return;
        };
        match token.as_str() {
            "{" => {
                *at += 1;
                while tokens.get(*at).is_some_and(|t| t != "}") {
                    use_tree(tokens, at, &path, out);
                    if tokens.get(*at).is_some_and(|t| t == ",") {
                        *at += 1;
                    }
                }
                *at += 1;
                return;
            }
            "as" => *at += 2,
            ";" | "," | "}" => {
                out.push(path);
                return;
            }
            name if is_ident(name) => {
                path.push(name.to_string());
                *at += 1;
            }
            _ => {
                *at += 1;
            }
        }
    }
}

/// Resolves `path` (segments starting with `crate`, `super` or `self`) from `module`;
/// `None` for any other path (an external crate, or a child module named bare).
fn resolve(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let first = path.first()?.as_str();
    let mut out: Vec<String> = match first {
        "crate" => Vec::new(),
        "super" | "self" => module.to_vec(),
        _ => return None,
    };
    let mut rest = &path[usize::from(first == "crate" || first == "self")..];
    while rest.first().is_some_and(|s| s == "super") {
        out.pop();
        rest = &rest[1..];
    }
    out.extend(rest.iter().cloned());
    Some(out)
}

/// Every crate-relative path `code` names, resolved from `module`, as (resolved path,
/// path as written).
fn crate_paths(module: &[String], code: &str) -> Vec<(Vec<String>, String)> {
    let tokens = tokens(code);
    let mut out = Vec::new();
    // Inline modules around the current token: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0_usize;
    let mut i = 0;
    while i < tokens.len() {
        let here: Vec<String> = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(name, _)| name.clone()))
            .collect();
        match tokens[i].as_str() {
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t == "{") => {
                inline.push((tokens[i + 1].clone(), depth + 1));
                depth += 1;
                i += 3;
                continue;
            }
            "use" => {
                let mut at = i + 1;
                let mut paths = Vec::new();
                use_tree(&tokens, &mut at, &[], &mut paths);
                for path in paths {
                    if let Some(resolved) = resolve(&here, &path) {
                        out.push((resolved, path.join("::")));
                    }
                }
                i = at;
                continue;
            }
            "crate" | "super" | "self" if tokens.get(i + 1).is_some_and(|t| t == "::") => {
                let mut path = vec![tokens[i].clone()];
                let mut at = i + 1;
                while tokens.get(at).is_some_and(|t| t == "::")
                    && tokens.get(at + 1).is_some_and(|t| is_ident(t))
                {
                    path.push(tokens[at + 1].clone());
                    at += 2;
                }
                if let Some(resolved) = resolve(&here, &path) {
                    out.push((resolved, path.join("::")));
                }
                i = at;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The imports of the file `relative` (under `src/`) that break the floors' rule, as
/// `file: path (why)`.
fn violations(relative: &Path, text: &str) -> Vec<String> {
    let module = file_module(relative);
    let Some(from) = place(&module, false) else {
        return Vec::new();
    };
    let code = code_only(text);
    let mut out = Vec::new();
    let file = relative.display();
    if from.floor == Floor::Vocab && tokens(&code).iter().any(|t| t == "unsafe") {
        out.push(format!("{file}: `unsafe` in the vocabulary (vocab::W1)"));
    }
    for (resolved, written) in crate_paths(&module, &code) {
        let why = match place(&resolved, true) {
            None if resolved.first().is_some_and(|s| s != "core") => {
                Some("gpu imports nothing of the crate but core (gpu::L3)")
            }
            None => None,
            Some(to) if to.floor > from.floor => Some(match from.floor {
                Floor::Vocab => "the vocabulary imports only the vocabulary (gpu::L1)",
                _ => "a backend imports no front type (gpu::L2)",
            }),
            Some(to) => match (from.part.as_deref(), to.part.as_deref()) {
                (Some(a @ ("cuda" | "host")), Some(b)) if a != b => {
                    Some("cuda and host import neither each other nor host_memory (backend::F2)")
                }
                _ => None,
            },
        };
        if let Some(why) = why {
            out.push(format!("{file}: {written} ({why})"));
        }
    }
    out
}

fn src_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `src/gpu`, relative to `src/`, sorted.
fn gpu_sources() -> Result<Vec<PathBuf>, Box<dyn Error>> {
    let mut out = Vec::new();
    let mut stack = vec![src_root().join("gpu")];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                out.push(path.strip_prefix(src_root())?.to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

#[test]
fn gpu_floors_import_only_downwards() -> Result<(), Box<dyn Error>> {
    let mut broken = Vec::new();
    let mut floors_seen = [0_usize; 3];
    let mut imports_seen = 0;
    for relative in gpu_sources()? {
        let text = fs::read_to_string(src_root().join(&relative))?;
        let module = file_module(&relative);
        if let Some(from) = place(&module, false) {
            floors_seen[from.floor as usize] += 1;
            imports_seen += crate_paths(&module, &code_only(&text)).len();
        }
        broken.extend(violations(&relative, &text));
    }
    assert!(
        floors_seen.iter().all(|&files| files >= 3),
        "each floor has files: {floors_seen:?} (vocab, backend, front)"
    );
    assert!(imports_seen > 100, "the scanner found {imports_seen} paths");
    assert!(
        broken.is_empty(),
        "imports against the floors of src/gpu:\n{}",
        broken.join("\n")
    );
    Ok(())
}

#[test]
fn the_cuda_queue_knows_no_device() {
    let relative = Path::new("gpu/backend/cuda/queue.rs");
    let text = fs::read_to_string(src_root().join(relative)).expect("the cuda queue");
    let module = file_module(relative);
    let paths = crate_paths(&module, &code_only(&text));
    assert!(!paths.is_empty(), "the queue imports the vocabulary");
    for (resolved, written) in paths {
        let to = place(&resolved, true).map(|place| place.floor);
        assert!(
            matches!(to, Some(Floor::Vocab | Floor::Backend)),
            "queue.rs names {written}"
        );
    }
}

#[test]
fn the_scanner_finds_upward_imports() {
    let check = |file: &str, text: &str| violations(Path::new(file), text);
    // A `use` of the front from the vocabulary, plain and in a group.
    assert_eq!(
        check("gpu/vocab/copy.rs", "use crate::gpu::device::Device;").len(),
        1
    );
    assert_eq!(
        check(
            "gpu/vocab/pages.rs",
            "use crate::gpu::{vocab::GpuError, stream::{CopyStream, StreamId}};"
        )
        .len(),
        2
    );
    // The vocabulary may not name a backend, nor a root re-export.
    assert_eq!(
        check("gpu/vocab/error.rs", "use super::super::backend::cuda;").len(),
        1
    );
    assert_eq!(
        check(
            "gpu/vocab/error.rs",
            "fn f() { crate::gpu::Device::open_host(&[]); }"
        )
        .len(),
        1
    );
    // A backend naming the front, inline and through `super`.
    assert_eq!(
        check(
            "gpu/backend/cuda/queue.rs",
            "struct P { device: crate::gpu::device::Device }"
        )
        .len(),
        1
    );
    assert_eq!(
        check("gpu/backend/host.rs", "use super::super::stream::StreamId;").len(),
        1
    );
    // Inside the backends: cuda and host stay apart from each other and from host_memory.
    assert_eq!(
        check(
            "gpu/backend/cuda/mod.rs",
            "use super::host_memory::HostArena;"
        )
        .len(),
        1
    );
    assert_eq!(
        check("gpu/backend/host.rs", "use super::cuda::PinnedBuffer;").len(),
        1
    );
    // Nothing of gpu imports the crate above core.
    assert_eq!(
        check("gpu/device.rs", "use crate::pool::PoolError;").len(),
        1
    );
    // No unsafe in the vocabulary.
    assert_eq!(check("gpu/vocab/copy.rs", "fn f() { unsafe {} }").len(), 1);
}

#[test]
fn the_scanner_lets_allowed_imports_pass() {
    let check = |file: &str, text: &str| violations(Path::new(file), text);
    let allowed = [
        // Downwards, and inside one floor.
        (
            "gpu/device.rs",
            "use super::backend::cuda::CudaDevice; use super::vocab::*;",
        ),
        (
            "gpu/backend/host_memory/mod.rs",
            "use crate::gpu::backend::cuda::Context;",
        ),
        (
            "gpu/backend/cuda/queue.rs",
            "use super::driver::{self, RawEvent};",
        ),
        (
            "gpu/vocab/copy.rs",
            "use super::pages::PageGeometry; use crate::core::layout::GroupId;",
        ),
        // `super` from an inline module resolves from that module.
        (
            "gpu/vocab/copy.rs",
            "mod tests { use super::super::pages::PagePoolSpec; }",
        ),
        // Comments and strings name nothing.
        (
            "gpu/vocab/copy.rs",
            "// crate::gpu::device::Device\nconst S: &str = \"crate::gpu::Device\";",
        ),
        (
            "gpu/vocab/copy.rs",
            "/* use crate::gpu::device; */ const R: &str = r#\"crate::gpu::x\"#;",
        ),
        // `pub(super)` and external crates are no paths of the crate.
        (
            "gpu/vocab/copy.rs",
            "pub(super) fn f<'a>(x: &'a str) -> char { let _ = x; 'a' }",
        ),
        (
            "gpu/backend/cuda/driver.rs",
            "use cudarc::driver::sys; use std::fmt;",
        ),
    ];
    for (file, text) in allowed {
        assert_eq!(check(file, text), Vec::<String>::new(), "{file}: {text}");
    }
}
