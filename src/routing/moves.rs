//! Where bounded load moved a conversation. Its next turns stay there while
//! that backend is under its cap: the move's cold prefill has put the
//! conversation's context there, and going back to the first choice (still
//! busy: that is why it moved) only to be moved again pays another.
//!
//! A conversation is a key plus the head of its first turn (see
//! [`conversation`]): a hot key's sub-agents move one by one, each staying
//! where its own history is. This is the one piece of routing state a
//! gateway keeps (bounded, forgotten after [`IDLE`]); it forms only under
//! load, so without load every replica still routes every key alike.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::Xxh3Default;

use super::Route;

/// A move unused this long is forgotten: by then both caches may have
/// dropped the conversation, and its first choice is as good as any.
pub const IDLE: Duration = Duration::from_secs(600);

/// The most moves remembered per model. Far above the conversations a
/// GPU host serves in [`IDLE`]; when full, a new move is not remembered
/// (it only loses its stay) until a sweep makes room.
pub const CAPACITY: usize = 16_384;

/// The conversation a request belongs to: its affinity key and the head of
/// its body (`prefix::derive` with `Head::FirstUser`, when it has one).
pub fn conversation(key: &[u8], head: Option<&[u8]>) -> u64 {
    let mut h = Xxh3Default::new();
    h.update(key);
    if let Some(head) = head {
        h.update(&[0x1f]);
        h.update(head);
    }
    h.digest()
}

/// How often idle moves are swept out: then a gateway that has not moved
/// anything for [`IDLE`] stops looking for conversations.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct Moves {
    inner: Mutex<Inner>,
    /// Whether `inner` holds any move, kept beside it so that every request
    /// can ask without the lock (a request that reads it stale is routed
    /// as if the latest move had not happened yet).
    any: AtomicBool,
}

#[derive(Default)]
struct Inner {
    moved: HashMap<u64, (SocketAddr, Instant)>,
    swept: Option<Instant>,
}

impl Moves {
    /// Whether no move is remembered (then a request need not look for
    /// its conversation).
    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Relaxed)
    }

    /// Where `conversation` was last moved to, unless that was over
    /// [`IDLE`] ago.
    pub fn get(&self, conversation: u64, now: Instant) -> Option<SocketAddr> {
        let inner = self.lock();
        let (addr, at) = inner.moved.get(&conversation)?;
        (now.saturating_duration_since(*at) < IDLE).then_some(*addr)
    }

    /// `conversation` was admitted at `addr` under `route`: a move for
    /// balance is remembered (again), its first choice forgets the move.
    pub fn record(&self, conversation: u64, route: Route, addr: SocketAddr, now: Instant) {
        let mut inner = self.lock();
        inner.sweep(now);
        let moved = &mut inner.moved;
        match route {
            Route::Balance => {
                if moved.len() < CAPACITY || moved.contains_key(&conversation) {
                    moved.insert(conversation, (addr, now));
                }
            }
            Route::Hash | Route::Prefix => {
                moved.remove(&conversation);
            }
            Route::RoundRobin | Route::Fallback | Route::Spill | Route::Owner | Route::Cache => {}
        }
        self.any.store(!moved.is_empty(), Ordering::Relaxed);
    }

    /// How many conversations are moved to each of `addrs` now (not idle).
    pub fn counts(&self, addrs: &[SocketAddr], now: Instant) -> Vec<(SocketAddr, i64)> {
        let mut counts: Vec<(SocketAddr, i64)> = addrs.iter().map(|a| (*a, 0)).collect();
        let inner = self.lock();
        for (addr, at) in inner.moved.values() {
            if now.saturating_duration_since(*at) < IDLE {
                if let Some((_, n)) = counts.iter_mut().find(|(a, _)| a == addr) {
                    *n += 1;
                }
            }
        }
        counts
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The map stays whole if a holder panicked: every change is one call.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().moved.len()
    }
}

impl Inner {
    /// Drop the idle moves, at most once per [`SWEEP_EVERY`].
    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|t| now.saturating_duration_since(t) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        self.moved
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < IDLE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_move_is_remembered_until_the_first_choice_or_idle() {
        let m = Moves::default();
        let t = Instant::now();
        assert!(m.is_empty());
        m.record(1, Route::Balance, addr(2), t);
        assert!(!m.is_empty());
        m.record(9, Route::Balance, addr(3), t);
        let counts = m.counts(&[addr(1), addr(2), addr(3)], t);
        assert_eq!(counts, [(addr(1), 0), (addr(2), 1), (addr(3), 1)]);
        assert_eq!(m.counts(&[addr(2)], t + IDLE), [(addr(2), 0)]);
        assert_eq!(m.get(1, t + Duration::from_secs(1)), Some(addr(2)));
        assert_eq!(m.get(2, t), None);
        // Spill and fallback leave it; the first choice forgets it.
        m.record(1, Route::Spill, addr(3), t);
        assert_eq!(m.get(1, t), Some(addr(2)));
        m.record(1, Route::Hash, addr(1), t);
        assert_eq!(m.get(1, t), None);
        // Each use renews it; unused for IDLE, it is gone.
        m.record(1, Route::Balance, addr(2), t);
        m.record(1, Route::Balance, addr(2), t + IDLE / 2);
        assert_eq!(m.get(1, t + IDLE), Some(addr(2)));
        assert_eq!(m.get(1, t + IDLE / 2 + IDLE), None);
    }

    #[test]
    fn it_holds_at_most_capacity_moves_and_sweeps_out_idle_ones() {
        let m = Moves::default();
        let t = Instant::now();
        for c in 0..CAPACITY as u64 {
            m.record(c, Route::Balance, addr(2), t);
        }
        // Full: a new move is not remembered, a known one is renewed.
        m.record(u64::MAX, Route::Balance, addr(2), t);
        assert_eq!((m.len(), m.get(u64::MAX, t)), (CAPACITY, None));
        m.record(7, Route::Balance, addr(3), t + IDLE / 2);
        // Once the others are idle, the next sweep makes room.
        let later = t + IDLE;
        m.record(u64::MAX, Route::Balance, addr(2), later);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(u64::MAX, later), Some(addr(2)));
        assert_eq!(m.get(7, later), Some(addr(3)));
        // A sweep once all are idle empties it.
        let idle = later + IDLE;
        m.record(1, Route::Hash, addr(1), idle);
        assert!(m.is_empty());
        // Sweeps come at most once per SWEEP_EVERY: a move idle since just
        // after one stays in the map (unused) until the next.
        let s = Duration::from_secs(1);
        m.record(2, Route::Balance, addr(2), idle + s);
        m.record(1, Route::Hash, addr(1), idle + IDLE);
        m.record(1, Route::Hash, addr(1), idle + IDLE + 2 * s);
        assert_eq!((m.is_empty(), m.get(2, idle + IDLE + 2 * s)), (false, None));
        m.record(1, Route::Hash, addr(1), idle + IDLE + SWEEP_EVERY);
        assert!(m.is_empty());
    }

    #[test]
    fn a_conversation_is_its_key_and_head() {
        assert_eq!(
            conversation(b"k", Some(b"h")),
            conversation(b"k", Some(b"h"))
        );
        assert_ne!(
            conversation(b"k", Some(b"h")),
            conversation(b"k", Some(b"g"))
        );
        assert_ne!(conversation(b"k", Some(b"h")), conversation(b"k", None));
        assert_ne!(conversation(b"k", None), conversation(b"j", None));
    }
}
