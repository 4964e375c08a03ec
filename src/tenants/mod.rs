//! Per-tenant budgets: the requests a tenant may have in flight, the
//! requests it may start and the tokens it may use a minute. Plain state and
//! an injected clock; the proxy resolves the tenant's name with
//! [`Tenants::get`], calls [`Tenant::admit`] before queueing, keeps the
//! [`InFlight`] guard in its CTX and, when the response ends, charges it the
//! tokens vLLM reported ([`InFlight::charge`]).
//!
//! # Budget (each optional; none at all costs no lock)
//!
//! - `max_in_flight = C`: at most C requests of the tenant hold a backend
//!   slot or queue place at once, all backends together. The place is freed
//!   when the guard is dropped, on every path (success, error, client gone).
//! - `requests_per_minute = N`: a token bucket of N requests, refilled
//!   continuously at N per minute. After a minute idle N requests may
//!   arrive at once; after that one more every 60/N seconds. There is no fixed minute, so no burst
//!   of 2N at a minute's edge: at most N at any instant, and at most
//!   N + N·T/60 over any T seconds.
//! - `tokens_per_minute = M`: a bucket of M tokens refilled at M per minute.
//!   A request is admitted while the balance is not negative; its prompt +
//!   completion tokens are taken when it ends, which may drive the balance
//!   below zero (a request in flight is never stopped, and requests admitted
//!   together all charge afterwards). The tenant is then refused until the
//!   refill has paid the debt back: M tokens a minute, sustained.
//!
//! # Refusals
//!
//! The limits are checked in the order above and the first one hit refuses;
//! a refused request takes nothing from any limit. Its `retry_after` is the
//! exact time until that limit alone would admit (the caller rounds it up to
//! whole seconds for `Retry-After`). A place in flight is freed by a request
//! ending, not by the clock, so for `max_in_flight` it is a fixed
//! [`IN_FLIGHT_RETRY`].
//!
//! # Replicas and names
//!
//! With several gateway replicas each enforces its share of every limit
//! ([`Budget::shared_by`]). Each listed tenant has its own budget; other
//! names (JWT subjects, a trusted header) get one each up to `max_tracked`,
//! after which they share one budget and label, [`OTHER`].

mod bucket;
mod registry;
mod tenant;

use std::time::Duration;

pub use registry::{Lookup, ReservedName, Tenants, DEFAULT_MAX_TRACKED, OTHER};
pub use tenant::{InFlight, Tenant};

/// The tenant of a request no credential or header names.
pub const DEFAULT: &str = "default";

/// Whether `name` may name a tenant (in the config and the keys file):
/// 1 to 64 of `A-Z a-z 0-9 _ . -`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A tenant's weight (its share of each backend's slots and queue places,
/// `admission::Share`) and its budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub weight: u32,
    pub limits: Budget,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            weight: 1,
            limits: Budget::default(),
        }
    }
}

/// A tenant's budget: its limits, each None for no limit. A limit of 0 refuses every
/// request (the config should reject it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    pub max_in_flight: Option<u32>,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u64>,
}

impl Budget {
    /// One replica's share when `replicas` (at least 1) gateways serve the
    /// same tenants: each limit divided, rounded up so that none becomes 0
    /// (together the replicas may allow up to `replicas - 1` more).
    pub fn shared_by(self, replicas: usize) -> Budget {
        let replicas = u64::try_from(replicas).unwrap_or(u64::MAX);
        // A share is at most the whole, so it fits the whole's type.
        let share_u32 = |limit: u32| u64::from(limit).div_ceil(replicas) as u32;
        Budget {
            max_in_flight: self.max_in_flight.map(share_u32),
            requests_per_minute: self.requests_per_minute.map(share_u32),
            tokens_per_minute: self.tokens_per_minute.map(|l| l.div_ceil(replicas)),
        }
    }

    fn is_unlimited(&self) -> bool {
        *self == Budget::default()
    }
}

/// The `retry_after` of a `max_in_flight` refusal: a place frees when one of
/// the tenant's requests ends, which no clock predicts.
pub const IN_FLIGHT_RETRY: Duration = Duration::from_secs(1);

/// The limit that refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    MaxInFlight,
    RequestsPerMinute,
    TokensPerMinute,
}

impl Limit {
    /// The limit's config key, also its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::MaxInFlight => "max_in_flight",
            Limit::RequestsPerMinute => "requests_per_minute",
            Limit::TokensPerMinute => "tokens_per_minute",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the tenant is over its {}: retry after {retry_after:?}", limit.as_str())]
pub struct Refusal {
    pub limit: Limit,
    /// Until the tenant is under `limit` again; not rounded.
    pub retry_after: Duration,
}

#[cfg(test)]
mod tests;
