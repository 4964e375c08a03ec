//! `scheduler`: per-backend admission: slots, queue places, the
//! longest wait, what a full backend does, the replicas that share each
//! backend and load feedback. The environment overrides the first two.

use std::time::Duration;

use serde::Deserialize;

use super::ms;
use crate::admission::Capacity;
use crate::field::{Bound, Invalid};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SchedulerFile {
    /// Requests in flight per backend: vLLM's `--max-num-seqs`. Default 4.
    #[serde(default = "default_max_num_seqs")]
    pub max_num_seqs: u64,
    /// Requests waiting per backend; one more gets 503. Default 20.
    #[serde(default = "default_max_queue_depth")]
    pub max_queue_depth: u64,
    /// Longest wait for a slot before 503. Default 60000.
    #[serde(default = "default_queue_timeout_ms")]
    queue_timeout_ms: u64,
    /// `reject` (503 when the backend's queue is full) or `spill` (try the
    /// next backend in the key's ranking). Default reject.
    #[serde(default)]
    pub overflow: Overflow,
    /// Gateway replicas sharing the same backends: each admits
    /// `ceil(max_num_seqs / replicas)` and queues
    /// `ceil(max_queue_depth / replicas)` per backend. Default 1.
    #[serde(default = "default_replicas")]
    replicas: u64,
    /// Ask each backend for its load (`endpoint-load-metrics`, vLLM's ORCA
    /// report) and let it move this replica's slots between 1 and the
    /// backend's whole `max_num_seqs`: fewer while requests wait there, more
    /// while none do and this replica is short. Default false.
    #[serde(default)]
    pub load_feedback: bool,
}

impl Default for SchedulerFile {
    fn default() -> Self {
        SchedulerFile {
            max_num_seqs: default_max_num_seqs(),
            max_queue_depth: default_max_queue_depth(),
            queue_timeout_ms: default_queue_timeout_ms(),
            overflow: Overflow::default(),
            replicas: default_replicas(),
            load_feedback: false,
        }
    }
}

fn default_max_num_seqs() -> u64 {
    4
}
fn default_max_queue_depth() -> u64 {
    20
}
fn default_queue_timeout_ms() -> u64 {
    60_000
}
fn default_replicas() -> u64 {
    1
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    #[default]
    Reject,
    Spill,
}

/// Also a model's own `max_num_seqs` and `VLLM_MAX_NUM_SEQS`.
pub const NUM_SEQS: Bound<u64> = Bound::new(
    &[
        "gateway.scheduler.max_num_seqs",
        "gateway.models[].max_num_seqs",
    ],
    1,
    4096,
);
/// Also a model's own `max_queue_depth` and `VLLM_MAX_QUEUE_DEPTH`.
pub const QUEUE_DEPTH: Bound<u64> = Bound::new(
    &[
        "gateway.scheduler.max_queue_depth",
        "gateway.models[].max_queue_depth",
    ],
    0,
    100_000,
);
pub const REPLICAS: Bound<u64> = Bound::new(&["gateway.scheduler.replicas"], 1, 64);
pub const QUEUE_TIMEOUT_MS: Bound<u64> =
    Bound::new(&["gateway.scheduler.queue_timeout_ms"], 1, 3_600_000);

/// Every backend's limits unless its model sets its own (before they are
/// shared between replicas), and the replicas.
pub fn limits(s: &SchedulerFile) -> Result<(Capacity, usize), Invalid> {
    let limits = Capacity {
        max_num_seqs: NUM_SEQS.check("gateway.scheduler.max_num_seqs", s.max_num_seqs)? as usize,
        max_queue_depth: QUEUE_DEPTH
            .check("gateway.scheduler.max_queue_depth", s.max_queue_depth)?
            as usize,
    };
    let replicas = REPLICAS.check("gateway.scheduler.replicas", s.replicas)? as usize;
    Ok((limits, replicas))
}

pub fn queue_timeout(s: &SchedulerFile) -> Result<Duration, Invalid> {
    let at = "gateway.scheduler.queue_timeout_ms";
    Ok(ms(QUEUE_TIMEOUT_MS.check(at, s.queue_timeout_ms)?))
}
