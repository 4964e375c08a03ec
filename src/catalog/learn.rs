//! [`Learn`]: the background service that asks every learned pool's
//! backends for their model list, at start and then every `every` (each
//! answer within `every`), and hands the answers to the [`Catalog`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use http::HeaderValue;
use log::{info, warn};
use pingora::connectors::http::Connector;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::task::JoinSet;

use super::{cards, Card, Catalog};
use crate::config::is_model_name;
use crate::metrics;
use crate::pool::ModelPool;
use crate::upstream;

/// The most of a model list read: thousands of adapters fit. A larger
/// list is not read, and counted as a failed one.
const MAX_LIST_BYTES: usize = 4 << 20;

/// The names a round's log line shows of those it added or removed.
const NAMES_SHOWN: usize = 5;

pub struct Learn {
    pub catalog: Arc<Catalog>,
    pub connector: Arc<Connector>,
    /// `upstream_api_key`, as vLLM's `--api-key` expects it.
    pub authorization: Option<HeaderValue>,
    pub every: Duration,
}

#[async_trait]
impl BackgroundService for Learn {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            self.round().await;
            tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
                () = tokio::time::sleep(self.every) => {}
            }
        }
    }
}

impl Learn {
    /// Ask every backend of every learned pool, all at once.
    pub async fn round(&self) {
        for (i, pool) in self.catalog.pools().iter().enumerate() {
            let members = pool.members();
            let asked = Instant::now();
            let mut answers = self.ask(pool).await;
            for (addr, answer) in &mut answers {
                let Some(series) = members.series(addr) else {
                    continue;
                };
                let labels = [pool.name.as_str(), series.label.as_str()];
                let Some(cards) = answer else {
                    metrics::LEARN_FAILURES.with_label_values(&labels).inc();
                    continue;
                };
                let listed = cards.len();
                cards.retain(|c| is_model_name(&c.id));
                let refused = listed - cards.len();
                if refused > 0 {
                    let labels = metrics::REFUSED_NAMES.with_label_values(&labels);
                    labels.inc_by(refused as u64);
                }
                metrics::LEARNED_MODELS
                    .with_label_values(&labels)
                    .set(cards.len() as i64);
            }
            let changes = self.catalog.update(i, members.addrs(), answers, asked);
            let pool = pool.name.as_str();
            if !changes.added.is_empty() {
                let (count, models) = summary(&changes.added);
                info!(event = "model_learned", pool, count, models:serde; "");
            }
            if !changes.removed.is_empty() {
                let (count, models) = summary(&changes.removed);
                warn!(event = "model_gone", pool, count, models:serde; "no backend lists them any more: 404 from now on");
            }
        }
    }

    /// What `-t` says of the learned pools, asking each backend once: the
    /// names a backend lists that the configuration also gives a model (at
    /// run time the configured model serves them), and the backends that
    /// did not answer.
    pub async fn check(&self) -> Check {
        let mut check = Check::default();
        for pool in self.catalog.pools() {
            for (addr, answer) in self.ask(pool).await {
                let at = format!("{}: backend {addr}", pool.name);
                match answer {
                    None => check.silent.push(at),
                    Some(cards) => check.clashes.extend(
                        (cards.into_iter())
                            .filter(|c| self.catalog.is_configured(&c.id))
                            .map(|c| format!("{at} serves {:?}", c.id)),
                    ),
                }
            }
        }
        check
    }

    /// Every backend of `pool` asked at once, each answer within `every`.
    async fn ask(&self, pool: &ModelPool) -> Vec<(SocketAddr, Option<Vec<Card>>)> {
        let members = pool.members();
        let mut asks = JoinSet::new();
        for &addr in members.addrs() {
            let (connector, peer) = (self.connector.clone(), members.peer(addr));
            let request = upstream::get("/v1/models", addr, self.authorization.as_ref());
            let every = self.every;
            asks.spawn(async move {
                let ask = async { list(&connector, &peer, request?).await };
                (addr, tokio::time::timeout(every, ask).await.ok().flatten())
            });
        }
        let mut answers = Vec::new();
        while let Some(Ok(answer)) = asks.join_next().await {
            answers.push(answer);
        }
        answers.sort_by_key(|(addr, _)| *addr);
        answers
    }
}

/// How many names, and the first few.
fn summary(names: &[String]) -> (usize, &[String]) {
    (names.len(), &names[..names.len().min(NAMES_SHOWN)])
}

/// [`Learn::check`]'s findings, each naming the pool and backend.
#[derive(Debug, Default)]
pub struct Check {
    pub clashes: Vec<String>,
    pub silent: Vec<String>,
}

/// A backend's model list; None when it failed or is not one.
async fn list(
    connector: &Connector,
    peer: &pingora::prelude::HttpPeer,
    request: pingora::http::RequestHeader,
) -> Option<Vec<Card>> {
    let mut session = upstream::send(connector, peer, request, None).await?;
    if session.response_header()?.status != 200 {
        return None;
    }
    cards(&upstream::body(&mut session, MAX_LIST_BYTES).await)
}
