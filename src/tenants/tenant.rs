//! One tenant's budget and the guard of an admitted request.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::bucket::Bucket;
use super::{Budget, Limit, Refusal, IN_FLIGHT_RETRY};
use crate::{admission, metrics};

#[derive(Debug)]
pub struct Tenant {
    label: Arc<str>,
    limits: Budget,
    /// Who it is to each backend's fair admission, with its weight.
    share: admission::Share,
    state: Mutex<State>,
    series: metrics::TenantSeries,
}

#[derive(Debug)]
struct State {
    in_flight: u32,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

impl Tenant {
    pub(super) fn new(label: &str, limits: Budget, weight: u32) -> Arc<Self> {
        let label: Arc<str> = label.into();
        let state = State {
            in_flight: 0,
            requests: limits.requests_per_minute.map(|n| Bucket::full(n.into())),
            tokens: limits.tokens_per_minute.map(Bucket::full),
        };
        Arc::new(Tenant {
            share: admission::Share::new(label.clone(), weight),
            series: metrics::TenantSeries::new(label.clone()),
            label,
            limits,
            state: Mutex::new(state),
        })
    }

    /// The tenant's name as metrics and logs show it: a listed or tracked
    /// name, or [`super::OTHER`].
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The label, shared (a trace's attribute holds it).
    pub fn shared_label(&self) -> Arc<str> {
        self.label.clone()
    }

    /// Its metric series.
    pub fn series(&self) -> &metrics::TenantSeries {
        &self.series
    }

    /// The tenant as each backend's fair admission knows it.
    pub fn share(&self) -> &admission::Share {
        &self.share
    }

    /// Admit a request at the time `now` gives, or refuse it taking
    /// nothing; see the module doc for the order of the checks. The clock
    /// is read only for a tenant with limits.
    pub fn admit(self: &Arc<Self>, now: impl FnOnce() -> Instant) -> Result<InFlight, Refusal> {
        if self.limits.is_unlimited() {
            return Ok(InFlight { tenant: None });
        }
        let now = now();
        let mut st = self.lock();
        if self
            .limits
            .max_in_flight
            .is_some_and(|max| st.in_flight >= max)
        {
            return Err(Refusal {
                limit: Limit::MaxInFlight,
                retry_after: IN_FLIGHT_RETRY,
            });
        }
        if let Some(wait) = st.requests.as_mut().and_then(|b| b.wait(1, now)) {
            return Err(Refusal {
                limit: Limit::RequestsPerMinute,
                retry_after: wait,
            });
        }
        // Admitted while not in debt: the request's tokens are charged at
        // its end.
        if let Some(wait) = st.tokens.as_mut().and_then(|b| b.wait(0, now)) {
            return Err(Refusal {
                limit: Limit::TokensPerMinute,
                retry_after: wait,
            });
        }
        if let Some(b) = &mut st.requests {
            b.take(1, now);
        }
        st.in_flight += 1;
        Ok(InFlight {
            tenant: Some(self.clone()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few field updates, consistent between
        // statements: a panic elsewhere does not poison what they mean.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An admitted request: holds its place in the tenant's `max_in_flight`
/// until dropped.
#[must_use = "dropping the guard ends the request's place in flight"]
#[derive(Debug)]
pub struct InFlight {
    /// None for a tenant without limits: nothing to count or release.
    tenant: Option<Arc<Tenant>>,
}

impl InFlight {
    /// The request ended at the time `now` gives having used `tokens`
    /// (prompt + completion, as vLLM reported them): charge them to
    /// `tokens_per_minute` and free the place in flight.
    pub fn charge(self, tokens: u64, now: impl FnOnce() -> Instant) {
        if let Some(t) = &self.tenant {
            if let Some(b) = &mut t.lock().tokens {
                b.take(tokens, now());
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(t) = &self.tenant {
            t.lock().in_flight -= 1;
        }
    }
}
