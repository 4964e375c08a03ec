//! [`Subscribe`]: the background service that keeps each pool with
//! `kv_events` subscribed to its current members' events
//! (`crate::kv_events`), following discovery as its members change.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::ModelPool;
use crate::kv_events::Subscriptions;

/// How often the pools' members are compared with the subscriptions.
const FOLLOW: Duration = Duration::from_secs(1);

pub struct Subscribe {
    pools: Vec<(Arc<ModelPool>, Mutex<Subscriptions>)>,
}

impl Subscribe {
    /// The service of `pools` whose models have `kv_events`; none if no
    /// model has.
    pub fn of(pools: impl IntoIterator<Item = Arc<ModelPool>>) -> Option<Subscribe> {
        let pools: Vec<_> = pools
            .into_iter()
            .filter_map(|pool| {
                let policy = pool.routing.policy();
                let (exact, index) = (policy.exact.as_ref()?, pool.routing.index()?);
                let max = exact.index.max_blocks;
                let subs = Subscriptions::new(
                    pool.name.as_str().into(),
                    exact.endpoints.clone(),
                    index.clone(),
                    max,
                );
                Some((pool, Mutex::new(subs)))
            })
            .collect();
        (!pools.is_empty()).then_some(Subscribe { pools })
    }

    fn follow(&self) {
        for (pool, subs) in &self.pools {
            let members = pool.members();
            subs.lock()
                .unwrap_or_else(|e| e.into_inner())
                .follow(members.addrs());
        }
    }
}

#[async_trait]
impl BackgroundService for Subscribe {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            self.follow();
            tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        for (_, subs) in &self.pools {
                            subs.lock().unwrap_or_else(|e| e.into_inner()).follow(&[]);
                        }
                        return;
                    }
                }
                () = tokio::time::sleep(FOLLOW) => {}
            }
        }
    }
}
