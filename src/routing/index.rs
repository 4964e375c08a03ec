//! The prefix index: for one model, which backends are expected to hold
//! which leading blocks (`chain.rs`) of the prompts routed to them.
//!
//! It is an estimate of each backend's KV cache, kept from what the
//! gateway did: a request admitted at a backend puts its whole chain there
//! (the backend prefills it, so its next turn finds it); each backend keeps
//! at most its cache's size in blocks and forgets the least recently used
//! first, the deepest blocks of a chain before its head, as vLLM's free
//! queue does. What it gets wrong: blocks a backend dropped that the gateway
//! did not see (another gateway's traffic filled its cache, a cache reset,
//! a restart that failed no request). A response whose reported cached
//! tokens fall well short of the expected ones corrects it ([`trim`]); a
//! backend that fails or leaves the set is forgotten whole ([`forget`]).
//!
//! Cost: one hash map entry per block held anywhere, plus a list of its
//! holders and a place in each holder's recency queue: about 100 bytes for
//! a block on one backend, 16 more per further backend. A lookup walks the
//! request's chain once (one map probe per matched block), whatever the
//! number of backends.
//!
//! Where a model's KV-cache events keep it exact, what the gateway routes
//! counts only until they confirm it, for a while
//! ([`insert_unconfirmed`]): what they never confirm is not believed for
//! long.
//!
//! [`insert_unconfirmed`]: PrefixIndex::insert_unconfirmed
//! [`trim`]: PrefixIndex::trim
//! [`forget`]: PrefixIndex::forget

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

/// One model's prefix index.
pub struct PrefixIndex {
    inner: Mutex<Inner>,
    /// Blocks one backend is taken to hold at most (its KV cache).
    per_backend: usize,
    /// Blocks held over all backends at most: the index's memory bound.
    total: usize,
    epoch: Instant,
}

/// What a lookup finds: the few backends holding a prompt's head, on the
/// stack.
pub type Holders = SmallVec<[Held; 4]>;

/// The blocks of one request's chain a backend holds, from the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub addr: SocketAddr,
    pub blocks: usize,
    id: u32,
}

#[derive(Default)]
struct Inner {
    blocks: HashMap<u64, Vec<Holder>, BuildHasherDefault<Prehashed>>,
    /// Each backend's id: its place in `backends`.
    ids: HashMap<SocketAddr, u32>,
    /// By id; `None`: forgotten, the id free for the next new backend.
    backends: Vec<Option<Backend>>,
    live: usize,
    tick: u64,
    held: usize,
}

/// A backend holding a block, and when it last used it.
#[derive(Clone, Copy)]
struct Holder {
    id: u32,
    /// 0: held; else held only until this time ([`PrefixIndex::now`]),
    /// unless confirmed before.
    until: u32,
    tick: u64,
}

struct Backend {
    id: u32,
    addr: SocketAddr,
    /// (block, tick) from least to most recently used; an entry whose tick
    /// is not the holder's any more is stale and skipped.
    recency: VecDeque<(u64, u64)>,
    count: usize,
}

impl PrefixIndex {
    /// An index taking each backend to hold `per_backend` blocks at most,
    /// and holding `total` at most.
    pub fn new(per_backend: usize, total: usize) -> Self {
        PrefixIndex {
            inner: Mutex::default(),
            per_backend: per_backend.max(1),
            total: total.max(1),
            epoch: Instant::now(),
        }
    }

    /// Tenths of a second since the index began (a u32 lasts 13 years).
    fn now(&self) -> u32 {
        (self.epoch.elapsed().as_millis() / 100) as u32
    }

    /// The backends holding the head of `chain`, each with how many of its
    /// leading blocks; a backend holding none is not listed.
    pub fn lookup(&self, chain: &[u64]) -> Holders {
        let now = self.now();
        let inner = self.lock();
        let mut held = Holders::new();
        for (depth, block) in chain.iter().enumerate() {
            let Some(holders) = inner.blocks.get(block) else {
                break;
            };
            let holders = holders.iter().filter(|h| h.until == 0 || h.until > now);
            if depth == 0 {
                held.extend(holders.filter_map(|h| {
                    let addr = inner.backends[h.id as usize].as_ref()?.addr;
                    Some(Held {
                        addr,
                        blocks: 1,
                        id: h.id,
                    })
                }));
                continue;
            }
            let mut deeper = false;
            for h in held.iter_mut().filter(|h| h.blocks == depth) {
                if holders.clone().any(|holder| holder.id == h.id) {
                    h.blocks += 1;
                    deeper = true;
                }
            }
            if !deeper {
                break;
            }
        }
        held
    }

    /// `addr` was given `chain` to prefill: it holds all of it now, most
    /// recently used.
    pub fn insert(&self, addr: SocketAddr, chain: &[u64]) {
        self.put(addr, chain, 0);
    }

    /// As [`insert`](Self::insert), but the blocks not held already count
    /// only for `ttl`, unless an insert confirms them before (the backend's
    /// events say it stored them).
    pub fn insert_unconfirmed(&self, addr: SocketAddr, chain: &[u64], ttl: Duration) {
        let until = self.now() + (ttl.as_millis() / 100).max(1) as u32;
        self.put(addr, chain, until);
    }

    fn put(&self, addr: SocketAddr, chain: &[u64], until: u32) {
        if chain.is_empty() {
            return;
        }
        let mut inner = self.lock();
        let inner = &mut *inner;
        inner.tick += 1;
        let tick = inner.tick;
        let id = match inner.ids.get(&addr) {
            Some(id) => *id as usize,
            None => inner.add(addr),
        };
        let cap = self.per_backend.min(self.total / inner.live).max(1);
        let backend = inner.backends[id].as_mut().expect("a known id is live");
        // Deepest first: of equally recent blocks, the tail goes first.
        for block in chain.iter().rev() {
            let holders = inner.blocks.entry(*block).or_default();
            match holders.iter_mut().find(|h| h.id == backend.id) {
                Some(h) => {
                    h.tick = tick;
                    if h.until != 0 {
                        h.until = if until == 0 { 0 } else { h.until.max(until) };
                    }
                }
                None => {
                    holders.push(Holder {
                        id: backend.id,
                        until,
                        tick,
                    });
                    backend.count += 1;
                    inner.held += 1;
                }
            }
            backend.recency.push_back((*block, tick));
        }
        while backend.count > cap {
            evict_oldest(&mut inner.blocks, backend, &mut inner.held);
        }
        // Renewed blocks leave stale entries behind: drop them before the
        // queue outgrows what it orders.
        if backend.recency.len() > 2 * backend.count + 64 {
            compact(&inner.blocks, backend);
        }
    }

    /// `addr` holds only the first `keep` blocks of `chain` (it reported
    /// fewer cached tokens than expected): the rest are no longer its.
    pub fn trim(&self, addr: SocketAddr, chain: &[u64], keep: usize) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let Some(&id) = inner.ids.get(&addr) else {
            return;
        };
        let backend = inner.backends[id as usize]
            .as_mut()
            .expect("a known id is live");
        for block in chain.iter().skip(keep) {
            if release(&mut inner.blocks, *block, backend.id, None) {
                backend.count -= 1;
                inner.held -= 1;
            }
        }
    }

    /// `addr` left the set or failed: it holds nothing known any more.
    pub fn forget(&self, addr: &SocketAddr) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let Some(id) = inner.ids.remove(addr) else {
            return;
        };
        let backend = inner.backends[id as usize]
            .take()
            .expect("a known id is live");
        inner.live -= 1;
        for (block, _) in &backend.recency {
            if release(&mut inner.blocks, *block, backend.id, None) {
                inner.held -= 1;
            }
        }
    }

    /// Blocks held, over all backends.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().held
    }

    /// Blocks each of `addrs` holds (for the metric).
    pub fn blocks_of(&self, addrs: &[SocketAddr]) -> Vec<(SocketAddr, usize)> {
        let inner = self.lock();
        addrs
            .iter()
            .map(|a| (*a, inner.backend(a).map_or(0, |b| b.count)))
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every change leaves the maps whole between statements that can
        // panic; a holder's panic leaves an index still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// A new backend's id: a forgotten one's, or the next. A forgotten
    /// backend holds no block, so its id names no holder any more.
    fn add(&mut self, addr: SocketAddr) -> usize {
        let id = match self.backends.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.backends.push(None);
                self.backends.len() - 1
            }
        };
        self.backends[id] = Some(Backend {
            id: id as u32,
            addr,
            recency: VecDeque::new(),
            count: 0,
        });
        self.ids.insert(addr, id as u32);
        self.live += 1;
        id
    }

    fn backend(&self, addr: &SocketAddr) -> Option<&Backend> {
        self.backends[*self.ids.get(addr)? as usize].as_ref()
    }
}

/// Drop `backend`'s least recently used block.
fn evict_oldest(
    blocks: &mut HashMap<u64, Vec<Holder>, BuildHasherDefault<Prehashed>>,
    backend: &mut Backend,
    held: &mut usize,
) {
    while let Some((block, tick)) = backend.recency.pop_front() {
        if release(blocks, block, backend.id, Some(tick)) {
            backend.count -= 1;
            *held -= 1;
            return;
        }
    }
}

/// Remove holder `id` from `block` (only if it last used it at `tick`,
/// when given); whether it held it.
fn release(
    blocks: &mut HashMap<u64, Vec<Holder>, BuildHasherDefault<Prehashed>>,
    block: u64,
    id: u32,
    tick: Option<u64>,
) -> bool {
    let Some(holders) = blocks.get_mut(&block) else {
        return false;
    };
    let Some(pos) = holders
        .iter()
        .position(|h| h.id == id && tick.is_none_or(|t| t == h.tick))
    else {
        return false;
    };
    holders.swap_remove(pos);
    if holders.is_empty() {
        blocks.remove(&block);
    }
    true
}

/// Keep only the queue entries that are their block's latest use.
fn compact(
    blocks: &HashMap<u64, Vec<Holder>, BuildHasherDefault<Prehashed>>,
    backend: &mut Backend,
) {
    let id = backend.id;
    backend.recency.retain(|(block, tick)| {
        blocks
            .get(block)
            .is_some_and(|hs| hs.iter().any(|h| h.id == id && h.tick == *tick))
    });
}

/// The blocks are hashes already: used as they are.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn held(index: &PrefixIndex, chain: &[u64]) -> Vec<(u16, usize)> {
        let mut out: Vec<(u16, usize)> = index
            .lookup(chain)
            .into_iter()
            .map(|h| (h.addr.port(), h.blocks))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn unconfirmed_blocks_count_for_their_while_and_confirmed_ones_stay() {
        let index = PrefixIndex::new(100, 1000);
        let ttl = Duration::from_millis(100);
        index.insert_unconfirmed(addr(1), &[1, 2, 3], ttl);
        index.insert_unconfirmed(addr(2), &[1, 2, 3], ttl);
        // Backend 2's events confirm the first two blocks.
        index.insert(addr(2), &[1, 2]);
        assert_eq!(held(&index, &[1, 2, 3]), vec![(1, 3), (2, 3)]);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(held(&index, &[1, 2, 3]), vec![(2, 2)]);
        // Routed again unconfirmed: confirmed blocks stay confirmed.
        index.insert_unconfirmed(addr(2), &[1, 2, 3], ttl);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(held(&index, &[1, 2, 3]), vec![(2, 2)]);
    }

    #[test]
    fn a_lookup_counts_each_backends_leading_blocks() {
        let index = PrefixIndex::new(100, 1000);
        index.insert(addr(1), &[1, 2, 3, 4]);
        index.insert(addr(2), &[1, 2, 9]);
        assert_eq!(held(&index, &[1, 2, 3, 4, 5]), [(1, 4), (2, 2)]);
        assert_eq!(held(&index, &[1, 2, 9, 4]), [(1, 2), (2, 3)]);
        assert_eq!(
            index.blocks_of(&[addr(2), addr(3)]),
            [(addr(2), 3), (addr(3), 0)]
        );
        // Blocks held past a gap do not count: a chain is matched from
        // its head.
        assert_eq!(held(&index, &[7, 2, 3]), []);
        assert_eq!(held(&index, &[]), []);
        assert_eq!(index.len(), 7);
    }

    #[test]
    fn a_full_backend_forgets_its_least_recently_used_blocks_tail_first() {
        let index = PrefixIndex::new(4, 1000);
        index.insert(addr(1), &[1, 2, 3]);
        index.insert(addr(1), &[10, 11]);
        // Five blocks, room for four: the older chain's tail went first.
        assert_eq!(held(&index, &[1, 2, 3]), [(1, 2)]);
        assert_eq!(held(&index, &[10, 11]), [(1, 2)]);
        // Using a chain again renews it: now the other goes.
        index.insert(addr(1), &[1, 2]);
        index.insert(addr(1), &[20, 21]);
        assert_eq!(held(&index, &[1, 2]), [(1, 2)]);
        assert_eq!(held(&index, &[10, 11]), []);
        assert_eq!(held(&index, &[20, 21]), [(1, 2)]);
        assert_eq!(index.len(), 4);
        // Another backend has its own room.
        index.insert(addr(2), &[10, 11]);
        assert_eq!(held(&index, &[10, 11]), [(2, 2)]);
    }

    #[test]
    fn the_total_bound_is_shared_by_the_backends() {
        let index = PrefixIndex::new(100, 6);
        index.insert(addr(1), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(index.len(), 6);
        // Two backends now: three blocks each at most.
        index.insert(addr(2), &[1, 2, 3, 4]);
        assert_eq!(held(&index, &[1, 2, 3, 4]), [(1, 4), (2, 3)]);
        // Held past its share until it next receives a chain.
        index.insert(addr(1), &[9]);
        assert_eq!(index.len(), 6);
        assert_eq!(held(&index, &[9]), [(1, 1)]);
    }

    #[test]
    fn renewals_do_not_grow_the_queue_without_bound() {
        let index = PrefixIndex::new(8, 100);
        for _ in 0..10_000 {
            index.insert(addr(1), &[1, 2, 3]);
        }
        let inner = index.lock();
        assert!(inner.backend(&addr(1)).unwrap().recency.len() <= 2 * 3 + 64 + 3);
        assert_eq!(inner.held, 3);
    }

    #[test]
    fn trim_and_forget_take_blocks_away() {
        let index = PrefixIndex::new(100, 1000);
        index.insert(addr(1), &[1, 2, 3, 4]);
        index.insert(addr(2), &[1, 2, 3, 4]);
        index.trim(addr(1), &[1, 2, 3, 4], 1);
        assert_eq!(held(&index, &[1, 2, 3, 4]), [(1, 1), (2, 4)]);
        index.forget(&addr(2));
        assert_eq!(held(&index, &[1, 2, 3, 4]), [(1, 1)]);
        assert_eq!(index.len(), 1);
        // Its stale queue entries are never read again; back, it starts
        // from nothing.
        index.insert(addr(2), &[5]);
        assert_eq!(held(&index, &[1]), [(1, 1)]);
        assert_eq!(held(&index, &[5]), [(2, 1)]);
        // Trimming what a backend never held changes nothing.
        index.trim(addr(3), &[1], 0);
        index.trim(addr(2), &[1], 0);
        assert_eq!(index.len(), 2);
    }
}
