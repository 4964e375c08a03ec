//! Prefix KV cache: a set of chained block hashes with LRU eviction.
//!
//! Like vLLM's automatic prefix caching, only an identical prefix is reused:
//! a lookup walks the request's block hashes from the first one and stops at
//! the first miss. Because hashes are chained (see `tokenize`), the same
//! block content at another position is a different hash and never a hit,
//! and so is the same prompt for another adapter (another chain seed).
//!
//! Eviction is least-recently-used over blocks. When a chain of blocks is
//! touched (hit or inserted) the later blocks are given the older stamps, so
//! under pressure a chain loses its tail before its head, as vLLM does by
//! freeing a request's blocks in reverse order; evicting the head first would
//! make the rest of the chain unreachable dead weight.
//!
//! Simplification: blocks used by running requests are not pinned.

use std::collections::{BTreeMap, HashMap};

/// LRU set of block hashes holding at most `capacity` blocks.
#[derive(Debug)]
pub struct PrefixCache {
    capacity: usize,
    /// block hash -> last-use stamp
    stamps: HashMap<u64, u64>,
    /// last-use stamp -> block hash, oldest first (the eviction order)
    lru: BTreeMap<u64, u64>,
    clock: u64,
}

impl PrefixCache {
    pub fn new(capacity_blocks: usize) -> Self {
        PrefixCache {
            capacity: capacity_blocks,
            stamps: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Number of blocks currently cached.
    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    /// Counts the leading blocks of `hashes` that are cached and refreshes
    /// them. Returns the number of hit blocks (not tokens).
    pub fn lookup(&mut self, hashes: &[u64]) -> usize {
        let hits = hashes
            .iter()
            .take_while(|h| self.stamps.contains_key(h))
            .count();
        self.touch_chain(&hashes[..hits]);
        hits
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.stamps.contains_key(&hash)
    }

    /// Inserts (or refreshes) every block of the chain, then evicts the
    /// least recently used blocks until the cache fits its capacity.
    /// Returns the evicted blocks, oldest first (for the KV events).
    pub fn insert(&mut self, hashes: &[u64]) -> Vec<u64> {
        self.touch_chain(hashes);
        let mut evicted = Vec::new();
        while self.stamps.len() > self.capacity {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            self.stamps.remove(&victim);
            evicted.push(victim);
        }
        evicted
    }

    /// Drops every block (vLLM's `reset_prefix_cache`).
    pub fn clear(&mut self) {
        self.stamps.clear();
        self.lru.clear();
    }

    /// Stamps the chain so that its first block is the most recent.
    fn touch_chain(&mut self, chain: &[u64]) {
        for &h in chain.iter().rev() {
            self.clock += 1;
            if let Some(old) = self.stamps.insert(h, self.clock) {
                self.lru.remove(&old);
            }
            self.lru.insert(self.clock, h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::{block_hashes, BYTES_PER_TOKEN};

    const BS: usize = 16;

    /// A prompt of `tokens` tokens made of `fill` bytes.
    fn prompt(fill: char, tokens: usize) -> String {
        fill.to_string().repeat(tokens * BYTES_PER_TOKEN)
    }

    /// Cached tokens a request gets: hit blocks times block size.
    fn cached_tokens(c: &mut PrefixCache, text: &str) -> usize {
        c.lookup(&block_hashes(0, text, BS)) * BS
    }

    #[test]
    fn identical_prefix_hits_and_other_suffix_keeps_the_prefix() {
        let mut c = PrefixCache::new(100);
        let a = format!("{}{}", prompt('a', 32), prompt('b', 32));
        assert_eq!(cached_tokens(&mut c, &a), 0);
        c.insert(&block_hashes(0, &a, BS));
        assert_eq!(cached_tokens(&mut c, &a), 64);
        // Same first 32 tokens, different rest: only the shared prefix hits.
        let b = format!("{}{}", prompt('a', 32), prompt('c', 32));
        assert_eq!(cached_tokens(&mut c, &b), 32);
    }

    #[test]
    fn differing_first_block_gives_zero() {
        let mut c = PrefixCache::new(100);
        let a = format!("{}{}", prompt('a', 16), prompt('b', 48));
        c.insert(&block_hashes(0, &a, BS));
        // Only the first block differs; everything after it is identical.
        let b = format!("{}{}", prompt('z', 16), prompt('b', 48));
        assert_eq!(cached_tokens(&mut c, &b), 0);
    }

    #[test]
    fn only_full_blocks_are_cached() {
        let mut c = PrefixCache::new(100);
        let a = prompt('a', 40);
        c.insert(&block_hashes(0, &a, BS));
        assert_eq!(c.len(), 2);
        assert_eq!(cached_tokens(&mut c, &a), 32);
    }

    #[test]
    fn same_block_at_another_position_is_not_a_hit() {
        let mut c = PrefixCache::new(100);
        // Block 1 of this prompt is 16 tokens of 'b'.
        c.insert(&block_hashes(
            0,
            &format!("{}{}", prompt('a', 16), prompt('b', 16)),
            BS,
        ));
        // A prompt whose first block is that same content misses.
        assert_eq!(cached_tokens(&mut c, &prompt('b', 16)), 0);
    }

    #[test]
    fn lru_evicts_oldest_and_hits_refresh() {
        let mut c = PrefixCache::new(4);
        let a = prompt('a', 32);
        let b = prompt('b', 32);
        let d = prompt('d', 32);
        c.insert(&block_hashes(0, &a, BS));
        c.insert(&block_hashes(0, &b, BS));
        assert_eq!(c.len(), 4);
        // A hit on `a` makes `b` the least recently used...
        assert_eq!(cached_tokens(&mut c, &a), 32);
        let mut evicted = c.insert(&block_hashes(0, &d, BS));
        // Tail first.
        evicted.reverse();
        assert_eq!(evicted, block_hashes(0, &b, BS));
        assert_eq!(c.len(), 4);
        // ...so `b` is the one evicted.
        assert_eq!(cached_tokens(&mut c, &b), 0);
        assert_eq!(cached_tokens(&mut c, &a), 32);
        assert_eq!(cached_tokens(&mut c, &d), 32);
    }

    #[test]
    fn a_chain_loses_its_tail_first() {
        let mut c = PrefixCache::new(3);
        let a = prompt('a', 48); // 3 blocks
        c.insert(&block_hashes(0, &a, BS));
        // 1 block forces one eviction.
        c.insert(&block_hashes(0, &prompt('x', 16), BS));
        // The head of `a` survives, so a 2-block prefix still hits.
        assert_eq!(cached_tokens(&mut c, &a), 32);
    }

    #[test]
    fn clear_drops_everything() {
        let mut c = PrefixCache::new(10);
        let a = prompt('a', 32);
        c.insert(&block_hashes(0, &a, BS));
        c.clear();
        assert_eq!((c.len(), cached_tokens(&mut c, &a)), (0, 0));
    }
}
