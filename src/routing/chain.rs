//! A request's prompt as a chain of blocks, the unit of the prefix index
//! (`index.rs`): the gateway's own stand-in for vLLM's chained KV blocks,
//! read off the body without rendering it.
//!
//! ```text
//! the stream: the raw JSON text, as sent, of
//!   chat (/v1/chat/completions):  messages[0] ‖ 0x1E ‖ tools ‖ 0x1E ‖ the rest of messages
//!                                 (the text after messages[0]: `, ... ]`); without tools: 0x1E ‖ messages
//!   Messages (/v1/messages):      system ‖ 0x1E ‖ tools ‖ 0x1E ‖ messages
//!   Responses (/v1/responses):    instructions ‖ 0x1E ‖ tools ‖ 0x1E ‖ input
//!   completions (/v1/completions): prompt
//!   (a field absent: empty; chat messages that are no array: tools ‖ 0x1E ‖ messages)
//! block i = bytes [i*256, (i+1)*256) of the stream; a last partial block is not one
//! h_i = xxh3_64_with_seed(its second 128 bytes, xxh3_64_with_seed(its first 128 bytes, h_(i-1))), h_(-1) = 0
//! ```
//!
//! (A block is hashed as two halves: xxh3 takes an input of up to 240
//! bytes, seeded, in a few multiplies, where a longer one takes its
//! striped loop, and seeded it would derive a secret of its own first.)
//!
//! The head of a conversation (its system prompt, or its first message)
//! comes before its tools, as chat templates render them (the system turn,
//! then the tool list): two conversations of one agent share its tools,
//! often most of their bytes, but a template shares no KV block past where
//! their system prompts part, and neither do their chains.
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
    let tools = text(p.tools);
    match api.describe().conversation {
        Some(Conversation::Messages {
            system: Some(system),
            messages,
        }) => stream(&[text(p.field(system)), tools, text(p.field(messages))]),
        Some(Conversation::Messages {
            system: None,
            messages,
        }) => {
            let messages = text(p.field(messages));
            // Without tools there is nothing to put after the head: the
            // first message's end is not looked for.
            match tools.and(messages).and_then(split_first) {
                Some((head, rest)) => stream(&[Some(head), tools, Some(rest)]),
                None => stream(&[tools, messages]),
            }
        }
        Some(Conversation::Text) => stream(&[text(p.prompt)]),
        None => Vec::new(),
    }
}

fn text(v: Option<&RawValue>) -> Option<&str> {
    v.map(RawValue::get)
}

/// The bytes of a prompt's fields, as sent: what admission expects the
/// backend to prefill, in the tokens a text block makes
/// (`ModelRouting::text_tokens`), before it knows better.
pub fn prompt_bytes(api: Api, p: &Prompt) -> u64 {
    let fields = match api.describe().conversation {
        Some(Conversation::Messages { system, messages }) => {
            [p.tools, system.and_then(|s| p.field(s)), p.field(messages)]
        }
        Some(Conversation::Text) => [p.prompt, None, None],
        None => [None; 3],
    };
    fields.iter().flatten().map(|f| f.get().len() as u64).sum()
}

/// A JSON array's first element, an object, and the text after it
/// (`, ... ]`), as sent. The body was checked as JSON when it was read, so
/// the object's end is found by counting its braces, each string skipped
/// with memchr: a JSON parser would read its every byte again (the system
/// prompt, most of a first request).
fn split_first(array: &str) -> Option<(&str, &str)> {
    let inner = array.trim_start().strip_prefix('[')?.trim_start();
    let start = array.len() - inner.len();
    let bytes = array.as_bytes();
    if bytes.get(start) != Some(&b'{') {
        return None;
    }
    let (mut depth, mut i) = (0usize, start);
    loop {
        match *bytes.get(i)? {
            b'"' => loop {
                i += 1 + memchr::memchr2(b'"', b'\\', bytes.get(i + 1..)?)?;
                match bytes[i] {
                    b'\\' => i += 1, // the escaped byte is skipped
                    _ => break,
                }
            },
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some((&array[start..=i], &array[i + 1..]));
                }
            }
            _ => {}
        }
        i += 1;
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
    xxh3_64_with_seed(&xxh3_64(&le_bytes(ids)).to_le_bytes(), parent)
}

/// `ids`, each as 4 bytes little-endian: on a little-endian machine, their
/// memory as it is.
#[cfg(target_endian = "little")]
fn le_bytes(ids: &[u32]) -> std::borrow::Cow<'_, [u8]> {
    zerocopy::IntoBytes::as_bytes(ids).into()
}

#[cfg(target_endian = "big")]
fn le_bytes(ids: &[u32]) -> std::borrow::Cow<'_, [u8]> {
    ids.iter().flat_map(|t| t.to_le_bytes()).collect()
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
fn stream(parts: &[Option<&str>]) -> Vec<u64> {
    if parts.last().is_none_or(|p| p.is_none()) {
        return Vec::new();
    }
    let len: usize = parts.iter().flatten().map(|p| p.len() + 1).sum();
    let mut chain = Chainer {
        blocks: Vec::with_capacity(len / BLOCK_BYTES),
        partial: [0; BLOCK_BYTES],
        filled: 0,
    };
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            chain.push(&[0x1e]);
        }
        chain.push(part.map_or(&[][..], |p| p.as_bytes()));
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
    let (first, second) = block.split_at(BLOCK_BYTES / 2);
    blocks.push(xxh3_64_with_seed(second, xxh3_64_with_seed(first, parent)));
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
    fn a_chain_of_tokens_hashes_each_blocks_ids_little_endian() {
        let ids: Vec<u32> = (0..10).map(|i| 0x0102_0304 * i + 7).collect();
        let link = |parent, ids: &[u32]| {
            let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
            xxh3_64_with_seed(&xxh3_64(&bytes).to_le_bytes(), parent)
        };
        let b0 = link(0, &ids[..4]);
        let b1 = link(b0, &ids[4..8]);
        // The last two ids are no whole block.
        assert_eq!(of_tokens(&ids, 4), [b0, b1]);
    }

    #[test]
    fn the_chain_is_a_fixed_function_of_the_stream() {
        let body = chat(&json!([message("user", 600)]));
        let messages = serde_json::to_vec(&json!([message("user", 600)])).unwrap();
        // No tools: 0x1E ‖ messages.
        let sep = [&[0x1e][..], &messages].concat();
        let chained = |block: &[u8], parent| {
            xxh3_64_with_seed(&block[128..], xxh3_64_with_seed(&block[..128], parent))
        };
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
    }

    #[test]
    fn the_head_comes_before_the_tools() {
        let tools: Vec<_> = (0..40)
            .map(|i| json!({"name": format!("tool-{i}"), "description": "d".repeat(200)}))
            .collect();
        let chain = |api: Api, system: &str, tools: &[serde_json::Value]| {
            let body = match api {
                Api::Messages => {
                    json!({"system": system, "tools": tools, "messages": [message("user", 900)]})
                }
                Api::Responses => json!({"instructions": system, "tools": tools, "input": "hi"}),
                _ => {
                    let system = json!({"role": "system", "content": system});
                    json!({"tools": tools, "messages": [system, message("user", 900)]})
                }
            };
            of(api, body.to_string().as_bytes())
        };
        let (alpha, beta) = ("alpha ".repeat(10), "beta ".repeat(10));
        for api in [Api::ChatCompletions, Api::Messages, Api::Responses] {
            // Two conversations of one agent, sharing only its 10 KB of
            // tools: no block in common.
            let (a, b) = (chain(api, &alpha, &tools), chain(api, &beta, &tools));
            assert!(a.len() > 30, "{api:?}");
            assert!(a.iter().all(|l| !b.contains(l)), "{api:?}");
            // The same conversation: the same chain; other tools, another
            // from the block where they begin.
            assert_eq!(a, chain(api, &alpha, &tools), "{api:?}");
            assert_ne!(a.last(), chain(api, &alpha, &tools[1..]).last(), "{api:?}");
        }
        // A later turn still starts with the earlier turn's chain.
        let turn = |n: usize| {
            let msgs: Vec<_> = (0..n).map(|_| message("user", 300)).collect();
            let body = json!({"tools": tools, "messages": msgs});
            of(Api::ChatCompletions, body.to_string().as_bytes())
        };
        let (one, three) = (turn(1), turn(3));
        assert_eq!(one[..one.len() - 1], three[..one.len() - 1]);
    }

    #[test]
    fn the_first_message_is_found_by_its_braces() {
        let first = r#"{"role": "system", "content": "a \"quoted\" {brace} [and] \\"}"#;
        let array = format!(" [ {first} , {{\"role\":\"user\"}}]");
        assert_eq!(split_first(&array), Some((first, r#" , {"role":"user"}]"#)));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(first).unwrap()["content"],
            "a \"quoted\" {brace} [and] \\"
        );
        for not in [
            "[]",
            "[\"text\"]",
            "{}",
            "[{\"unclosed\": 1",
            "[{\"s\": \"\\",
            "",
        ] {
            assert_eq!(split_first(not), None, "{not}");
        }
    }

    proptest::proptest! {
        #[test]
        fn the_first_message_is_the_one_a_json_parser_reads(
            texts in proptest::collection::vec("[a-z\"\\\\{}\\[\\], \u{e9}\u{1F600}\n]{0,40}", 1..4),
        ) {
            let messages: Vec<_> = texts
                .iter()
                .map(|t| json!({"role": "user", "content": t, "nested": [{"x": t}]}))
                .collect();
            let array = serde_json::to_string_pretty(&messages).unwrap();
            let (first, rest) = split_first(&array).unwrap();
            let parsed: Vec<&RawValue> = serde_json::from_str(&array).unwrap();
            proptest::prop_assert_eq!(first, parsed[0].get());
            proptest::prop_assert_eq!(rest.trim_start().chars().next(), Some(if texts.len() > 1 { ',' } else { ']' }));
        }
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
