//! Taking a slot (CAG-2): the warmup delay, then a slot on the first of the
//! request's candidates (see `routing`), or with `overflow: spill` on the
//! first that has room.

use std::net::SocketAddr;
use std::time::Instant;

use log::warn;
use pingora::proxy::Session;

use super::respond::{until_client_leaves, Stop};
use super::{Attempt, AttemptState, Gateway, RequestCtx};
use crate::admission::{AdmitError, Class};
use crate::config::Overflow;
use crate::errors::ApiError;
use crate::metrics;
use crate::pool::Members;
use crate::routing::Route;

impl Gateway {
    /// CAG-2 AC1/AC6: a warmup sleeps before it competes for a slot, holding
    /// neither a slot nor a queue place, so agent requests that arrive
    /// meanwhile go first.
    pub(super) async fn warmup_delay(&self, session: &mut Session) -> Result<(), Stop> {
        let delay = self.config.warmup.delay;
        if delay.is_zero() {
            return Ok(());
        }
        metrics::WARMUP_DELAYED.inc();
        until_client_leaves(session, tokio::time::sleep(delay)).await
    }

    /// Choose the backend and wait for a slot on it: the first candidate,
    /// or with `overflow: spill` the first that has room. On success the
    /// attempt, with its permit, is in `ctx`.
    pub(super) async fn admit(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<(), Stop> {
        let Some(pool) = ctx.pool.clone() else {
            return Err(ApiError::BadRequest("no model".into()).into());
        };
        // The set as it is now: a retry after a change sees the new one.
        let members = pool.members();
        ctx.members = Some(members.clone());
        let now = Instant::now();
        let path = session.req_header().uri.path();
        let moved_to = if pool.moves.is_empty() {
            None
        } else {
            ctx.conversation(&pool, path)
                .and_then(|c| pool.moves.get(c, now))
        };
        let candidates = members
            .candidates(ctx.routing_request(moved_to), now)
            .map_err(|retry_after| ApiError::NoBackend {
                model: pool.name.clone(),
                retry_after,
            })?;
        let class = if ctx.warmup {
            Class::Warmup
        } else {
            Class::Agent
        };
        let tries = match self.config.overflow {
            Overflow::Spill => candidates.len(),
            Overflow::Reject => 1,
        };
        let entered = candidates.iter().take(tries).find_map(|c| {
            let ticket = members.admission(&c.addr)?.try_enter(class).ok()?;
            Some((*c, ticket))
        });
        let Some((candidate, ticket)) = entered else {
            refused(
                &pool.name,
                &members,
                &candidates[0].addr,
                AdmitError::QueueFull,
            );
            return Err(ApiError::QueueFull {
                model: pool.name.clone(),
            }
            .into());
        };
        if candidate.route == Route::Balance || !pool.moves.is_empty() {
            if let Some(conversation) = ctx.conversation(&pool, path) {
                pool.moves
                    .record(conversation, candidate.route, candidate.addr, now);
            }
        }
        let waited = Instant::now();
        let permit = until_client_leaves(session, ticket.wait(self.config.queue_timeout))
            .await?
            .map_err(|e| {
                refused(&pool.name, &members, &candidate.addr, e);
                ApiError::QueueTimeout {
                    model: pool.name.clone(),
                }
            })?;
        metrics::QUEUE_WAIT.observe(waited.elapsed().as_secs_f64());
        ctx.attempt = Some(Attempt {
            candidate,
            permit: Some(permit),
            state: AttemptState::Admitted,
            response_started: false,
        });
        Ok(())
    }
}

/// Count and log an admission refusal: one event each.
fn refused(model: &str, members: &Members, addr: &SocketAddr, why: AdmitError) {
    let backend = addr.to_string();
    let reason = match why {
        AdmitError::QueueFull => "queue_full",
        AdmitError::QueueTimeout => "queue_timeout",
    };
    metrics::QUEUE_REJECTED
        .with_label_values(&[model, &backend, reason])
        .inc();
    let Some(admission) = members.admission(addr) else {
        return;
    };
    let (inflight, depth) = admission.counts();
    warn!(
        event = reason,
        model = model,
        backend = backend.as_str(),
        inflight = inflight,
        depth = depth,
        max_queue_depth = admission.limits().max_queue_depth;
        ""
    );
}
