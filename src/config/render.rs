//! `render`: the threads that render and tokenize prompts for the models
//! with KV-cache events (see `crate::render::workers`).

use serde::Deserialize;

use crate::field::{Bound, Invalid};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RenderFile {
    /// Threads, 0 for a quarter of the cores (1 to 8). Default 0.
    #[serde(default)]
    threads: u64,
    /// Prompts waiting for a thread at most; one more is estimated at
    /// once. Default 64.
    #[serde(default = "default_queue")]
    queue: u64,
    /// A body larger is estimated, not tokenized. Default 1048576.
    #[serde(default = "default_max_prompt_bytes")]
    max_prompt_bytes: u64,
    /// A body at most this large, its tool list aside, and of at most 128
    /// messages is rendered on the proxy's thread (its new text too, up to
    /// 4 KiB); 0: never. Default 32768.
    #[serde(default = "default_inline_bytes")]
    inline_bytes: u64,
}

impl Default for RenderFile {
    fn default() -> Self {
        RenderFile {
            threads: 0,
            queue: default_queue(),
            max_prompt_bytes: default_max_prompt_bytes(),
            inline_bytes: default_inline_bytes(),
        }
    }
}

fn default_queue() -> u64 {
    64
}

fn default_max_prompt_bytes() -> u64 {
    1 << 20
}

fn default_inline_bytes() -> u64 {
    32 << 10
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderConfig {
    pub threads: usize,
    pub queue: usize,
    pub max_prompt_bytes: usize,
    pub inline_bytes: usize,
}

pub const THREADS: Bound<u64> = Bound::new(&["gateway.render.threads"], 0, 256);
pub const QUEUE: Bound<u64> = Bound::new(&["gateway.render.queue"], 0, 1 << 20);
pub const MAX_PROMPT_BYTES: Bound<u64> =
    Bound::new(&["gateway.render.max_prompt_bytes"], 1, 1 << 30);
pub const INLINE_BYTES: Bound<u64> = Bound::new(&["gateway.render.inline_bytes"], 0, 1 << 30);

pub fn validate(r: RenderFile) -> Result<RenderConfig, Invalid> {
    let threads = match THREADS.check("gateway.render.threads", r.threads)? {
        0 => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores / 4).clamp(1, 8)
        }
        n => n as usize,
    };
    Ok(RenderConfig {
        threads,
        queue: QUEUE.check("gateway.render.queue", r.queue)? as usize,
        max_prompt_bytes: MAX_PROMPT_BYTES
            .check("gateway.render.max_prompt_bytes", r.max_prompt_bytes)?
            as usize,
        inline_bytes: INLINE_BYTES.check("gateway.render.inline_bytes", r.inline_bytes)? as usize,
    })
}
