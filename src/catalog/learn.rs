//! [`Learn`]: the background service that asks every learned pool's
//! backends for their model list, at start and then every `every` (each
//! answer within `every`), and hands the answers to the [`Catalog`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::HeaderValue;
use log::{info, warn};
use pingora::connectors::http::Connector;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::task::JoinSet;

use super::{cards, Card, Catalog};
use crate::metrics;
use crate::upstream;

/// The most of a model list read: thousands of adapters fit.
const MAX_LIST_BYTES: usize = 4 << 20;

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
            while let Some(Ok((addr, answer))) = asks.join_next().await {
                if let Some(series) = members.series(&addr) {
                    let labels = [pool.name.as_str(), series.label.as_str()];
                    match &answer {
                        Some(cards) => metrics::LEARNED_MODELS
                            .with_label_values(&labels)
                            .set(cards.len() as i64),
                        None => metrics::LEARN_FAILURES.with_label_values(&labels).inc(),
                    }
                }
                answers.push((addr, answer));
            }
            let changes = self.catalog.update(i, members.addrs(), answers);
            for name in changes.added {
                info!(event = "model_learned", model = name.as_str(), pool = pool.name.as_str(); "");
            }
            for name in changes.removed {
                warn!(event = "model_gone", model = name.as_str(), pool = pool.name.as_str(); "no backend lists it any more: 404 from now on");
            }
        }
    }
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
