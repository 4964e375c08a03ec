//! `stored_responses`: how the gateway remembers and finds the backend that
//! stored each Responses API response (`routing::owners`).

use std::time::Duration;

use serde::Deserialize;

use super::{ms, secs};
use crate::field::{Bound, Invalid};
use crate::routing::owners;

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StoredResponsesFile {
    /// Owners remembered, gateway-wide; the oldest are forgotten first
    /// (32 bytes each). Default 100000.
    #[serde(default = "default_max_owners")]
    max_owners: u64,
    /// An owner is forgotten this long after it was learnt. Default 86400.
    #[serde(default = "default_max_age_secs")]
    max_age_secs: u64,
    /// How long each backend is given to say whether it has a response the
    /// gateway does not know (all are asked at once). Default 2000.
    #[serde(default = "default_lookup_timeout_ms")]
    lookup_timeout_ms: u64,
}

impl Default for StoredResponsesFile {
    fn default() -> Self {
        StoredResponsesFile {
            max_owners: default_max_owners(),
            max_age_secs: default_max_age_secs(),
            lookup_timeout_ms: default_lookup_timeout_ms(),
        }
    }
}

fn default_max_owners() -> u64 {
    owners::DEFAULT_MAX_ENTRIES as u64
}
fn default_max_age_secs() -> u64 {
    owners::DEFAULT_MAX_AGE.as_secs()
}
fn default_lookup_timeout_ms() -> u64 {
    owners::DEFAULT_LOOKUP_TIMEOUT.as_millis() as u64
}

#[derive(Debug, Clone)]
pub struct StoredResponsesConfig {
    pub max_owners: usize,
    pub max_age: Duration,
    pub lookup_timeout: Duration,
}

pub const MAX_OWNERS: Bound<u64> =
    Bound::new(&["gateway.stored_responses.max_owners"], 1, 100_000_000);
pub const MAX_AGE_SECS: Bound<u64> =
    Bound::new(&["gateway.stored_responses.max_age_secs"], 1, 30 * 86_400);
pub const LOOKUP_TIMEOUT_MS: Bound<u64> =
    Bound::new(&["gateway.stored_responses.lookup_timeout_ms"], 1, 60_000);

pub fn validate(s: StoredResponsesFile) -> Result<StoredResponsesConfig, Invalid> {
    let at = |key: &str| format!("gateway.stored_responses.{key}");
    Ok(StoredResponsesConfig {
        max_owners: MAX_OWNERS.check(&at("max_owners"), s.max_owners)? as usize,
        max_age: secs(MAX_AGE_SECS.check(&at("max_age_secs"), s.max_age_secs)?),
        lookup_timeout: ms(LOOKUP_TIMEOUT_MS.check(&at("lookup_timeout_ms"), s.lookup_timeout_ms)?),
    })
}
