//! Who a request is for: the tenant its credential (or a trusted header)
//! names, its budgets checked before it is queued, and what it holds until
//! its response ends. The policy is `crate::tenants`'; this is the glue.

use std::sync::Arc;
use std::time::Instant;

use log::warn;
use pingora::http::RequestHeader;

use super::Gateway;
use crate::accounting::Usage;
use crate::errors::ApiError;
use crate::metrics;
use crate::tenants::{self, InFlight, Tenant};

/// The longest header value taken as a tenant name.
const MAX_HEADER_NAME_BYTES: usize = 256;

/// What an admitted request holds of its tenant until its response ends:
/// its place in flight (budget and gauge), released together.
pub struct Held {
    tenant: Arc<Tenant>,
    budget: Option<InFlight>,
}

impl Held {
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }

    /// The response ended: charge the tokens it used to the budget and free
    /// its place. Later calls do nothing.
    pub fn end(&mut self, usage: Usage) {
        if let Some(budget) = self.budget.take() {
            let tokens = usage.prompt_tokens.unwrap_or(0) + usage.completion_tokens.unwrap_or(0);
            budget.charge(tokens, Instant::now);
            self.tenant.series().in_flight().dec();
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.budget.take().is_some() {
            self.tenant.series().in_flight().dec();
        }
    }
}

impl Gateway {
    /// The tenant of a request: `authenticated` (the credential's), else
    /// the trusted header's value (without auth), else `default`.
    pub(super) fn tenant_of(
        &self,
        req: &RequestHeader,
        authenticated: Option<Arc<str>>,
    ) -> Arc<Tenant> {
        let from_header = || {
            let header = self.config.tenants.header.as_ref()?;
            let value = req.headers.get(header)?.to_str().ok()?.trim();
            (!value.is_empty() && value.len() <= MAX_HEADER_NAME_BYTES).then_some(value)
        };
        let name = authenticated
            .as_deref()
            .or_else(from_header)
            .unwrap_or(tenants::DEFAULT);
        let lookup = self.tenants.get(name);
        if lookup.first_overflow {
            warn!(
                event = "tenants_overflow",
                max_tracked = self.config.tenants.max_tracked;
                "more unlisted tenant names than tenants.max_tracked: the rest share the label `other`"
            );
        }
        lookup.tenant
    }

    /// Check `tenant`'s budgets for one more request: 429 at once when it
    /// is at or over one.
    pub(super) fn hold(&self, tenant: &Arc<Tenant>) -> Result<Held, ApiError> {
        let budget = tenant.admit(Instant::now).map_err(|refusal| {
            let limit = refusal.limit.as_str();
            rejected(tenant.label(), limit);
            ApiError::OverBudget {
                tenant: tenant.label().to_string(),
                limit,
                retry_after: refusal.retry_after,
            }
        })?;
        tenant.series().in_flight().inc();
        Ok(Held {
            tenant: tenant.clone(),
            budget: Some(budget),
        })
    }
}

/// Count a refusal of a request of `tenant` (its label) for `reason`.
pub fn rejected(tenant: &str, reason: &str) {
    metrics::TENANT_REJECTED
        .with_label_values(&[tenant, reason])
        .inc();
    log::debug!(event = "tenant_refused", tenant = tenant, reason = reason; "");
}
