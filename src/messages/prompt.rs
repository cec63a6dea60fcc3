//! A lookup's prompt: its tokens, or a reader that yields them on the planner's thread.
//!
//! An engine whose prompts are objects of its own language (Python lists of ints) pays
//! for reading them on its scheduler thread: tens of nanoseconds a token, over 2 ms for a
//! 128k-token prompt. It can instead hand over a [`Prompt::read_later`] made of a private
//! snapshot of the prompt (which no one else can change) and a reader; the lookup then
//! reads it on the planner's blocking thread, where it hashes it anyway.
//!
//! Invariants:
//!
//! - `prompt::P1`. A prompt is read at most once, whoever asks (the reader runs once; its
//!   answer is kept, and clones share it).
//! - `prompt::P2`. A prompt that cannot be read ends its lookup with nothing offered and
//!   nothing hashed, so nothing of its request is saved: no page is ever keyed by tokens
//!   that were not read.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// Reads a deferred prompt; an error says why it cannot (for the log).
type Reader = Box<dyn FnOnce() -> Result<Arc<[i64]>, String> + Send>;

/// A deferred prompt: its reader until it ran, then its answer (`prompt::P1`).
struct Deferred {
    reader: Mutex<Option<Reader>>,
    read: OnceLock<Result<Arc<[i64]>, String>>,
}

/// A lookup's prompt (module docs).
#[derive(Clone)]
pub enum Prompt {
    /// The tokens themselves.
    Tokens(Arc<[i64]>),
    /// Tokens read when the lookup runs.
    Later(Arc<DeferredPrompt>),
}

/// A prompt to be read when its lookup runs.
pub struct DeferredPrompt(Deferred);

impl Prompt {
    /// A prompt read by `reader` when its lookup runs, on the planner's thread; the reader
    /// must own what it reads (a snapshot no one else changes).
    pub fn read_later(
        reader: impl FnOnce() -> Result<Arc<[i64]>, String> + Send + 'static,
    ) -> Self {
        Prompt::Later(Arc::new(DeferredPrompt(Deferred {
            reader: Mutex::new(Some(Box::new(reader))),
            read: OnceLock::new(),
        })))
    }

    /// The tokens; reads a deferred prompt the first time (`prompt::P1`).
    ///
    /// # Errors
    /// Why a deferred prompt could not be read (`prompt::P2`).
    pub fn tokens(&self) -> Result<Arc<[i64]>, String> {
        match self {
            Prompt::Tokens(tokens) => Ok(Arc::clone(tokens)),
            Prompt::Later(deferred) => deferred
                .0
                .read
                .get_or_init(|| {
                    let reader = deferred
                        .0
                        .reader
                        .lock()
                        .ok()
                        .and_then(|mut reader| reader.take());
                    reader.map_or_else(|| Err("the prompt's reader already ran".into()), |read| read())
                })
                .clone(),
        }
    }
}

impl From<Arc<[i64]>> for Prompt {
    fn from(tokens: Arc<[i64]>) -> Self {
        Prompt::Tokens(tokens)
    }
}

impl fmt::Debug for Prompt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Prompt::Tokens(tokens) => write!(f, "Prompt::Tokens({} tokens)", tokens.len()),
            Prompt::Later(deferred) => match deferred.0.read.get() {
                Some(Ok(tokens)) => write!(f, "Prompt::Later({} tokens)", tokens.len()),
                Some(Err(why)) => write!(f, "Prompt::Later(unreadable: {why})"),
                None => f.write_str("Prompt::Later(not read yet)"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// `prompt::P1`: clones share one reading.
    #[test]
    fn a_deferred_prompt_is_read_once() {
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let prompt = Prompt::read_later(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::from(vec![1, 2, 3]))
        });
        let copy = prompt.clone();
        assert_eq!(prompt.tokens().ok().as_deref(), Some(&[1, 2, 3][..]));
        assert_eq!(copy.tokens().ok().as_deref(), Some(&[1, 2, 3][..]));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    /// `prompt::P2`: an unreadable prompt stays unreadable.
    #[test]
    fn an_unreadable_prompt_says_why() {
        let prompt = Prompt::read_later(|| Err("item 3 is not an int".into()));
        assert_eq!(prompt.tokens().err().as_deref(), Some("item 3 is not an int"));
        assert!(prompt.tokens().is_err());
    }
}
