//! `routing`: how requests pick their backend (see `crate::routing`); a
//! model may override `balance_factor`.

use serde::Deserialize;

use crate::field::{invalid, Bound, Invalid};
use crate::routing::chain::BLOCK_TOKENS;
use crate::routing::prefix::Head;
use crate::routing::{IndexSize, Keyless, Policy};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RoutingFile {
    /// Bounded-load rendezvous: a keyed request skips a backend whose load
    /// (in flight + queued here) is at `ceil(f * (L + 1) * w / W)`.
    /// 1 < f <= 10. Default: off (pure rendezvous).
    balance_factor: Option<f64>,
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
    /// each prompt, weighed against the wait for a slot. Instead of
    /// `balance_factor`. Default: off.
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
            balance_factor: None,
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

/// Above 1 (1 would forbid any imbalance), at most 10. Also a model's own.
pub const BALANCE_FACTOR: Bound<f64> = Bound::above(
    &[
        "gateway.routing.balance_factor",
        "gateway.models[].balance_factor",
    ],
    1.0,
    10.0,
);
pub const CACHE_TOKENS: Bound<u64> =
    Bound::new(&["gateway.routing.prefix_index.cache_tokens"], 1, 1 << 40);
pub const MAX_TOKENS: Bound<u64> =
    Bound::new(&["gateway.routing.prefix_index.max_tokens"], 1, 1 << 40);
pub const KEYLESS_PREFIX_BYTES: Bound<u64> =
    Bound::new(&["gateway.routing.keyless_prefix_bytes"], 1, 1 << 20);

pub fn validate(at: &str, r: &RoutingFile) -> Result<Policy, Invalid> {
    if let (Some(_), Some(f)) = (&r.prefix_index, r.balance_factor) {
        let why = "bounded load and the prefix index's cost rule are alternatives: set one";
        return Err(invalid(format!("{at}.balance_factor"), f, why));
    }
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
        balance_factor: r
            .balance_factor
            .map(|f| BALANCE_FACTOR.check(&format!("{at}.balance_factor"), f))
            .transpose()?,
        keyless: match r.keyless {
            KeylessFile::RoundRobin => Keyless::RoundRobin,
            KeylessFile::Prefix => Keyless::Derived(Head::FirstUser),
            KeylessFile::System => Keyless::Derived(Head::System),
        },
        keyless_prefix_bytes: KEYLESS_PREFIX_BYTES.check(
            &format!("{at}.keyless_prefix_bytes"),
            r.keyless_prefix_bytes,
        )? as usize,
    })
}
