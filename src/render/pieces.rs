//! The token ids of a prompt's pieces, kept, so that a conversation's next
//! turn tokenizes only what is new. The pieces are the text between the
//! tokenizer's added tokens (the special tokens a chat template puts
//! between messages): the tokenizer itself splits there first and tokenizes
//! each piece on its own, so a piece's ids do not depend on what is around
//! it, and a prompt's ids are its pieces' ids and the added tokens', in
//! order. That holds where the tokenizer does nothing that depends on a
//! piece's place in the text: no normalizer but NFC (composition does not
//! cross an added token), no Metaspace that marks only the text's start
//! ([`splits_apart`]). Tested against whole encoding in `tests.rs`.
//!
//! Memory: two generations of pieces by their text's hash; when the
//! current one holds `budget / 2` ids it becomes the previous one, and a
//! piece found in the previous one comes back to the current: the pieces
//! of recent conversations stay, the rest go, at most `budget` ids (4
//! bytes each) and one map entry per piece.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::metaspace::PrependScheme;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::Tokenizer;
use xxhash_rust::xxh3::xxh3_64;

use super::encoder::{Encoder, Piece};

/// Token ids kept at most, over both generations: 16 MiB.
const BUDGET: usize = 4 << 20;

pub(super) struct Pieces {
    inner: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    current: HashMap<u64, Arc<[u32]>>,
    previous: HashMap<u64, Arc<[u32]>>,
    /// Ids in `current`.
    held: usize,
}

/// Whether `tokenizer` tokenizes the text between its added tokens
/// independently of where that text stands.
pub(super) fn splits_apart(tokenizer: &Tokenizer) -> bool {
    let normalizer = match tokenizer.get_normalizer() {
        None | Some(NormalizerWrapper::NFC(_)) => true,
        Some(_) => false,
    };
    normalizer && tokenizer.get_pre_tokenizer().is_none_or(local)
}

fn local(p: &PreTokenizerWrapper) -> bool {
    match p {
        PreTokenizerWrapper::Metaspace(m) => m.get_prepend_scheme() != PrependScheme::First,
        PreTokenizerWrapper::Sequence(s) => s.as_ref().iter().all(local),
        _ => true,
    }
}

impl Pieces {
    pub fn new() -> Self {
        Pieces {
            inner: Mutex::default(),
        }
    }

    /// `text` cut at its added tokens, with the ids of the pieces the store
    /// holds; `None` if it is one piece (nothing to keep apart).
    pub fn split(&self, encoder: &Encoder, text: &str) -> Option<Split> {
        let pieces = encoder.split(text);
        if pieces.len() < 2 {
            return None;
        }
        let mut split = Split {
            parts: Vec::with_capacity(pieces.len()),
            new_bytes: 0,
        };
        let mut store = self.inner.lock().unwrap();
        for piece in pieces {
            split.parts.push(match piece {
                Piece::Added(tokens) => Part::Added(tokens),
                Piece::Text(text) => {
                    let key = xxh3_64(text.as_bytes());
                    match store.get(key) {
                        Some(ids) => Part::Kept(ids),
                        None => {
                            split.new_bytes += text.len();
                            Part::New(key, text.into_owned())
                        }
                    }
                }
            });
        }
        Some(split)
    }

    /// The ids of `split`, its new pieces tokenized and kept; `None` if one
    /// does not encode.
    pub fn finish(&self, encoder: &Encoder, split: Split) -> Option<Vec<u32>> {
        let mut ids = Vec::new();
        for part in split.parts {
            match part {
                Part::Added(tokens) => ids.extend(tokens),
                Part::Kept(kept) => ids.extend_from_slice(&kept),
                Part::New(key, text) => {
                    // Kept since the split (an earlier piece of the same
                    // text, another thread's prompt).
                    let kept = self.inner.lock().unwrap().get(key);
                    let new = match kept {
                        Some(k) => k,
                        None => {
                            let new: Arc<[u32]> = encoder.encode_piece(&text)?.into();
                            self.inner.lock().unwrap().put(key, new.clone());
                            new
                        }
                    };
                    ids.extend_from_slice(&new);
                }
            }
        }
        Some(ids)
    }
}

/// A prompt's text cut at its added tokens: what the store had, and the
/// new text still to tokenize, owned, so that another thread can.
pub(super) struct Split {
    parts: Vec<Part>,
    new_bytes: usize,
}

enum Part {
    Added(Vec<u32>),
    Kept(Arc<[u32]>),
    New(u64, String),
}

impl Split {
    /// Bytes of text not in the store: what tokenizing it costs.
    pub fn new_bytes(&self) -> usize {
        self.new_bytes
    }
}

impl Generations {
    fn get(&mut self, key: u64) -> Option<Arc<[u32]>> {
        if let Some(ids) = self.current.get(&key) {
            return Some(ids.clone());
        }
        let ids = self.previous.remove(&key)?;
        self.put(key, ids.clone());
        Some(ids)
    }

    fn put(&mut self, key: u64, ids: Arc<[u32]>) {
        if ids.len() > BUDGET / 4 {
            return;
        }
        if self.held + ids.len() > BUDGET / 2 {
            self.previous = std::mem::take(&mut self.current);
            self.held = 0;
        }
        self.held += ids.len();
        self.current.insert(key, ids);
    }
}
