//! Taking a slot: the warmup delay, then a slot on the first of the
//! request's candidates (see `routing`), or with `overflow: spill` on the
//! first that has room.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::warn;
use pingora::proxy::Session;

use super::respond::{until_client_leaves, Stop};
use super::{stored, Attempt, Gateway};
use crate::admission::{AdmitError, Class, Demand, Share, Ticket};
use crate::api::Api;
use crate::config::Overflow;
use crate::errors::ApiError;
use crate::metrics;
use crate::pool::{Members, ModelPool};
use crate::routing::{Routable, Unroutable};

/// A warmup sleeps `delay` before it competes for a slot, holding neither
/// a slot nor a queue place, so agent requests that arrive meanwhile go
/// first.
pub(super) async fn warmup_delay(session: &mut Session, delay: Duration) -> Result<(), Stop> {
    if delay.is_zero() {
        return Ok(());
    }
    metrics::WARMUP_DELAYED.inc();
    until_client_leaves(session, tokio::time::sleep(delay)).await
}

impl Gateway {
    /// Route the request and wait for a slot: on its first candidate, or
    /// with `overflow: spill` on the first that has room. `demand`: what it
    /// asks of a backend holding none of its prompt.
    pub(super) async fn admit(
        &self,
        session: &mut Session,
        pool: &Arc<ModelPool>,
        input: &Routable,
        tenant: &Share,
        demand: Demand,
    ) -> Result<Attempt, Stop> {
        let class = if input.warmup() {
            Class::Warmup
        } else {
            Class::Agent
        };
        // The set as it is now: a retry after a change sees the new one.
        let members = pool.members();
        let mut routed = members.route(&pool.routing, input, Instant::now());
        if let Err(Unroutable::OwnerUnknown(id)) = &routed {
            let id = id.clone();
            until_client_leaves(session, self.stored_owner(&id, &[pool])).await??;
            routed = members.route(&pool.routing, input, Instant::now());
        } else if routed.is_ok() && input.stored().is_some() && input.api() != Api::Stored {
            // A retrieve or cancel was counted when its model was found.
            stored::count("known");
        }
        let plan = routed.map_err(|why| unroutable(pool, &members, why))?;
        if !input.api().describe().takes_slot {
            let candidate = plan.first();
            let expected_tokens = plan.expected_tokens(candidate.addr);
            plan.admitted(candidate);
            return Ok(Attempt {
                members,
                candidate,
                permit: None,
                failed: false,
                queued: Duration::ZERO,
                response_started: false,
                expected_tokens,
            });
        }
        let tries = match self.config.overflow {
            Overflow::Spill => usize::MAX,
            Overflow::Reject => 1,
        };
        let entered = plan.candidates().take(tries).find_map(|c| {
            let cached = plan.expected_tokens(c.addr).unwrap_or(0);
            let admission = members.admission(&c.addr)?;
            let ticket = admission.try_enter(class, tenant, demand.holding(cached));
            Some((c, ticket.ok()?))
        });
        let Some((candidate, ticket)) = entered else {
            let first = plan.first().addr;
            return Err(refused(pool, &members, &first, tenant, AdmitError::QueueFull).into());
        };
        let expected_tokens = plan.expected_tokens(candidate.addr);
        plan.admitted(candidate);
        let (permit, queued) = match ticket {
            // The clock is read only for a wait.
            Ticket::Ready(permit) => (permit, Duration::ZERO),
            ticket => {
                let waited = Instant::now();
                let permit = until_client_leaves(session, ticket.wait(self.config.queue_timeout))
                    .await?
                    // Waited too long, or its place went to a tenant within
                    // its share (`admission::fair`).
                    .map_err(|e| refused(pool, &members, &candidate.addr, tenant, e))?;
                (permit, waited.elapsed())
            }
        };
        metrics::QUEUE_WAIT.observe(queued.as_secs_f64());
        Ok(Attempt {
            members,
            candidate,
            permit: Some(permit),
            failed: false,
            queued,
            response_started: false,
            expected_tokens,
        })
    }
}

/// The error for a request routing found no backend for.
fn unroutable(pool: &ModelPool, members: &Members, why: Unroutable) -> ApiError {
    let now = Instant::now();
    match why {
        Unroutable::NoBackend => ApiError::NoBackend {
            model: pool.name.clone(),
            retry_after: members.exclusions().retry_after(now),
        },
        Unroutable::OwnerUnknown(id) => ApiError::StoredUnavailable {
            id,
            detail: "no backend said it has it".into(),
            retry_after: None,
        },
        Unroutable::OwnerUnavailable { id, owner } => {
            stored::count("unavailable");
            let excluded = members.exclusions().remaining(&owner, now);
            let detail = match excluded {
                Some(_) => format!("its backend {owner} is excluded after a failure"),
                None if members.addrs().contains(&owner) => {
                    format!("its backend {owner} failed this request")
                }
                None => format!("its backend {owner} no longer serves model `{}`", pool.name),
            };
            ApiError::StoredUnavailable {
                id,
                detail: format!("{detail}; no other backend has it"),
                retry_after: excluded,
            }
        }
    }
}

/// Count and log an admission refusal (one event each), and the client's
/// error.
fn refused(
    pool: &ModelPool,
    members: &Members,
    addr: &SocketAddr,
    tenant: &Share,
    why: AdmitError,
) -> ApiError {
    let model = pool.name.as_str();
    let backend = addr.to_string();
    let (reason, error) = match why {
        AdmitError::QueueFull => (
            "queue_full",
            ApiError::QueueFull {
                model: model.into(),
            },
        ),
        AdmitError::QueueTimeout => (
            "queue_timeout",
            ApiError::QueueTimeout {
                model: model.into(),
            },
        ),
    };
    metrics::QUEUE_REJECTED
        .with_label_values(&[model, &backend, reason])
        .inc();
    super::tenant::rejected(tenant.name(), reason);
    if let Some(admission) = members.admission(addr) {
        let (inflight, depth) = admission.counts();
        warn!(
            event = reason,
            model = model,
            backend = backend.as_str(),
            tenant = tenant.name(),
            inflight = inflight,
            depth = depth,
            max_queue_depth = admission.limits().max_queue_depth;
            ""
        );
    }
    error
}
