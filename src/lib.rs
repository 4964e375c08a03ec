//! poimen-gateway: a Pingora edge daemon that routes OpenAI-style requests to
//! a pool of vLLM backends per model, keeping requests that share a cache key
//! on the same GPU so its prefix KV cache is reused.
#![forbid(unsafe_code)]

pub mod accounting;
pub mod admission;
pub mod auth;
pub mod body;
pub mod config;
pub mod discovery;
pub mod errors;
pub mod exclusion;
pub mod explain;
pub mod field;
pub mod health;
pub mod load_report;
pub mod logging;
pub mod metrics;
pub mod pool;
pub mod proxy;
pub mod retry;
pub mod routing;
pub mod tls;
