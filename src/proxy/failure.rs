//! A failed attempt: whether to retry (`failover::decide`), the failed
//! backend excluded for the window and forgotten by routing, and the
//! request routed again among the backends it has not failed on.

use std::net::SocketAddr;
use std::time::Instant;

use log::warn;
use pingora::prelude::*;
use pingora::proxy::Session;
use pingora::ErrorType;

use super::ctx::Phase;
use super::respond::Stop;
use super::{shape, Gateway, RequestCtx};
use crate::failover::{self, Decision, Failure};
use crate::pool::Members;

impl Gateway {
    /// Act on a failed attempt as the retry policy decides; true to retry.
    pub(super) fn on_failure(&self, ctx: &mut RequestCtx, failure: Failure, e: &Error) -> bool {
        let Some(routed) = ctx.routed_mut() else {
            return false;
        };
        let addr = routed.attempt.candidate.addr;
        let decision = failover::decide(&failure);
        let excluded = match decision {
            Decision::GiveUp => return false,
            // Its pooled connection was closed: connect again, same slot.
            Decision::Reconnect => false,
            Decision::ExcludeAndRetry => {
                routed.attempt.failed = true;
                routed.input.failed_on(addr);
                // Restarted or not, its cache is no longer known.
                routed.pool.routing.forget(&addr);
                self.exclude(&routed.pool.name, &routed.attempt.members, addr, e)
            }
        };
        if let Some(span) = &mut ctx.trace {
            let reconnect = decision == Decision::Reconnect;
            span.retry(addr, e.etype().as_str(), reconnect);
            if excluded {
                span.excluded(addr, self.config.failure_exclusion);
            }
        }
        true
    }

    /// The failed attempt's slot is freed and the request routed again,
    /// among the backends it has not failed on. When none takes it, the
    /// request is unserved and the answer is the error.
    pub(super) async fn retry(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<()> {
        let Some(routed) = ctx.routed_mut() else {
            return Ok(());
        };
        if let Some(permit) = routed.attempt.permit.take() {
            permit.refund();
        }
        let pool = routed.pool.clone();
        let share = routed.held.tenant().share().clone();
        let admitted = self.admit(session, &pool, &routed.input, &share, routed.demand);
        let stop = match admitted.await {
            Ok(mut attempt) => {
                attempt.queued += routed.attempt.queued;
                routed.attempt = attempt;
                return Ok(());
            }
            Err(stop) => stop,
        };
        ctx.phase = Phase::Unserved(pool);
        match stop {
            Stop::ClientGone(e) => Err(e),
            Stop::Answer(e) => {
                let status = e.status(shape(session));
                ctx.error = Some(e);
                Err(Error::explain(
                    ErrorType::HTTPStatus(status),
                    "no backend left to retry on",
                ))
            }
        }
    }

    /// A backend failed before answering: count it, leave it out for the
    /// window, and say why (a refused connection, a certificate that did not
    /// verify, ...). True if this began its exclusion.
    fn exclude(&self, model: &str, members: &Members, addr: SocketAddr, why: &Error) -> bool {
        if let Some(series) = members.series(&addr) {
            series.failures.inc();
        }
        let began = members.exclusions().exclude(addr, Instant::now());
        if began {
            warn!(
                event = "backend_excluded",
                model = model,
                backend:display = addr,
                for_secs = self.config.failure_exclusion.as_secs(),
                error = why.etype().as_str(),
                reason:display = why;
                ""
            );
        }
        began
    }
}
