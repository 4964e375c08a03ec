//! `warmup`: how requests marked `X-Poimen-Warmup` yield to agent requests.

use std::time::Duration;

use serde::Deserialize;

use super::ms;
use crate::field::{Bound, Invalid};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct WarmupFile {
    /// Sleep before a warmup competes for a slot. Default 500.
    #[serde(default = "default_delay_ms")]
    pub delay_ms: u64,
    /// Also send `X-Vllm-Priority: N` on warmups (vLLM's priority
    /// scheduler: lower runs first). Default none.
    #[serde(default)]
    vllm_priority: Option<i64>,
}

impl Default for WarmupFile {
    fn default() -> Self {
        WarmupFile {
            delay_ms: default_delay_ms(),
            vllm_priority: None,
        }
    }
}

fn default_delay_ms() -> u64 {
    500
}

#[derive(Debug, Clone)]
pub struct WarmupConfig {
    pub delay: Duration,
    pub vllm_priority: Option<i64>,
}

/// Also `WARMUP_DELAY_MS`.
pub const DELAY_MS: Bound<u64> = Bound::new(&["gateway.warmup.delay_ms"], 0, 60_000);

pub fn validate(w: WarmupFile) -> Result<WarmupConfig, Invalid> {
    Ok(WarmupConfig {
        delay: ms(DELAY_MS.check("gateway.warmup.delay_ms", w.delay_ms)?),
        vllm_priority: w.vllm_priority,
    })
}
