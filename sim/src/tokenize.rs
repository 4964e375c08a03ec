//! Deterministic fake tokenizer and block hashing.
//!
//! Tokenization rule: every 4 bytes of the UTF-8 prompt text are one token,
//! and a trailing partial group of 1-3 bytes counts as one more token, so
//! `tokens = ceil(bytes / 4)`. Tokens may split a multi-byte character; that
//! is fine because nothing is ever decoded back.
//!
//! Prompt text: for chat-like requests see `conversation`; for completions
//! the `prompt` string, or an array of strings joined with nothing between.
//!
//! Blocks: tokens are cut into blocks of `block_size` tokens; only full blocks
//! get a hash. Hashes are chained so a block's identity includes everything
//! before it: `h_i = xxh3_64(h_{i-1} as 8 LE bytes ‖ block bytes)`, with
//! `h_{-1}` the served model's namespace: 0 for the base model, its own for
//! each adapter (`lora::Served`), so adapters never share blocks.

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes per simulated token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Number of tokens in `text` (last partial token counts as one).
pub fn count_tokens(text: &str) -> usize {
    text.len().div_ceil(BYTES_PER_TOKEN)
}

/// Token ids of `text` for `/tokenize`: each 4-byte group read as a
/// little-endian u32 (a short last group zero-padded), so `detokenize`
/// can give the text back.
pub fn token_ids(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(BYTES_PER_TOKEN)
        .map(|c| {
            let mut b = [0u8; BYTES_PER_TOKEN];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect()
}

/// Text of token ids made by `token_ids` (padding zero bytes dropped; an id
/// that is no such group still decodes, lossily).
pub fn detokenize(ids: &[u32]) -> String {
    let mut bytes = Vec::with_capacity(ids.len() * BYTES_PER_TOKEN);
    for id in ids {
        let b = id.to_le_bytes();
        let len = BYTES_PER_TOKEN - b.iter().rev().take_while(|&&x| x == 0).count();
        bytes.extend_from_slice(&b[..len]);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Chained hashes of all full blocks of `text`, first block first, the
/// chain seeded with `namespace`.
pub fn block_hashes(namespace: u64, text: &str, block_size: usize) -> Vec<u64> {
    let bytes = text.as_bytes();
    let full_blocks = count_tokens(text) / block_size;
    let block_bytes = block_size * BYTES_PER_TOKEN;
    let mut prev = namespace;
    let mut out = Vec::with_capacity(full_blocks);
    let mut buf = Vec::with_capacity(8 + block_bytes);
    for i in 0..full_blocks {
        // The last full block may end in a partial token, hence the min().
        let end = ((i + 1) * block_bytes).min(bytes.len());
        buf.clear();
        buf.extend_from_slice(&prev.to_le_bytes());
        buf.extend_from_slice(&bytes[i * block_bytes..end]);
        prev = xxh3_64(&buf);
        out.push(prev);
    }
    out
}

/// Why a request body has no usable prompt.
#[derive(Debug, PartialEq, Eq)]
pub struct PromptError(pub String);

/// Prompt text of a completions request: the string, or strings joined.
pub fn completion_prompt(body: &Value) -> Result<String, PromptError> {
    match body.get("prompt") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut text = String::new();
            for it in items {
                let s = it
                    .as_str()
                    .ok_or_else(|| PromptError("'prompt' array must hold strings".into()))?;
                text.push_str(s);
            }
            Ok(text)
        }
        _ => Err(PromptError(
            "'prompt' must be a string or an array of strings".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn four_bytes_per_token_and_partial_counts() {
        assert_eq!(count_tokens(""), 0);
        assert_eq!(count_tokens("abc"), 1);
        assert_eq!(count_tokens("abcd"), 1);
        assert_eq!(count_tokens("abcde"), 2);
        // 'é' is 2 bytes in UTF-8: 4 of them are 8 bytes = 2 tokens.
        assert_eq!(count_tokens("éééé"), 2);
    }

    #[test]
    fn token_ids_round_trip() {
        let text = "héllo, wörld!";
        let ids = token_ids(text);
        assert_eq!(ids.len(), count_tokens(text));
        assert_eq!(ids[0], u32::from_le_bytes(*b"h\xc3\xa9l"));
        assert_eq!(detokenize(&ids), text);
    }

    #[test]
    fn only_full_blocks_are_hashed_and_chained() {
        let text = "x".repeat(40 * 4); // 40 tokens
        let h = block_hashes(0, &text, 16);
        assert_eq!(h.len(), 2);
        // Same content at a different position hashes differently (chaining).
        assert_ne!(h[0], h[1]);
        let mut buf = 0u64.to_le_bytes().to_vec();
        buf.extend_from_slice(&text.as_bytes()[..64]);
        assert_eq!(h[0], xxh3_64(&buf));
        // Another namespace: other hashes for the same text, from the start.
        let other = block_hashes(7, &text, 16);
        assert!(other.iter().all(|x| !h.contains(x)));
    }

    #[test]
    fn completion_prompt_accepts_string_or_array() {
        assert_eq!(completion_prompt(&json!({"prompt": "ab"})).unwrap(), "ab");
        assert_eq!(
            completion_prompt(&json!({"prompt": ["a", "b"]})).unwrap(),
            "ab"
        );
        assert!(completion_prompt(&json!({"prompt": [1]})).is_err());
        assert!(completion_prompt(&json!({})).is_err());
    }
}
