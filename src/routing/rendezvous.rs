//! Rendezvous (highest random weight) hashing: the ranking of a model's
//! backends for a request that carries an affinity key.
//!
//! The rendezvous hash is part of the product's contract: the same key must
//! pick the same backend in every process, after restarts and upgrades, and on
//! every replica. So it is a fixed function, never a randomly seeded hasher:
//!
//! ```text
//! h     = xxh3_64(key ‖ 0x00 ‖ address)      seed 0; address as "127.0.0.1:8000" / "[::1]:8000"
//! u     = (top 53 bits of h + 0.5) / 2^53    uniform in (0, 1)
//! score = -weight / ln(u)                    weighted HRW; with equal weights, rank by h
//! ```
//!
//! Backends are ranked by score, highest first (ties by address); the first
//! one that is usable serves the request, the next ones are the fallbacks.
//! Only the [`ORDERED`] best are ordered by score; the others follow in
//! address order, as every replica orders them.

use xxhash_rust::xxh3::xxh3_64;

/// The rendezvous hash of one (key, backend address) pair.
pub fn pair_hash(key: &[u8], address: &str) -> u64 {
    let mut pair = Pair::new(key);
    pair.hash(address)
}

/// `key ‖ 0x00`, kept while every address is hashed after it: one buffer
/// and one-shot hashes (as fast as xxh3 gets on short input) per ranking.
struct Pair(Vec<u8>);

impl Pair {
    fn new(key: &[u8]) -> Self {
        let mut buf = Vec::with_capacity(key.len() + 48);
        buf.extend_from_slice(key);
        buf.push(0);
        Pair(buf)
    }

    fn hash(&mut self, address: &str) -> u64 {
        let key_len = self.0.len();
        self.0.extend_from_slice(address.as_bytes());
        let h = xxh3_64(&self.0);
        self.0.truncate(key_len);
        h
    }
}

/// Weighted rendezvous score of a pair hash: `-weight / ln(u)`.
pub fn score(hash: u64, weight: u32) -> f64 {
    let u = ((hash >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(weight) / u.ln()
}

/// How many of the best scores a ranking orders; the other backends
/// follow them in address order. A request only ever needs its first
/// usable backend and a few fallbacks: ordering every backend of a large
/// pool would cost every request a sort.
pub const ORDERED: usize = 8;

/// The [`ORDERED`] best-scoring members of a ranking, best first, and
/// how many members there are: the whole order, without a list as long
/// as the pool.
#[derive(Debug, Clone, Copy)]
pub struct Best {
    top: [u32; ORDERED],
    len: usize,
    members: usize,
}

impl Best {
    /// Every member in order: the best scores, then the others in address
    /// order.
    pub fn order(self) -> impl Iterator<Item = usize> {
        let top = self.top;
        let len = self.len;
        let taken = move |m: &usize| top[..len].contains(&(*m as u32));
        (0..len)
            .map(move |i| top[i] as usize)
            .chain((0..self.members).filter(move |m| !taken(m)))
    }

    /// Where member `m` comes in [`Best::order`].
    pub fn place(&self, m: usize) -> usize {
        let top = &self.top[..self.len];
        match top.iter().position(|t| *t as usize == m) {
            Some(i) => i,
            None => self.len + m - top.iter().filter(|t| (**t as usize) < m).count(),
        }
    }
}

/// The ranking of `backends` (address, weight; `equal`: all weights the
/// same) for `key`: the [`ORDERED`] best scores from the best down (equal
/// scores in address order), then the others in address order.
pub fn best(key: &[u8], backends: &[(String, u32)], equal: bool) -> Best {
    let mut pair = Pair::new(key);
    // As integers that order as the scores do: with equal weights the score
    // rises with u, and u with the hash's top 53 bits (no logarithm per
    // backend); a positive float's bits order as the float does.
    let mut kept = [(0u64, 0u32); ORDERED];
    let mut len = 0;
    for (i, (addr, weight)) in backends.iter().enumerate() {
        let h = pair.hash(addr);
        let s = if equal {
            h >> 11
        } else {
            score(h, *weight).to_bits()
        };
        // Strictly better than the last kept: of equal scores the earlier
        // address stays ahead.
        if len == ORDERED && s <= kept[ORDERED - 1].0 {
            continue;
        }
        let at = kept[..len].partition_point(|(k, _)| *k >= s);
        len = (len + 1).min(ORDERED);
        kept.copy_within(at..len - 1, at + 1);
        kept[at] = (s, i as u32);
    }
    let mut top = [0u32; ORDERED];
    for (t, (_, i)) in top.iter_mut().zip(&kept[..len]) {
        *t = *i;
    }
    Best {
        top,
        len,
        members: backends.len(),
    }
}

/// Indices of `backends` in their whole ranking for `key` ([`best`]'s
/// order): what a test or a tool compares routing against.
pub fn rank(key: &[u8], backends: &[(String, u32)]) -> Vec<usize> {
    let equal = backends.windows(2).all(|w| w[0].1 == w[1].1);
    best(key, backends, equal).order().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn addrs(n: usize) -> Vec<(String, u32)> {
        (0..n)
            .map(|i| (format!("10.0.0.{}:8000", i + 1), 1))
            .collect()
    }

    fn owner(key: &[u8], backends: &[(String, u32)]) -> String {
        backends[rank(key, backends)[0]].0.clone()
    }

    const PINNED_HASH: u64 = 13732478783610186787;
    const PINNED_RANK: [usize; 4] = [0, 3, 1, 2];

    #[test]
    fn the_hash_is_a_fixed_function() {
        // Pinned values: if these change, every deployed key moves.
        assert_eq!(pair_hash(b"session-1", "127.0.0.1:8000"), PINNED_HASH);
        assert_eq!(rank(b"session-1", &addrs(4)), PINNED_RANK);
    }

    #[test]
    fn spread_is_even_within_ten_percent() {
        let backends = addrs(4);
        let mut counts: HashMap<String, usize> = HashMap::new();
        for k in 0..10_000 {
            *counts
                .entry(owner(format!("key-{k}").as_bytes(), &backends))
                .or_default() += 1;
        }
        for (addr, c) in counts {
            assert!((2250..=2750).contains(&c), "{addr} got {c} of 10000");
        }
    }

    #[test]
    fn addresses_differing_only_in_port_spread_evenly() {
        let backends: Vec<(String, u32)> =
            (1..=3).map(|p| (format!("127.0.0.1:1800{p}"), 1)).collect();
        let mut counts: HashMap<String, usize> = HashMap::new();
        for k in 0..9_000 {
            *counts
                .entry(owner(format!("session-k{k}").as_bytes(), &backends))
                .or_default() += 1;
        }
        for (addr, c) in counts {
            assert!((2700..=3300).contains(&c), "{addr} got {c} of 9000");
        }
    }

    #[test]
    fn adding_a_backend_moves_only_keys_to_it() {
        let four = addrs(4);
        let five = addrs(5);
        let mut moved = 0;
        for k in 0..10_000 {
            let key = format!("key-{k}");
            let before = owner(key.as_bytes(), &four);
            let after = owner(key.as_bytes(), &five);
            if before != after {
                assert_eq!(after, five[4].0, "a key moved between old backends");
                moved += 1;
            }
        }
        // About a fifth of the keys move, all of them to the new backend.
        assert!((1700..=2300).contains(&moved), "moved {moved}");
    }

    #[test]
    fn removing_a_backend_moves_only_its_keys() {
        let four = addrs(4);
        let three: Vec<_> = four[..3].to_vec();
        for k in 0..5_000 {
            let key = format!("key-{k}");
            let before = owner(key.as_bytes(), &four);
            if before != four[3].0 {
                assert_eq!(before, owner(key.as_bytes(), &three));
            }
        }
    }

    #[test]
    fn fallback_is_the_next_highest_score() {
        let four = addrs(4);
        for k in 0..1000 {
            let key = format!("key-{k}");
            let order = rank(key.as_bytes(), &four);
            // Without the owner, the owner's runner-up takes over.
            let without: Vec<_> = four
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != order[0])
                .map(|(_, b)| b.clone())
                .collect();
            assert_eq!(owner(key.as_bytes(), &without), four[order[1]].0);
        }
    }

    #[test]
    fn weights_shift_the_share() {
        let mut backends = addrs(2);
        backends[1].1 = 3;
        let heavy = (0..10_000)
            .filter(|k| owner(format!("key-{k}").as_bytes(), &backends) == backends[1].0)
            .count();
        // Weighted HRW gives weight share 3/4.
        assert!((7100..=7900).contains(&heavy), "heavy got {heavy}");
    }

    #[test]
    fn the_best_scores_come_in_order_then_the_rest_by_address() {
        for weighted in [false, true] {
            let mut backends = addrs(20);
            if weighted {
                backends[3].1 = 3;
                backends[11].1 = 2;
            }
            for k in 0..500 {
                let key = format!("key-{k}");
                let s = |i: usize| score(pair_hash(key.as_bytes(), &backends[i].0), backends[i].1);
                let mut by_score: Vec<usize> = (0..backends.len()).collect();
                by_score.sort_by(|a, b| s(*b).total_cmp(&s(*a)).then(a.cmp(b)));
                let mut expected = by_score[..ORDERED].to_vec();
                let mut rest = by_score[ORDERED..].to_vec();
                rest.sort();
                expected.extend(rest);
                let ranked = rank(key.as_bytes(), &backends);
                assert_eq!(ranked, expected, "{key}");
                let best = best(key.as_bytes(), &backends, !weighted);
                for (place, m) in ranked.iter().enumerate() {
                    assert_eq!(best.place(*m), place, "{key}");
                }
            }
        }
    }
}
