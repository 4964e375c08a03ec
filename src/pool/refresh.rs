//! [`Refresh`]: the background service that runs the pools' discovery
//! (`ModelPool::refresh`) every `discovery.refresh_secs`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::ModelPool;

/// Re-resolves the pools that use names, every `every`.
pub struct Refresh {
    pub pools: Vec<Arc<ModelPool>>,
    pub every: Duration,
}

#[async_trait]
impl BackgroundService for Refresh {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
                () = tokio::time::sleep(self.every) => {
                    // Side by side: a model whose DNS server is down (its
                    // lookups wait out their deadline) delays no other.
                    let mut rounds = tokio::task::JoinSet::new();
                    for pool in &self.pools {
                        let pool = pool.clone();
                        rounds.spawn(async move { pool.refresh().await });
                    }
                    while rounds.join_next().await.is_some() {}
                }
            }
        }
    }
}
