//! poimen-gateway: a Pingora edge daemon that routes OpenAI-style requests to
//! a pool of vLLM backends per model, keeping requests that share a cache key
//! on the same GPU so its prefix KV cache is reused.
#![forbid(unsafe_code)]

pub mod accounting;
pub mod admission;
pub mod aliases;
pub mod api;
pub mod auth;
pub mod body;
pub mod catalog;
pub mod config;
pub mod discovery;
pub mod errors;
pub mod explain;
pub mod failover;
pub mod field;
pub mod kv_events;
pub mod logging;
pub mod metrics;
pub mod pool;
pub mod proxy;
pub mod render;
pub mod routing;
pub mod services;
pub mod tenants;
pub mod tls;
pub mod trace;
pub mod upstream;
