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
//! a restart that failed no request): a backend that fails or leaves the
//! set is forgotten whole ([`forget`]); the rest wears off as the backend's
//! share of the index fills with what is routed to it since.
//!
//! Cost: one hash map entry per block held anywhere, plus a list of its
//! holders and a place in each holder's recency list (`lru.rs`): about 100
//! bytes for a block on one backend, 28 more per further backend. A lookup
//! walks the request's chain once (one map probe per matched block),
//! whatever the number of backends. Nothing done under the index's lock
//! sweeps all it holds: its map grows a 256th at a time ([`Blocks`]), the
//! recency lists need no sweeping, and a forgotten backend's blocks are
//! released a slice at a time by the changes that follow ([`forget`]).
//!
//! Where a model's KV-cache events keep it exact, what the gateway routes
//! counts only until they confirm it, for a while
//! ([`routed_unconfirmed`]): what they never confirm is not believed for
//! long, and is released when the backend is next routed to, in a list of
//! its own, so that it never evicts what they confirmed.
//!
//! Beside the blocks, the index keeps where each prompt routed ended (its
//! last block, a "tip"): a conversation's next turn resends the previous
//! turn's prompt whole, so the deepest tip in its chain names the backend
//! that served its previous turn, however much of it the blocks above have
//! forgotten since. Under cache pressure that is most of it; the backend
//! that prefilled the turn still holds its newest blocks, and routing keeps
//! the conversation there ([`Held::recent`]).
//!
//! [`routed_unconfirmed`]: PrefixIndex::routed_unconfirmed
//! [`forget`]: PrefixIndex::forget

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::lru::{Lru, Node};

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
    /// It served the deepest earlier prompt this chain continues (the
    /// conversation's previous turn), of this many blocks.
    pub recent: Option<usize>,
    id: u32,
}

/// How far back from a chain's end a lookup looks for the tip of the
/// conversation's previous turn: a turn rarely adds more (128 KiB of text,
/// or 8,192 tokens of 16).
const TIP_REACH: usize = 512;

#[derive(Default)]
struct Inner {
    blocks: Blocks,
    /// Each backend's id: its place in `backends`. The addresses are the
    /// gateway's own configuration, nothing a client could flood: hashed
    /// with rustc-hash, not SipHash.
    ids: FxHashMap<SocketAddr, u32>,
    /// By id; `None`: forgotten, the id free for the next new backend
    /// once its blocks are released.
    backends: Vec<Option<Backend>>,
    /// Forgotten backends whose blocks are still being released
    /// ([`Inner::sweep`]): no lookup counts them.
    retired: Vec<Backend>,
    live: usize,
    tick: u64,
    tips: Tips,
}

/// The last block of each prompt routed, and the backend it went to (by
/// id), oldest first: bounded, the oldest forgotten first.
#[derive(Default)]
struct Tips {
    at: HashMap<u64, (u32, u64), BuildHasherDefault<Prehashed>>,
    /// (block, tick) from the oldest; an entry whose tick is not the tip's
    /// any more is stale and skipped.
    order: VecDeque<(u64, u64)>,
}

impl Tips {
    /// A prompt ending at `block` went to `id` at `tick`; at most `cap` kept.
    fn record(&mut self, block: u64, id: u32, tick: u64, cap: usize) {
        self.at.insert(block, (id, tick));
        self.order.push_back((block, tick));
        while self.at.len() > cap || self.order.len() > 2 * cap {
            let Some((old, t)) = self.order.pop_front() else {
                break;
            };
            if self.at.get(&old).is_some_and(|(_, tick)| *tick == t) {
                self.at.remove(&old);
            }
        }
    }
}

/// A backend holding a block.
#[derive(Clone, Copy)]
struct Holder {
    id: u32,
    /// 0: held; else held only until this time ([`PrefixIndex::now`]),
    /// unless confirmed before.
    until: u32,
    /// The block's place in the backend's `lru` (held), or `pending`.
    node: Node,
}

impl Holder {
    fn list<'a>(&self, backend: &'a mut Backend) -> &'a mut Lru {
        match self.until {
            0 => &mut backend.lru,
            _ => &mut backend.pending,
        }
    }
}

struct Backend {
    id: u32,
    addr: SocketAddr,
    /// Blocks held for good, least recently used first.
    lru: Lru,
    /// Blocks routed and not confirmed yet (held until a time), in the
    /// order their time ends: those its events never confirm are released
    /// when it has, not kept in the backend's room until evicted.
    pending: Lru,
    /// The tick it was added at: a tip older names an earlier backend of
    /// its id.
    since: u64,
}

/// Blocks of forgotten backends released by each change of the index:
/// microseconds under the lock, where releasing a million at once held
/// every request of the model for 140 ms (`benches/routing.rs`).
const SWEEP: usize = 256;

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
        // The clock is read only for a block held for a while.
        let now = std::cell::OnceCell::new();
        let now = || *now.get_or_init(|| self.now());
        let inner = self.lock();
        let mut held = Holders::new();
        for (depth, block) in chain.iter().enumerate() {
            let Some(holders) = inner.blocks.get(block) else {
                break;
            };
            let holders = holders.iter().filter(|h| h.until == 0 || h.until > now());
            if depth == 0 {
                held.extend(holders.filter_map(|h| {
                    let addr = inner.backends[h.id as usize].as_ref()?.addr;
                    Some(Held {
                        addr,
                        blocks: 1,
                        recent: None,
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
        // The deepest tip as deep as what is held or deeper: the previous
        // turn's backend.
        let matched = held.iter().map(|h| h.blocks).max().unwrap_or(0);
        let reach = (chain.len().saturating_sub(TIP_REACH)).max(matched.saturating_sub(1));
        let tip = (reach..chain.len()).rev().find_map(|i| {
            let (id, tick) = *inner.tips.at.get(&chain[i])?;
            let backend = inner.backends[id as usize].as_ref()?;
            (tick >= backend.since).then_some((id, i + 1))
        });
        if let Some((id, depth)) = tip {
            match held.iter_mut().find(|h| h.id == id) {
                Some(h) => h.recent = Some(depth),
                None => {
                    if let Some(b) = inner.backends[id as usize].as_ref() {
                        held.push(Held {
                            addr: b.addr,
                            blocks: 0,
                            recent: Some(depth),
                            id,
                        });
                    }
                }
            }
        }
        held
    }

    /// `addr` holds `chain` (its events said it stored it): most recently
    /// used.
    pub fn insert(&self, addr: SocketAddr, chain: &[u64]) {
        self.put(addr, chain, 0, false);
    }

    /// A prompt's `chain` was routed to `addr` to prefill: it holds all of
    /// it now, most recently used, and it is the prompt's tip's backend.
    pub fn routed(&self, addr: SocketAddr, chain: &[u64]) {
        self.put(addr, chain, 0, true);
    }

    /// As [`routed`](Self::routed), but the blocks not held already count
    /// only for `ttl`, unless an insert confirms them before (the backend's
    /// events say it stored them).
    pub fn routed_unconfirmed(&self, addr: SocketAddr, chain: &[u64], ttl: Duration) {
        let until = self.now() + (ttl.as_millis() / 100).max(1) as u32;
        self.put(addr, chain, until, true);
    }

    fn put(&self, addr: SocketAddr, chain: &[u64], until: u32, tip: bool) {
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
        if tip {
            let last = chain[chain.len() - 1];
            // A tip a prompt: far fewer than the blocks the index holds.
            inner
                .tips
                .record(last, id as u32, tick, self.total / 8 + 1024);
        }
        let backend = inner.backends[id].as_mut().expect("a known id is live");
        if !backend.pending.is_empty() {
            expire(&mut inner.blocks, backend, self.now());
        }
        // Deepest first: of equally recent blocks, the tail goes first.
        for block in chain.iter().rev() {
            let holders = inner.blocks.holders(*block);
            match holders.iter_mut().find(|h| h.id == backend.id) {
                // Held, or confirmed now: held from now on.
                Some(h) if until == 0 && h.until != 0 => {
                    backend.pending.remove(h.node);
                    h.until = 0;
                    h.node = backend.lru.push(*block);
                }
                Some(h) => {
                    // Renewed: a later end, so the pending order stays the
                    // order the ends come in.
                    if h.until != 0 {
                        h.until = h.until.max(until);
                    }
                    h.list(backend).touch(h.node);
                }
                None => {
                    let h = Holder {
                        id: backend.id,
                        until,
                        node: 0,
                    };
                    let node = h.list(backend).push(*block);
                    holders.push(Holder { node, ..h });
                }
            }
        }
        while backend.len() > cap {
            evict_oldest(&mut inner.blocks, backend);
        }
        inner.sweep();
    }

    /// `addr` no longer holds `blocks` (its events said they went).
    pub fn remove(&self, addr: SocketAddr, blocks: &[u64]) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let Some(&id) = inner.ids.get(&addr) else {
            return;
        };
        let backend = inner.backends[id as usize]
            .as_mut()
            .expect("a known id is live");
        for block in blocks {
            if let Some(h) = release(&mut inner.blocks, *block, backend.id) {
                h.list(backend).remove(h.node);
            }
        }
        inner.sweep();
    }

    /// `addr` left the set or failed: it holds nothing known any more. Its
    /// blocks stop counting at once and are released [`SWEEP`] at a time
    /// by this and the changes that follow; its id, and so its holders'
    /// and tips' id, is not given to another backend before.
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
        inner.retired.push(backend);
        inner.sweep();
    }

    /// Blocks held, over all backends.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().held()
    }

    /// Blocks each of `addrs` holds (for the metric).
    pub fn blocks_of(&self, addrs: &[SocketAddr]) -> Vec<(SocketAddr, usize)> {
        let inner = self.lock();
        addrs
            .iter()
            .map(|a| (*a, inner.backend(a).map_or(0, Backend::len)))
            .collect()
    }

    /// The events' thread applies a backlog message after message: with a
    /// lock it could take back at once, routing would wait for all of it
    /// (80 ms and more, seen); parking_lot's hands the lock to a waiter at
    /// least every half a millisecond. A holder's panic leaves the maps
    /// whole between statements, so the index stays usable.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }
}

impl Inner {
    /// A new backend's id: a forgotten one's whose blocks are all
    /// released (its id names no holder any more), or the next.
    fn add(&mut self, addr: SocketAddr) -> usize {
        let free =
            self.backends.iter().enumerate().position(|(id, b)| {
                b.is_none() && !self.retired.iter().any(|r| r.id as usize == id)
            });
        let id = match free {
            Some(free) => free,
            None => {
                self.backends.push(None);
                self.backends.len() - 1
            }
        };
        self.backends[id] = Some(Backend {
            id: id as u32,
            addr,
            lru: Lru::default(),
            pending: Lru::default(),
            since: self.tick,
        });
        self.ids.insert(addr, id as u32);
        self.live += 1;
        id
    }

    /// Blocks held, over all backends (forgotten ones' not yet released
    /// too).
    #[cfg(test)]
    fn held(&self) -> usize {
        let backends = self.backends.iter().flatten().chain(&self.retired);
        backends.map(Backend::len).sum()
    }

    fn backend(&self, addr: &SocketAddr) -> Option<&Backend> {
        self.backends[*self.ids.get(addr)? as usize].as_ref()
    }

    /// Release up to [`SWEEP`] blocks of forgotten backends, each
    /// backend's least recently used first.
    fn sweep(&mut self) {
        let mut left = SWEEP;
        while let Some(backend) = self.retired.last_mut() {
            while left > 0 && backend.len() > 0 {
                evict_oldest(&mut self.blocks, backend);
                left -= 1;
            }
            if backend.len() > 0 {
                return;
            }
            self.retired.pop();
        }
    }
}

impl Backend {
    /// Blocks it holds or is taken to hold for a while.
    fn len(&self) -> usize {
        self.lru.len() + self.pending.len()
    }
}

/// Drop `backend`'s least recently used block held, else its oldest
/// pending one.
fn evict_oldest(blocks: &mut Blocks, backend: &mut Backend) {
    let list = match backend.lru.len() {
        0 => &mut backend.pending,
        _ => &mut backend.lru,
    };
    if let Some((block, node)) = list.oldest() {
        release(blocks, block, backend.id);
        list.remove(node);
    }
}

/// Drop `backend`'s pending blocks whose time ended before `now`.
fn expire(blocks: &mut Blocks, backend: &mut Backend, now: u32) {
    while let Some((block, node)) = backend.pending.oldest() {
        let ended = (blocks.get(&block))
            .and_then(|hs| hs.iter().find(|h| h.id == backend.id))
            .is_none_or(|h| h.until <= now);
        if !ended {
            return;
        }
        release(blocks, block, backend.id);
        backend.pending.remove(node);
    }
}

/// Remove holder `id` from `block`; the holder, if it held it.
fn release(blocks: &mut Blocks, block: u64, id: u32) -> Option<Holder> {
    let holders = blocks.get_mut(&block)?;
    let pos = holders.iter().position(|h| h.id == id)?;
    let holder = holders.swap_remove(pos);
    if holders.is_empty() {
        blocks.remove(&block);
    }
    Some(holder)
}

/// Each block's holders, in maps of their own by 8 bits of the block's
/// hash. A map that outgrows its table moves every entry to a new one
/// under the index's lock, and routing waits for it: one map of a million
/// blocks took 100-400 ms to grow (the events of new 64 KB prompts),
/// every request of the model held meanwhile. A shard holds 1/256 of them.
struct Blocks {
    shards: Box<[Shard]>,
}

type Shard = HashMap<u64, Vec<Holder>, BuildHasherDefault<Prehashed>>;

impl Default for Blocks {
    fn default() -> Self {
        Blocks {
            shards: (0..256).map(|_| Shard::default()).collect(),
        }
    }
}

impl Blocks {
    /// Bits 48-55 of the hash: hashbrown places an entry by the low bits
    /// and tags it with the top 7, which then stay apart within a shard.
    fn shard(block: u64) -> usize {
        (block >> 48) as u8 as usize
    }

    fn get(&self, block: &u64) -> Option<&Vec<Holder>> {
        self.shards[Self::shard(*block)].get(block)
    }

    fn get_mut(&mut self, block: &u64) -> Option<&mut Vec<Holder>> {
        self.shards[Self::shard(*block)].get_mut(block)
    }

    fn holders(&mut self, block: u64) -> &mut Vec<Holder> {
        self.shards[Self::shard(block)].entry(block).or_default()
    }

    fn remove(&mut self, block: &u64) {
        self.shards[Self::shard(*block)].remove(block);
    }
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

    /// Each backend holding some of `chain` and how many blocks.
    fn held(index: &PrefixIndex, chain: &[u64]) -> Vec<(u16, usize)> {
        let mut out: Vec<(u16, usize)> = index
            .lookup(chain)
            .into_iter()
            .filter(|h| h.blocks > 0)
            .map(|h| (h.addr.port(), h.blocks))
            .collect();
        out.sort();
        out
    }

    /// The backend of the previous turn `chain` continues, and its length.
    fn recent(index: &PrefixIndex, chain: &[u64]) -> Option<(u16, usize)> {
        let found = index.lookup(chain).into_iter();
        found
            .filter_map(|h| Some((h.addr.port(), h.recent?)))
            .next()
    }

    #[test]
    fn unconfirmed_blocks_count_for_their_while_and_confirmed_ones_stay() {
        let index = PrefixIndex::new(100, 1000);
        let ttl = Duration::from_millis(100);
        index.routed_unconfirmed(addr(1), &[1, 2, 3], ttl);
        index.routed_unconfirmed(addr(2), &[1, 2, 3], ttl);
        // Backend 2's events confirm the first two blocks.
        index.insert(addr(2), &[1, 2]);
        assert_eq!(held(&index, &[1, 2, 3]), vec![(1, 3), (2, 3)]);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(held(&index, &[1, 2, 3]), vec![(2, 2)]);
        // Routed again unconfirmed: confirmed blocks stay confirmed.
        index.routed_unconfirmed(addr(2), &[1, 2, 3], ttl);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(held(&index, &[1, 2, 3]), vec![(2, 2)]);
    }

    #[test]
    fn unconfirmed_blocks_whose_time_ended_take_no_room_from_held_ones() {
        let index = PrefixIndex::new(4, 1000);
        let ttl = Duration::from_millis(100);
        index.insert(addr(1), &[1, 2, 3]);
        // Routed there, and its events never say it was stored.
        index.routed_unconfirmed(addr(1), &[10], ttl);
        assert_eq!(held(&index, &[10]), [(1, 1)]);
        std::thread::sleep(Duration::from_millis(250));
        // Room for four: the block whose time ended goes, not a held one.
        index.insert(addr(1), &[4]);
        assert_eq!(held(&index, &[1, 2, 3]), [(1, 3)]);
        assert_eq!(held(&index, &[4]), [(1, 1)]);
        assert_eq!(held(&index, &[10]), []);
        assert_eq!(index.len(), 4);
        // One confirmed in time is held for good.
        index.routed_unconfirmed(addr(1), &[20], ttl);
        index.insert(addr(1), &[20]);
        std::thread::sleep(Duration::from_millis(250));
        index.insert(addr(1), &[1]);
        assert_eq!(held(&index, &[20]), [(1, 1)]);
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
        assert_eq!(inner.backend(&addr(1)).unwrap().lru.len(), 3);
        assert_eq!(inner.held(), 3);
    }

    #[test]
    fn forget_takes_a_backends_blocks_and_tips_away() {
        let index = PrefixIndex::new(100, 1000);
        index.routed(addr(1), &[1, 2]);
        index.routed(addr(2), &[1, 2, 3, 4]);
        assert_eq!(held(&index, &[1, 2, 3, 4]), [(1, 2), (2, 4)]);
        index.forget(&addr(2));
        assert_eq!(held(&index, &[1, 2, 3, 4]), [(1, 2)]);
        assert_eq!(index.len(), 2);
        assert_eq!(recent(&index, &[1, 2, 3, 4, 5]), Some((1, 2)));
        // Back, it starts from nothing.
        index.insert(addr(2), &[5]);
        assert_eq!(held(&index, &[1]), [(1, 1)]);
        assert_eq!(held(&index, &[5]), [(2, 1)]);
        assert_eq!(index.len(), 3);
    }

    #[test]
    fn a_forgotten_backends_blocks_go_a_slice_at_a_time_and_its_id_waits_for_them() {
        let index = PrefixIndex::new(10 * SWEEP, 100 * SWEEP);
        let big: Vec<u64> = (1000..1000 + 3 * SWEEP as u64).collect();
        index.routed(addr(1), &[1, 2]);
        index.routed(addr(2), &big);
        index.forget(&addr(2));
        // Counted for nothing at once; one slice released by the forget.
        assert_eq!(held(&index, &big), []);
        assert_eq!(recent(&index, &big), None);
        assert_eq!(index.len(), 2 + 2 * SWEEP);
        // A backend added meanwhile takes a new id, not the forgotten one's.
        index.routed(addr(3), &[7]);
        assert_eq!(index.len(), 3 + SWEEP);
        assert_eq!(held(&index, &big), []);
        index.insert(addr(1), &[1, 2]);
        assert_eq!(index.len(), 3);
        // Released: the id goes to the next new backend, and the forgotten
        // one's tips do not name it.
        index.routed(addr(4), &[8]);
        assert_eq!(index.lock().ids[&addr(4)], 1);
        assert_eq!(recent(&index, &big), None);
        assert_eq!(held(&index, &big), []);
        assert_eq!(held(&index, &[8]), [(4, 1)]);
    }

    #[test]
    fn the_deepest_tip_names_the_previous_turns_backend_whatever_was_forgotten() {
        // Room for 6 blocks a backend.
        let index = PrefixIndex::new(6, 1000);
        // A shared head (1, 2) everywhere; a conversation's turn on 2.
        index.routed(addr(1), &[1, 2, 50]);
        index.routed(addr(2), &[1, 2, 10, 11, 12]);
        assert_eq!(recent(&index, &[1, 2, 10, 11, 12, 13, 14]), Some((2, 5)));
        // Backend 2 serves others: its blocks of the conversation go, its
        // tip stays.
        index.routed(addr(2), &[1, 2, 60, 61, 62, 63]);
        assert_eq!(held(&index, &[1, 2, 10, 11, 12, 13]), [(1, 2), (2, 2)]);
        assert_eq!(recent(&index, &[1, 2, 10, 11, 12, 13]), Some((2, 5)));
        // Events (not a routed prompt) make no tip; a prompt that continues
        // no routed one has none.
        index.insert(addr(1), &[1, 2, 70, 71]);
        assert_eq!(recent(&index, &[1, 2, 70, 71, 72]), None);
        // The conversation moved to 1: its next turn follows it.
        index.routed(addr(1), &[1, 2, 10, 11, 12, 13, 14]);
        assert_eq!(
            recent(&index, &[1, 2, 10, 11, 12, 13, 14, 15]),
            Some((1, 7))
        );
    }

    #[test]
    fn blocks_spread_over_the_shards() {
        let mut blocks = Blocks::default();
        let ids: Vec<u32> = (0..65_536).collect();
        for block in crate::routing::chain::of_tokens(&ids, 16) {
            blocks.holders(block);
        }
        // 4,096 blocks, 16 a shard on average.
        let most = blocks.shards.iter().map(HashMap::len).max().unwrap();
        assert!(most < 48, "{most} blocks in one shard");
    }

    #[test]
    fn tips_are_bounded_oldest_first() {
        let index = PrefixIndex::new(10, 10);
        for i in 0..3000 {
            index.routed(addr(1), &[i]);
        }
        let inner = index.lock();
        assert_eq!(inner.tips.at.len(), 10 / 8 + 1024);
        assert!(inner.tips.order.len() <= 2 * (10 / 8 + 1024));
        assert!(inner.tips.at.contains_key(&2999) && !inner.tips.at.contains_key(&0));
    }
}
