//! Weighted round-robin: the turn of a request without an affinity key.

use std::sync::atomic::{AtomicUsize, Ordering};

pub struct RoundRobin {
    /// Member indices, each repeated by its weight.
    turns: Vec<usize>,
    next: AtomicUsize,
}

impl RoundRobin {
    pub fn new(weights: impl IntoIterator<Item = u32>) -> Self {
        let turns = weights
            .into_iter()
            .enumerate()
            .flat_map(|(i, w)| std::iter::repeat_n(i, w.max(1) as usize))
            .collect();
        RoundRobin {
            turns,
            next: AtomicUsize::new(0),
        }
    }

    /// This turn's member first, then the others in member order from it, as
    /// its fallbacks. `n` is the number of members.
    pub fn order(&self, n: usize) -> impl Iterator<Item = usize> {
        let first = match self.turns.len() {
            0 => 0,
            len => self.turns[self.next.fetch_add(1, Ordering::Relaxed) % len],
        };
        (0..n).map(move |i| (first + i) % n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_follow_the_weights_and_fallbacks_rotate() {
        let rr = RoundRobin::new([1, 2, 1]);
        let firsts: Vec<usize> = (0..8).map(|_| rr.order(3).next().unwrap()).collect();
        assert_eq!(firsts, [0, 1, 1, 2, 0, 1, 1, 2]);
        assert_eq!(rr.order(3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(rr.order(3).collect::<Vec<_>>(), [1, 2, 0]);
    }
}
