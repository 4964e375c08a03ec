//! Stored responses (Responses API): when routing does not know which
//! backend stored a response, the backends are asked (`GET
//! /v1/responses/{id}`, concurrently, each within the lookup timeout) and
//! routing is told the answer (`routing::owners::verdict` reads them).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use tokio::task::JoinSet;

use super::Gateway;
use crate::errors::ApiError;
use crate::metrics;
use crate::pool::ModelPool;
use crate::routing::owners::{verdict, Answer, Verdict};
use crate::upstream;

/// The most of a backend's 404 body kept, to hand to the client.
const NOT_FOUND_BODY_BYTES: usize = 16 * 1024;

/// How the gateway asks a backend about a stored response.
pub struct Lookup {
    connector: Arc<Connector>,
    /// `upstream_api_key`, as vLLM's `--api-key` expects it.
    authorization: Option<HeaderValue>,
    timeout: Duration,
}

impl Lookup {
    pub fn new(connector: Connector, upstream_api_key: Option<&str>, timeout: Duration) -> Self {
        Lookup {
            connector: Arc::new(connector),
            authorization: upstream::authorization(upstream_api_key),
            timeout,
        }
    }

    /// Ask each of `backends` whether it stored response `id`, all at once.
    async fn ask_all(
        &self,
        id: &str,
        backends: Vec<(SocketAddr, HttpPeer)>,
    ) -> Vec<(SocketAddr, Answer)> {
        let mut asks = JoinSet::new();
        for (addr, peer) in backends {
            let connector = self.connector.clone();
            let request = self.request(id, addr);
            let timeout = self.timeout;
            asks.spawn(async move {
                let answer = tokio::time::timeout(timeout, ask(&connector, &peer, request?))
                    .await
                    .unwrap_or(Answer::Failed);
                Some((addr, answer))
            });
        }
        let mut answers = Vec::new();
        while let Some(joined) = asks.join_next().await {
            answers.extend(joined.ok().flatten());
        }
        answers
    }

    fn request(&self, id: &str, addr: SocketAddr) -> Option<RequestHeader> {
        let path = format!("/v1/responses/{id}");
        upstream::get(&path, addr, self.authorization.as_ref())
    }
}

/// One backend's answer; anything but 200 or 404 is a failure.
async fn ask(connector: &Connector, peer: &HttpPeer, request: RequestHeader) -> Answer {
    let Some(mut session) = upstream::send(connector, peer, request, None).await else {
        return Answer::Failed;
    };
    match session.response_header().map(|h| h.status.as_u16()) {
        // The connection is not reused: the stored response need not be read.
        Some(200) => Answer::Has,
        Some(404) => Answer::NotFound(
            upstream::body(&mut session, NOT_FOUND_BODY_BYTES)
                .await
                .into(),
        ),
        _ => Answer::Failed,
    }
}

impl Gateway {
    /// The pool, among `pools`, whose backend stored response `id`: asked
    /// of every backend when the gateway does not know it (then
    /// remembered).
    pub(super) async fn stored_owner(
        &self,
        id: &str,
        pools: &[&Arc<ModelPool>],
    ) -> Result<Arc<ModelPool>, ApiError> {
        let now = Instant::now();
        let known = self.owners.get(id, now);
        if let Some(pool) = known.and_then(|o| pools.iter().find(|p| *p.name == *o.model)) {
            count("known");
            return Ok((*pool).clone());
        }
        let mut backends: Vec<(SocketAddr, HttpPeer)> = Vec::new();
        for pool in pools {
            let members = pool.members();
            for addr in members.addrs() {
                if !backends.iter().any(|(a, _)| a == addr) {
                    backends.push((*addr, members.peer(*addr)));
                }
            }
        }
        let unavailable = |detail: String, retry_after| ApiError::StoredUnavailable {
            id: id.to_string(),
            detail,
            retry_after,
        };
        match verdict(self.lookup.ask_all(id, backends).await) {
            Some(Verdict::Found(addr)) => {
                count("found");
                let pool = pools.iter().find(|p| p.members().addrs().contains(&addr));
                let pool = pool.ok_or_else(|| unavailable(format!("{addr} left"), None))?;
                pool.routing.owner_found(id, addr, Instant::now());
                Ok((*pool).clone())
            }
            Some(Verdict::NotFound(body)) => {
                count("not_found");
                Err(ApiError::StoredNotFound(body))
            }
            Some(Verdict::Unknown(silent)) => {
                count("no_answer");
                let silent: Vec<String> = silent.iter().map(|a| a.to_string()).collect();
                let detail = format!(
                    "no backend that answered has it, and {} did not answer",
                    silent.join(", ")
                );
                Err(unavailable(detail, Some(Duration::from_secs(1))))
            }
            None => {
                count("no_answer");
                Err(unavailable("the model has no backend".into(), None))
            }
        }
    }
}

pub(super) fn count(result: &str) {
    metrics::RESPONSE_OWNER_LOOKUPS
        .with_label_values(&[result])
        .inc();
}
