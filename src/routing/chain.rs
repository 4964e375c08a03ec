//! A request's prompt as a chain of blocks, the unit of the prefix index
//! (`index.rs`): the gateway's own stand-in for vLLM's chained KV blocks,
//! read off the body without rendering it.
//!
//! ```text
//! the stream: the raw JSON text, as sent, of
//!   chat (/v1/chat/completions):  tools ‖ 0x1E ‖ messages
//!   Messages (/v1/messages):      tools ‖ 0x1E ‖ system ‖ 0x1E ‖ messages
//!   Responses (/v1/responses):    tools ‖ 0x1E ‖ instructions ‖ 0x1E ‖ input
//!   completions (/v1/completions): prompt
//!   (a field absent: empty)
//! block i = bytes [i*256, (i+1)*256) of the stream; a last partial block is not one
//! h_i = xxh3_64_with_seed(xxh3_64(block i) as 8 bytes little-endian, h_(i-1)), h_(-1) = 0
//! ```
//!
//! (Each block is hashed with xxh3's default secret: a seeded hash of more
//! than 240 bytes derives a secret of its own first, which cost more than
//! the hash.)
//!
//! A later turn of a conversation resends the earlier messages byte for
//! byte (clients serialise the history they keep the same way every time),
//! so its chain starts with the earlier turn's: the blocks it shares with a
//! backend's are the prompt that backend should still hold. The chain of
//! two bodies that differ in form (whitespace, key order, another API)
//! differs from the first difference on: the index then under-counts, never
//! over-counts. A block stands for [`BLOCK_TOKENS`] tokens, English text's
//! usual four bytes a token.

use serde_json::value::RawValue;
use smallvec::{smallvec, SmallVec};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::api::{Api, Conversation};
use crate::body::{self, Prompt};

/// Bytes of the stream per block.
pub const BLOCK_BYTES: usize = 256;

/// The prompt tokens a block stands for (four bytes a token).
pub const BLOCK_TOKENS: u64 = (BLOCK_BYTES / 4) as u64;

/// The chained hashes of a body's full blocks; empty for a body without a
/// prompt (another API, no messages, not JSON).
pub fn of(api: Api, body: &[u8]) -> Vec<u64> {
    of_prompt(api, &body::prompt_of(body))
}

/// The chain of a prompt's fields, read from the body already
/// (`body::inspect`).
pub fn of_prompt(api: Api, p: &Prompt) -> Vec<u64> {
    stream(&parts(api, p))
}

/// The prompt tokens of a prompt's fields, at four bytes a token: what
/// admission expects the backend to prefill before it knows better.
pub fn prompt_tokens(api: Api, p: &Prompt) -> u64 {
    let bytes: usize = parts(api, p).iter().flatten().map(|f| f.get().len()).sum();
    (bytes / 4) as u64
}

/// The fields the stream is made of, in order; none for another API.
fn parts<'a>(api: Api, p: &Prompt<'a>) -> SmallVec<[Option<&'a RawValue>; 3]> {
    match api.describe().conversation {
        Some(Conversation::Messages {
            system: Some(system),
            messages,
        }) => smallvec![p.tools, p.field(system), p.field(messages)],
        Some(Conversation::Messages {
            system: None,
            messages,
        }) => smallvec![p.tools, p.field(messages)],
        Some(Conversation::Text) => smallvec![p.prompt],
        None => SmallVec::new(),
    }
}

/// The chain of a prompt's token ids, `block` of them a block (vLLM's
/// `--block-size`): the index's name for each of vLLM's KV blocks.
///
/// ```text
/// h_i = xxh3_64_with_seed(xxh3_64(ids of block i, each 4 bytes little-endian) as 8 bytes LE, h_(i-1)), h_(-1) = 0
/// ```
pub fn of_tokens(tokens: &[u32], block: usize) -> Vec<u64> {
    let mut chain = Vec::with_capacity(tokens.len() / block.max(1));
    let mut parent = 0;
    for ids in tokens.chunks_exact(block.max(1)) {
        parent = token_link(parent, ids);
        chain.push(parent);
    }
    chain
}

/// The link of the block of token ids `ids` after `parent`.
pub fn token_link(parent: u64, ids: &[u32]) -> u64 {
    let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&xxh3_64(&bytes).to_le_bytes(), parent)
}

/// Make `chain` the chain of model or adapter `name`: no block of another
/// name's chain matches one of it.
pub fn namespace(chain: &mut [u64], name: &str) {
    let seed = namespace_of(name);
    for link in chain {
        *link ^= seed;
    }
}

/// What [`namespace`] mixes into each link of `name`'s chain.
pub fn namespace_of(name: &str) -> u64 {
    xxh3_64(name.as_bytes())
}

/// The chain of `parts`, separated; none without the last part, the prompt
/// proper.
fn stream(parts: &[Option<&RawValue>]) -> Vec<u64> {
    if parts.last().is_none_or(|p| p.is_none()) {
        return Vec::new();
    }
    let len: usize = parts.iter().flatten().map(|p| p.get().len() + 1).sum();
    let mut chain = Chainer {
        blocks: Vec::with_capacity(len / BLOCK_BYTES),
        partial: [0; BLOCK_BYTES],
        filled: 0,
    };
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            chain.push(&[0x1e]);
        }
        chain.push(part.map_or(&[][..], |p| p.get().as_bytes()));
    }
    chain.blocks
}

/// Cuts a stream fed in parts into chained blocks.
struct Chainer {
    blocks: Vec<u64>,
    /// A block begun by one part and ended by the next: `filled` bytes.
    partial: [u8; BLOCK_BYTES],
    filled: usize,
}

impl Chainer {
    fn push(&mut self, mut bytes: &[u8]) {
        if self.filled > 0 {
            let take = (BLOCK_BYTES - self.filled).min(bytes.len());
            self.partial[self.filled..self.filled + take].copy_from_slice(&bytes[..take]);
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled < BLOCK_BYTES {
                return;
            }
            chain_block(&mut self.blocks, &self.partial);
            self.filled = 0;
        }
        let mut whole = bytes.chunks_exact(BLOCK_BYTES);
        for block in &mut whole {
            chain_block(&mut self.blocks, block);
        }
        let rest = whole.remainder();
        self.partial[..rest.len()].copy_from_slice(rest);
        self.filled = rest.len();
    }
}

/// Append `block`'s link to `blocks`.
fn chain_block(blocks: &mut Vec<u64>, block: &[u8]) {
    let parent = blocks.last().copied().unwrap_or(0);
    let own = xxh3_64(block).to_le_bytes();
    blocks.push(xxh3_64_with_seed(&own, parent));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(messages: &serde_json::Value) -> Vec<u8> {
        json!({"model": "m", "messages": messages, "stream": true})
            .to_string()
            .into_bytes()
    }

    fn message(role: &str, len: usize) -> serde_json::Value {
        json!({"role": role, "content": "x".repeat(len)})
    }

    #[test]
    fn the_chain_is_a_fixed_function_of_the_stream() {
        let body = chat(&json!([message("user", 600)]));
        let stream = serde_json::to_vec(&json!([message("user", 600)])).unwrap();
        let sep = [&[][..], &[0x1e][..], &stream[..]].concat();
        let chained =
            |block: &[u8], parent| xxh3_64_with_seed(&xxh3_64(block).to_le_bytes(), parent);
        let b0 = chained(&sep[..256], 0);
        let b1 = chained(&sep[256..512], b0);
        assert_eq!(sep.len() / BLOCK_BYTES, 2);
        assert_eq!(of(Api::ChatCompletions, &body), [b0, b1]);
    }

    #[test]
    fn a_later_turn_starts_with_the_earlier_turns_chain() {
        let first = json!([message("system", 2000), message("user", 300)]);
        let mut later = first.as_array().unwrap().clone();
        later.push(message("assistant", 100));
        later.push(message("user", 100));
        let a = of(Api::ChatCompletions, &chat(&first));
        let b = of(Api::ChatCompletions, &chat(&json!(later)));
        assert_eq!(a.len(), 9);
        assert!(b.len() > a.len());
        // All but the last block: the earlier body's last one holds its `]`.
        assert_eq!(a[..8], b[..8]);
        // Another system message: nothing shared from the first block on.
        let other = json!([{"role": "system", "content": "z".repeat(2000)}, message("user", 300)]);
        let c = of(Api::ChatCompletions, &chat(&other));
        assert_ne!(a[0], c[0]);
    }

    #[test]
    fn every_api_reads_its_own_fields() {
        let long = "y".repeat(1000);
        let msgs = json!({"model": "m", "system": long, "messages": [message("user", 10)]});
        let resp = json!({"model": "m", "instructions": long, "input": "hi"});
        let comp = json!({"model": "m", "prompt": long});
        for (api, body) in [
            (Api::Messages, msgs),
            (Api::Responses, resp),
            (Api::Completions, comp),
        ] {
            assert!(of(api, body.to_string().as_bytes()).len() >= 3, "{api:?}");
        }
        // Tools come before the messages: other tools, another chain.
        let with = |tool: &str| {
            let body = json!({"tools": [{"name": tool}], "messages": [message("user", 900)]});
            of(Api::ChatCompletions, body.to_string().as_bytes())
        };
        assert_ne!(with("a")[0], with("b")[0]);
        assert_eq!(with("a"), with("a"));
    }

    #[test]
    fn no_prompt_no_chain() {
        assert!(of(Api::ChatCompletions, b"{\"model\":\"m\"}").is_empty());
        assert!(of(Api::ChatCompletions, b"not json").is_empty());
        assert!(of(Api::Engine, &chat(&json!([message("user", 900)]))).is_empty());
        // Shorter than a block: nothing to match.
        assert!(of(Api::ChatCompletions, &chat(&json!([message("user", 10)]))).is_empty());
    }
}
