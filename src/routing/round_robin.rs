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
    pub fn turn(&self, n: usize) -> Turn {
        let first = match self.turns.len() {
            0 => 0,
            len => self.turns[self.next.fetch_add(1, Ordering::Relaxed) % len],
        };
        Turn { first, n }
    }
}

/// One request's turn: its member, then the others in member order from it.
#[derive(Debug, Clone, Copy)]
pub struct Turn {
    first: usize,
    n: usize,
}

impl Turn {
    /// Every member in order.
    pub fn order(self) -> impl Iterator<Item = usize> {
        (0..self.n).map(move |i| (self.first + i) % self.n)
    }

    /// Where member `m` comes in [`Turn::order`].
    pub fn place(&self, m: usize) -> usize {
        (m + self.n - self.first) % self.n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_follow_the_weights_and_fallbacks_rotate() {
        let rr = RoundRobin::new([1, 2, 1]);
        let firsts: Vec<usize> = (0..8).map(|_| rr.turn(3).order().next().unwrap()).collect();
        assert_eq!(firsts, [0, 1, 1, 2, 0, 1, 1, 2]);
        assert_eq!(rr.turn(3).order().collect::<Vec<_>>(), [0, 1, 2]);
        let turn = rr.turn(3);
        assert_eq!(turn.order().collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!([0, 1, 2].map(|m| turn.place(m)), [2, 0, 1]);
    }
}
