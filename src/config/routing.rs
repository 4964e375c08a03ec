//! `routing`: how requests pick their backend (see `crate::routing`); a
//! model may override `balance_factor`.

use serde::Deserialize;

use crate::field::{Bound, Invalid};
use crate::routing::prefix::Head;
use crate::routing::{Keyless, Policy};

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
}

impl Default for RoutingFile {
    fn default() -> Self {
        RoutingFile {
            balance_factor: None,
            keyless: KeylessFile::default(),
            keyless_prefix_bytes: default_keyless_prefix_bytes(),
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
pub const KEYLESS_PREFIX_BYTES: Bound<u64> =
    Bound::new(&["gateway.routing.keyless_prefix_bytes"], 1, 1 << 20);

pub fn validate(at: &str, r: &RoutingFile) -> Result<Policy, Invalid> {
    Ok(Policy {
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
