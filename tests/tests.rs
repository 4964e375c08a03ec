//! Integration tests: the real binary on loopback against fake backends.

mod support;

mod accounting;
mod admission;
mod agent_apis;
mod aliases;
mod bad_input;
mod bodies;
mod config_check;
mod discovery;
mod explain;
mod failover;
mod fuzz;
mod jwt;
mod keyless;
mod kv_events;
mod learned;
mod load_feedback;
mod logging;
mod operations;
mod prefix_index;
mod reload;
mod responses;
mod routing;
mod sdk_agents;
mod streaming;
mod tenants;
mod tls;
mod tracing;
