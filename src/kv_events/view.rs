//! What one backend's events say it holds, applied to its model's prefix
//! index: vLLM names a block by its own hash (of its algorithm and seed);
//! the index names it by a chain over the block's token ids
//! (`routing::chain::of_tokens`), the name a request's prompt gets too. Each
//! stored block's vLLM hash is mapped to the index's name, so that a
//! removal finds it and a child block chains from it.
//!
//! ```text
//! BlockStored:      each block's link = token_link(link of its parent, its ids)
//!                   (the first's parent: parent_block_hash's link; none: 0),
//!                   then namespaced by its adapter; held by the backend
//!   blocks with extra keys (a cache salt, an image): links made foreign, so
//!                   no plain prompt's chain matches them or their children
//!   a parent not known, another block size, another medium: not applied
//! BlockRemoved:     each block known: no longer held
//! AllBlocksCleared: the backend holds nothing
//! ```

use std::net::SocketAddr;

use rustc_hash::FxHashMap;

use super::wire::{BlockHash, Event, Medium, Stored};
use crate::routing::chain::{namespace_of, token_link};
use crate::routing::index::PrefixIndex;

/// Mixed into the links of blocks with extra keys.
const FOREIGN: u64 = 0x9e37_79b9_7f4a_7c15;

/// What applying an event did, for the metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub stored: u64,
    pub removed: u64,
    /// Blocks not applied: an unknown parent, another block size or medium.
    pub skipped: u64,
    pub cleared: bool,
}

/// One backend's blocks as its events tell them.
pub struct Holdings {
    addr: SocketAddr,
    block_size: usize,
    /// vLLM's name of each block held -> its link (before its namespace)
    /// and its name in the index.
    blocks: FxHashMap<BlockHash, (u64, u64)>,
    /// Blocks known at most: past it, the backend is forgotten and learnt
    /// again (the index's own bound is the same).
    max: usize,
}

impl Holdings {
    pub fn new(addr: SocketAddr, block_size: usize, max: usize) -> Self {
        Holdings {
            addr,
            block_size,
            blocks: FxHashMap::default(),
            max,
        }
    }

    pub fn apply(&mut self, index: &PrefixIndex, event: &Event) -> Applied {
        match event {
            Event::Stored(s) => self.stored(index, s),
            Event::Removed { hashes, medium } => {
                let mut applied = Applied::default();
                if *medium != Medium::Gpu {
                    applied.skipped = hashes.len() as u64;
                    return applied;
                }
                let gone: Vec<u64> = hashes
                    .iter()
                    .filter_map(|h| self.blocks.remove(h).map(|(_, name)| name))
                    .collect();
                applied.removed = gone.len() as u64;
                index.remove(self.addr, &gone);
                applied
            }
            Event::Cleared => {
                self.clear(index);
                Applied {
                    cleared: true,
                    ..Applied::default()
                }
            }
            Event::Other => Applied::default(),
        }
    }

    /// Forget every block (a restart, a lost gap, a dropped connection).
    pub fn clear(&mut self, index: &PrefixIndex) {
        self.blocks.clear();
        index.forget(&self.addr);
    }

    fn stored(&mut self, index: &PrefixIndex, s: &Stored) -> Applied {
        let skipped = Applied {
            skipped: s.hashes.len() as u64,
            ..Applied::default()
        };
        if s.medium != Medium::Gpu
            || s.block_size != self.block_size
            || s.token_ids.len() != s.hashes.len() * s.block_size
        {
            return skipped;
        }
        let mut link = match s.parent {
            None => 0,
            Some(p) => match self.blocks.get(&p) {
                Some((link, _)) => *link,
                None => return skipped,
            },
        };
        let space = s.lora.as_deref().map_or(0, namespace_of);
        let mut names = Vec::with_capacity(s.hashes.len());
        for (hash, ids) in s
            .hashes
            .iter()
            .zip(s.token_ids.chunks_exact(self.block_size))
        {
            link = token_link(link, ids);
            if s.extra_keys {
                link ^= FOREIGN;
            }
            let name = link ^ space;
            self.blocks.insert(*hash, (link, name));
            names.push(name);
        }
        if self.blocks.len() > self.max {
            self.clear(index);
            return skipped;
        }
        index.insert(self.addr, &names);
        Applied {
            stored: names.len() as u64,
            ..Applied::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::chain::of_tokens;

    fn addr() -> SocketAddr {
        "127.0.0.1:8000".parse().unwrap()
    }

    fn stored(hashes: &[u64], parent: Option<u64>, ids: std::ops::Range<u32>) -> Event {
        Event::Stored(Stored {
            hashes: hashes.iter().map(|h| BlockHash(*h)).collect(),
            parent: parent.map(BlockHash),
            token_ids: ids.collect(),
            block_size: 4,
            ..Stored::default()
        })
    }

    fn held(index: &PrefixIndex, tokens: &[u32]) -> usize {
        index
            .lookup(&of_tokens(tokens, 4))
            .first()
            .map_or(0, |h| h.blocks)
    }

    #[test]
    fn stored_blocks_match_a_prompt_of_the_same_ids_and_removals_apply() {
        let index = PrefixIndex::new(1000, 1000);
        let mut h = Holdings::new(addr(), 4, 1000);
        let prompt: Vec<u32> = (0..14).collect();
        // Two blocks, then a third chained from the second.
        assert_eq!(h.apply(&index, &stored(&[1, 2], None, 0..8)).stored, 2);
        assert_eq!(h.apply(&index, &stored(&[3], Some(2), 8..12)).stored, 1);
        assert_eq!(held(&index, &prompt), 3);
        // Another prompt shares only the first block.
        let other: Vec<u32> = (0..4).chain(100..110).collect();
        assert_eq!(held(&index, &other), 1);
        let removed = Event::Removed {
            hashes: vec![BlockHash(3), BlockHash(99)],
            medium: Medium::Gpu,
        };
        assert_eq!(h.apply(&index, &removed).removed, 1);
        assert_eq!(held(&index, &prompt), 2);
        assert!(h.apply(&index, &Event::Cleared).cleared);
        assert_eq!(held(&index, &prompt), 0);
    }

    #[test]
    fn what_cannot_be_placed_is_skipped() {
        let index = PrefixIndex::new(1000, 1000);
        let mut h = Holdings::new(addr(), 4, 1000);
        // Parent never seen.
        assert_eq!(h.apply(&index, &stored(&[5], Some(4), 4..8)).skipped, 1);
        // Another block size.
        let Event::Stored(mut s) = stored(&[1], None, 0..8) else {
            unreachable!()
        };
        s.block_size = 8;
        assert_eq!(h.apply(&index, &Event::Stored(s)).skipped, 1);
        assert_eq!(held(&index, &(0..8).collect::<Vec<_>>()), 0);
    }

    #[test]
    fn an_adapters_or_salted_blocks_never_match_a_plain_prompt() {
        let index = PrefixIndex::new(1000, 1000);
        let mut h = Holdings::new(addr(), 4, 1000);
        for (lora, extra_keys) in [(Some("sql".to_string()), false), (None, true)] {
            let event = Event::Stored(Stored {
                hashes: vec![BlockHash(1)],
                token_ids: (0..4).collect(),
                block_size: 4,
                lora,
                extra_keys,
                ..Stored::default()
            });
            assert_eq!(h.apply(&index, &event).stored, 1);
            assert_eq!(held(&index, &[0, 1, 2, 3]), 0);
        }
    }

    #[test]
    fn past_its_bound_a_backend_is_forgotten() {
        let index = PrefixIndex::new(1000, 1000);
        let mut h = Holdings::new(addr(), 4, 2);
        h.apply(&index, &stored(&[1, 2], None, 0..8));
        assert_eq!(h.apply(&index, &stored(&[3], Some(2), 8..12)).skipped, 1);
        assert_eq!(held(&index, &(0..12).collect::<Vec<_>>()), 0);
    }
}
