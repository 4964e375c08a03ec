//! Models learned from the backends: a pool configured without a name
//! serves whatever its backends list in `GET /v1/models` (each model and
//! LoRA adapter, asked every `discovery.refresh_secs` by `learn.rs`). A name
//! is routed only to the backends that list it; a backend that does not
//! answer keeps its last answer; a name no backend lists any more is gone
//! after the next round. A configured model's name wins over a learned one
//! (`-t` refuses the clashes it finds, [`Learn::check`]), and of two learned
//! pools listing a name, the first in the file serves it.

mod learn;
mod load;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use serde::Deserialize;

use crate::pool::ModelPool;
pub use learn::{Check, Learn};
pub use load::{adapter_path, Failed, Loaded, Loader, FAILED_LOAD_KEPT};

/// One entry of a backend's model list, as vLLM writes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Card {
    pub id: String,
    /// A LoRA adapter's base model.
    #[serde(default)]
    pub parent: Option<String>,
}

#[derive(Deserialize)]
struct List {
    data: Vec<Card>,
}

impl Card {
    /// An adapter loaded by name, its base not known until the backend
    /// lists it.
    pub fn named(id: &str) -> Self {
        Card {
            id: id.to_string(),
            parent: None,
        }
    }
}

/// The cards of a `GET /v1/models` body.
pub fn cards(body: &[u8]) -> Option<Vec<Card>> {
    serde_json::from_slice::<List>(body).ok().map(|l| l.data)
}

/// A learned name: the pool that serves it, and which of its backends.
pub struct Served<P = ModelPool> {
    pub pool: Arc<P>,
    /// The backends that list it, sorted.
    pub backends: Arc<[SocketAddr]>,
    /// For an adapter, its base model.
    pub parent: Option<String>,
}

impl<P> Served<P> {
    pub fn serves(&self, addr: &SocketAddr) -> bool {
        self.backends.binary_search(addr).is_ok()
    }
}

/// What the learned pools' backends serve.
pub struct Catalog<P = ModelPool> {
    pools: Vec<Arc<P>>,
    /// Per pool: where its adapters are loaded from on demand.
    adapter_dirs: Vec<Option<PathBuf>>,
    /// Names the configuration gives a model: never learned.
    configured: HashSet<String>,
    /// Per pool (as `pools`), what each backend lists.
    answers: Mutex<Vec<HashMap<SocketAddr, Listed>>>,
    names: ArcSwap<HashMap<String, Arc<Served<P>>>>,
}

/// What one backend serves, as far as the gateway knows.
#[derive(Debug, Clone, Default)]
struct Listed {
    /// Its last answer, and the adapters loaded on it since.
    cards: Vec<Card>,
    /// The adapters loaded on it and when: a list asked before a load ended
    /// (in flight while it ran) does not know of it, so a load is kept
    /// until a list asked after it confirms or drops it.
    loads: Vec<(Card, Instant)>,
}

/// The names a round added and removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

impl<P> Catalog<P> {
    pub fn new(pools: Vec<Arc<P>>, configured: HashSet<String>) -> Self {
        let answers = Mutex::new(vec![HashMap::new(); pools.len()]);
        Catalog {
            adapter_dirs: vec![None; pools.len()],
            pools,
            configured,
            answers,
            names: ArcSwap::default(),
        }
    }

    /// Pool `i`'s adapters are loaded on demand from `dirs[i]`.
    pub fn with_adapter_dirs(mut self, dirs: Vec<Option<PathBuf>>) -> Self {
        self.adapter_dirs = dirs;
        self
    }

    pub fn pools(&self) -> &[Arc<P>] {
        &self.pools
    }

    /// The configuration gives a model this name.
    pub fn is_configured(&self, name: &str) -> bool {
        self.configured.contains(name)
    }

    /// The first pool whose adapter directory holds adapter `name`: its
    /// position, itself and the adapter's path.
    pub fn loadable(&self, name: &str) -> Option<(usize, Arc<P>, PathBuf)> {
        let dirs = self.adapter_dirs.iter().enumerate();
        dirs.filter_map(|(i, dir)| Some((i, adapter_path(dir.as_ref()?, name)?)))
            .map(|(i, path)| (i, self.pools[i].clone(), path))
            .next()
    }

    /// The pool and backends that serve `name`, if a backend lists it.
    pub fn served(&self, name: &str) -> Option<Arc<Served<P>>> {
        self.names.load().get(name).cloned()
    }

    /// Every learned name and its parent, by name.
    pub fn list(&self) -> Vec<(String, Option<String>)> {
        let names = self.names.load();
        let sorted: BTreeMap<_, _> = names.iter().map(|(n, s)| (n, &s.parent)).collect();
        sorted
            .into_iter()
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect()
    }

    /// Pool `pool`'s round, asked at `asked`: `answers` of its `members`
    /// (None: it did not answer, and keeps its last). A backend no longer a
    /// member is forgotten.
    pub fn update(
        &self,
        pool: usize,
        members: &[SocketAddr],
        answers: Vec<(SocketAddr, Option<Vec<Card>>)>,
        asked: Instant,
    ) -> Changes {
        let mut all = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let kept = &mut all[pool];
        kept.retain(|addr, _| members.contains(addr));
        for (addr, answer) in answers {
            let Some(mut cards) = answer else { continue };
            let listed = kept.entry(addr).or_default();
            listed.loads.retain(|(_, at)| *at > asked);
            for (card, _) in &listed.loads {
                if !cards.iter().any(|c| c.id == card.id) {
                    cards.push(card.clone());
                }
            }
            listed.cards = cards;
        }
        self.rebuild(&all)
    }

    /// `card` was loaded on `addr` of pool `pool` (it lists it from now on).
    pub fn loaded(&self, pool: usize, addr: SocketAddr, card: Card) -> Changes {
        let mut all = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let listed = all[pool].entry(addr).or_default();
        if !listed.cards.contains(&card) {
            listed.cards.push(card.clone());
        }
        listed.loads.push((card, Instant::now()));
        self.rebuild(&all)
    }

    /// The names from every pool's answers.
    fn rebuild(&self, all: &[HashMap<SocketAddr, Listed>]) -> Changes {
        // name -> (its pool, the backends that list it, its parent)
        let mut names = HashMap::<String, (Arc<P>, Vec<SocketAddr>, Option<String>)>::new();
        for (i, by_backend) in all.iter().enumerate() {
            for (addr, listed) in by_backend {
                for card in listed
                    .cards
                    .iter()
                    .filter(|c| !self.configured.contains(&c.id))
                {
                    let (served_by, backends, _) =
                        names.entry(card.id.clone()).or_insert_with(|| {
                            (self.pools[i].clone(), Vec::new(), card.parent.clone())
                        });
                    if Arc::ptr_eq(served_by, &self.pools[i]) {
                        backends.push(*addr);
                    }
                }
            }
        }
        let names: HashMap<String, Arc<Served<P>>> = names
            .into_iter()
            .map(|(name, (pool, mut backends, parent))| {
                backends.sort_unstable();
                let backends = backends.into();
                (
                    name,
                    Arc::new(Served {
                        pool,
                        backends,
                        parent,
                    }),
                )
            })
            .collect();
        let old = self.names.swap(Arc::new(names));
        let new = self.names.load();
        type Names<P> = HashMap<String, Arc<Served<P>>>;
        let sorted = |m: &Names<P>, other: &Names<P>| {
            let mut v: Vec<String> = m
                .keys()
                .filter(|n| !other.contains_key(*n))
                .cloned()
                .collect();
            v.sort();
            v
        };
        Changes {
            added: sorted(&new, &old),
            removed: sorted(&old, &new),
        }
    }
}

#[cfg(test)]
mod tests;
