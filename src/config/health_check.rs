//! `health_check`: the optional active checks that end a failure exclusion
//! early (see `crate::health`).

use std::time::Duration;

use serde::Deserialize;

use super::ms;
use crate::field::{invalid, Bound, Invalid};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HealthCheckFile {
    /// Probed with GET. Default `/health` (vLLM's).
    #[serde(default = "default_path")]
    path: String,
    /// Default 1000.
    #[serde(default = "default_interval_ms")]
    interval_ms: u64,
    /// Connect and read timeout of a probe. Default 1000.
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    /// Healthy answers in a row that end an exclusion. Default 1.
    #[serde(default = "default_consecutive_ok")]
    consecutive_ok: u64,
}

fn default_path() -> String {
    "/health".into()
}
fn default_interval_ms() -> u64 {
    1000
}
fn default_timeout_ms() -> u64 {
    1000
}
fn default_consecutive_ok() -> u64 {
    1
}

#[derive(Debug, Clone)]
pub struct HealthCheckConfig {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub consecutive_ok: usize,
}

pub const INTERVAL_MS: Bound<u64> = Bound::new(&["gateway.health_check.interval_ms"], 100, 600_000);
pub const TIMEOUT_MS: Bound<u64> = Bound::new(&["gateway.health_check.timeout_ms"], 1, 60_000);
pub const CONSECUTIVE_OK: Bound<u64> = Bound::new(&["gateway.health_check.consecutive_ok"], 1, 100);

pub fn validate(h: HealthCheckFile) -> Result<HealthCheckConfig, Invalid> {
    let at = "gateway.health_check";
    if !h.path.starts_with('/') || http::uri::PathAndQuery::try_from(h.path.as_str()).is_err() {
        return Err(invalid(
            format!("{at}.path"),
            &h.path,
            "must be a path starting with /",
        ));
    }
    Ok(HealthCheckConfig {
        interval: ms(INTERVAL_MS.check(&format!("{at}.interval_ms"), h.interval_ms)?),
        timeout: ms(TIMEOUT_MS.check(&format!("{at}.timeout_ms"), h.timeout_ms)?),
        consecutive_ok: CONSECUTIVE_OK.check(&format!("{at}.consecutive_ok"), h.consecutive_ok)?
            as usize,
        path: h.path,
    })
}
