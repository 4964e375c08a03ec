//! One backend's blocks from least to most recently used: a doubly linked
//! list in a slab, so that using a block again, forgetting one and taking
//! the oldest are each a few writes, whatever the number held. (A queue
//! that took renewals as new entries had to be swept of the stale ones
//! now and then, in one pass over up to millions of entries under the
//! index's lock: 50 ms and more that routing waited.)

/// A block's place in its list, kept by its holder.
pub type Node = u32;

const NIL: Node = Node::MAX;

#[derive(Default)]
pub struct Lru {
    slots: Vec<Slot>,
    /// A free slot, the head of a list through `next`.
    free: Option<Node>,
    oldest: Option<Node>,
    newest: Option<Node>,
    len: usize,
}

#[derive(Clone, Copy)]
struct Slot {
    block: u64,
    prev: Node,
    next: Node,
}

impl Lru {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `block`, newest.
    pub fn push(&mut self, block: u64) -> Node {
        let slot = Slot {
            block,
            prev: NIL,
            next: NIL,
        };
        let node = match self.free {
            Some(node) => {
                self.free = link(self.slots[node as usize].next);
                self.slots[node as usize] = slot;
                node
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as Node
            }
        };
        self.len += 1;
        self.attach(node);
        node
    }

    /// The block at `node` is used again: newest.
    pub fn touch(&mut self, node: Node) {
        if self.newest != Some(node) {
            self.detach(node);
            self.attach(node);
        }
    }

    /// Forget the block at `node`.
    pub fn remove(&mut self, node: Node) {
        self.detach(node);
        self.slots[node as usize].next = self.free.unwrap_or(NIL);
        self.free = Some(node);
        self.len -= 1;
    }

    /// The least recently used block and its node, still held.
    pub fn oldest(&self) -> Option<(u64, Node)> {
        self.oldest.map(|n| (self.slots[n as usize].block, n))
    }

    /// The blocks held, oldest first.
    #[cfg(test)]
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        let mut at = self.oldest;
        std::iter::from_fn(move || {
            let slot = self.slots[at? as usize];
            at = link(slot.next);
            Some(slot.block)
        })
    }

    fn attach(&mut self, node: Node) {
        let prev = self.newest.unwrap_or(NIL);
        self.slots[node as usize].prev = prev;
        self.slots[node as usize].next = NIL;
        match self.newest {
            Some(p) => self.slots[p as usize].next = node,
            None => self.oldest = Some(node),
        }
        self.newest = Some(node);
    }

    fn detach(&mut self, node: Node) {
        let Slot { prev, next, .. } = self.slots[node as usize];
        match link(prev) {
            Some(p) => self.slots[p as usize].next = next,
            None => self.oldest = link(next),
        }
        match link(next) {
            Some(n) => self.slots[n as usize].prev = prev,
            None => self.newest = link(prev),
        }
    }
}

fn link(node: Node) -> Option<Node> {
    (node != NIL).then_some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(lru: &Lru) -> Vec<u64> {
        lru.blocks().collect()
    }

    #[test]
    fn blocks_go_oldest_first_and_a_touch_makes_one_newest() {
        let mut lru = Lru::default();
        let nodes: Vec<Node> = (1..=4).map(|b| lru.push(b)).collect();
        assert_eq!(order(&lru), [1, 2, 3, 4]);
        lru.touch(nodes[0]);
        lru.touch(nodes[2]);
        lru.touch(nodes[2]);
        assert_eq!(order(&lru), [2, 4, 1, 3]);
        assert_eq!(lru.oldest(), Some((2, nodes[1])));
        lru.remove(nodes[1]);
        lru.remove(nodes[2]);
        assert_eq!(order(&lru), [4, 1]);
        assert_eq!((lru.len(), lru.oldest()), (2, Some((4, nodes[3]))));
    }

    #[test]
    fn freed_slots_are_used_again() {
        let mut lru = Lru::default();
        for round in 0..1000u64 {
            let a = lru.push(round);
            let b = lru.push(round + 1);
            lru.remove(a);
            lru.touch(b);
            lru.remove(b);
        }
        assert_eq!((lru.len(), lru.oldest(), lru.slots.len()), (0, None, 2));
        let n = lru.push(7);
        assert_eq!((order(&lru), lru.oldest()), (vec![7], Some((7, n))));
    }
}
