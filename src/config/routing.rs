//! `routing`: how requests pick their backend (see `crate::routing`).

use serde::Deserialize;

use crate::field::{Bound, Invalid};
use crate::routing::chain::BLOCK_TOKENS;
use crate::routing::prefix::Head;
use crate::routing::{IndexSize, Keyless, Policy};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RoutingFile {
    /// Requests without `X-Poimen-Cache-Key`: `round_robin`,
    /// `prefix` (a key derived from the messages through the first user
    /// message) or `system` (from the messages before it). Default
    /// round_robin.
    #[serde(default)]
    keyless: KeylessFile,
    /// Bytes of a completion's `prompt` a derived key covers. Default 2048.
    #[serde(default = "default_keyless_prefix_bytes")]
    keyless_prefix_bytes: u64,
    /// Route by cost over a prefix index: which backend holds how much of
    /// each prompt, weighed against the wait for a slot. Default: off
    /// (rendezvous by key, else `keyless`, whatever the load).
    prefix_index: Option<PrefixIndexFile>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PrefixIndexFile {
    /// Each backend's KV cache, in tokens (vLLM logs it at start as "GPU KV
    /// cache size"): the index forgets a backend's least recently used
    /// blocks beyond it.
    cache_tokens: u64,
    /// Tokens held over all backends of a model at most: the index's memory
    /// bound (about 100 bytes per 64 tokens). Default 16777216.
    #[serde(default = "default_max_tokens")]
    max_tokens: u64,
}

fn default_max_tokens() -> u64 {
    1 << 24
}

impl Default for RoutingFile {
    fn default() -> Self {
        RoutingFile {
            keyless: KeylessFile::default(),
            keyless_prefix_bytes: default_keyless_prefix_bytes(),
            prefix_index: None,
        }
    }
}

fn default_keyless_prefix_bytes() -> u64 {
    2048
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
enum KeylessFile {
    #[default]
    RoundRobin,
    Prefix,
    System,
}

pub const CACHE_TOKENS: Bound<u64> =
    Bound::new(&["gateway.routing.prefix_index.cache_tokens"], 1, 1 << 40);
pub const MAX_TOKENS: Bound<u64> =
    Bound::new(&["gateway.routing.prefix_index.max_tokens"], 1, 1 << 40);
pub const KEYLESS_PREFIX_BYTES: Bound<u64> =
    Bound::new(&["gateway.routing.keyless_prefix_bytes"], 1, 1 << 20);

pub fn validate(at: &str, r: &RoutingFile) -> Result<Policy, Invalid> {
    let blocks = |tokens: u64| tokens.div_ceil(BLOCK_TOKENS) as usize;
    let prefix_index = match &r.prefix_index {
        Some(p) => Some(IndexSize {
            backend_blocks: blocks(
                CACHE_TOKENS.check(&format!("{at}.prefix_index.cache_tokens"), p.cache_tokens)?,
            ),
            max_blocks: blocks(
                MAX_TOKENS.check(&format!("{at}.prefix_index.max_tokens"), p.max_tokens)?,
            ),
        }),
        None => None,
    };
    Ok(Policy {
        prefix_index,
        keyless: match r.keyless {
            KeylessFile::RoundRobin => Keyless::RoundRobin,
            KeylessFile::Prefix => Keyless::Derived(Head::FirstUser),
            KeylessFile::System => Keyless::Derived(Head::System),
        },
        keyless_prefix_bytes: KEYLESS_PREFIX_BYTES.check(
            &format!("{at}.keyless_prefix_bytes"),
            r.keyless_prefix_bytes,
        )? as usize,
        exact: None,
    })
}
