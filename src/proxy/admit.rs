//! Choosing the backend and taking a slot on it (CAG-2): the warmup delay,
//! then the first usable backend in the request's ranking, or with
//! `overflow: spill` the first that has room.

use std::net::SocketAddr;
use std::time::Instant;

use log::warn;
use pingora::proxy::Session;

use super::respond::{until_client_leaves, Stop};
use super::{Gateway, RequestCtx};
use crate::admission::{AdmitError, Class};
use crate::config::Overflow;
use crate::errors::ApiError;
use crate::metrics;
use crate::pool::{ModelPool, Route};

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

    /// Choose the backend and wait for a slot on it. On success the choice
    /// and its permit are in `ctx`.
    pub(super) async fn admit(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<(), Stop> {
        let pool = ctx
            .pool
            .clone()
            .expect("admit runs after the model is known");
        let ranked = pool
            .ranked(ctx.key(), &ctx.tried, Instant::now())
            .map_err(|retry_after| ApiError::NoBackend {
                model: pool.name.clone(),
                retry_after,
            })?;
        let class = if ctx.warmup {
            Class::Warmup
        } else {
            Class::Agent
        };
        let spill = self.config.overflow == Overflow::Spill;
        let mut entered = None;
        for (i, pick) in ranked.iter().enumerate() {
            match pool.admission(&pick.addr).try_enter(class) {
                Ok(ticket) => {
                    let mut pick = pick.clone();
                    if i > 0 {
                        pick.route = Route::Spill;
                    }
                    entered = Some((pick, ticket));
                    break;
                }
                Err(_) if spill => continue,
                Err(_) => break,
            }
        }
        let Some((pick, ticket)) = entered else {
            refused(&pool, &ranked[0].addr, AdmitError::QueueFull);
            return Err(ApiError::QueueFull {
                model: pool.name.clone(),
            }
            .into());
        };
        let waited = Instant::now();
        let permit = until_client_leaves(session, ticket.wait(self.config.queue_timeout))
            .await?
            .map_err(|e| {
                refused(&pool, &pick.addr, e);
                ApiError::QueueTimeout {
                    model: pool.name.clone(),
                }
            })?;
        metrics::QUEUE_WAIT.observe(waited.elapsed().as_secs_f64());
        ctx.pick = Some(pick);
        ctx.permit = Some(permit);
        Ok(())
    }
}

/// Count and log an admission refusal: one JSON line each.
fn refused(pool: &ModelPool, addr: &SocketAddr, why: AdmitError) {
    let backend = addr.to_string();
    let reason = match why {
        AdmitError::QueueFull => "queue_full",
        AdmitError::QueueTimeout => "queue_timeout",
    };
    metrics::QUEUE_REJECTED
        .with_label_values(&[&pool.name, &backend, reason])
        .inc();
    let admission = pool.admission(addr);
    let (inflight, depth) = admission.load();
    warn!(
        "{}",
        serde_json::json!({
            "event": reason,
            "model": pool.name,
            "backend": backend,
            "inflight": inflight,
            "depth": depth,
            "max_queue_depth": admission.limits().max_queue_depth,
        })
    );
}
