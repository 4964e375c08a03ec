//! One backend's line of waiting requests, fair between tenants.
//!
//! Order. Agent requests go before warmups. Within a class a freed slot goes
//! to the tenant granted the fewest slots for its weight, by start-time fair
//! queueing (Goyal, Vin and Cheng, 1996), one request being one unit of
//! service (requests, not tokens as the Virtual Token Counter counts), on
//! each backend apart:
//!
//! - Each class has a virtual clock, and each tenant a tag per class: while
//!   the tenant waits, the virtual start of its oldest request; otherwise the
//!   virtual finish of its last one granted.
//! - A slot goes to the waiting tenant with the lowest tag (a tie: to the
//!   older request), its oldest request: first-in first-out within a tenant.
//!   The clock moves to that tag and the tenant's tag grows by
//!   `REQUEST / weight` (rounded down, less than 0.01% off). Tenants that all
//!   wait are so served in proportion to their weights, interleaved: 3:1
//!   gives A B A A A B A A A B...
//! - A tenant that starts waiting takes the tag `max(its tag, clock)`: idle,
//!   it banks no credit; it re-enters level with the tenant served last, at
//!   most one request ahead of the others, then takes its weighted turn. A
//!   tag still ahead of the clock (slots granted lately) counts against it.
//! - Work-conserving: a slot is never kept for an absent tenant; a tenant
//!   alone gets every slot, whatever its weight.
//! - When no one of a class waits, its clock and tags restart at 0: slots
//!   granted while no one waited took no one's turn. For the same reason a
//!   request that finds a free slot and no line takes it without a tag.
//!
//! Places. The line holds at most `max_queue_depth` requests of both
//! classes. A tenant's share of them is `max_queue_depth * weight / W`, `W`
//! the sum of the weights of the tenants waiting and of the newcomer's. When
//! the line is full, a request of a tenant holding fewer places than its
//! share takes a place instead of being refused:
//!
//! - an agent request, a warmup's place while one waits, any tenant's
//!   (warmups come last anyway);
//! - otherwise, the place of a request of its own class held by a tenant
//!   over its share; so a warmup never takes an agent's place.
//!
//! The place taken is the newest request of that class of the tenant most
//! places over its share (a tie: of the tenant whose newest request of that
//! class came last); that request leaves the line refused (`QueueFull`). A
//! tenant at or over its share is refused, so a lone tenant meets a full
//! line as before tenants were told apart, and an agent request of a tenant
//! that keeps within its share is never refused because another floods.
//!
//! Cost: each grant, place taken or request leaving looks once at every
//! tenant in the line (those waiting, and those whose tag is still ahead of
//! its clock); a tenant's queues are kept for reuse when it leaves.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{AdmitError, Class};

/// The largest weight; a larger one is taken as this.
pub const MAX_WEIGHT: u32 = 1000;

/// One request of a tenant of weight 1, in virtual time.
const REQUEST: u64 = 1 << 24;

/// The classes in the order they are served; a class indexes by `as usize`.
const CLASSES: [Class; 2] = [Class::Agent, Class::Warmup];

/// A tenant as admission sees it: its name, and its weight (its share of
/// a backend's slots against the other tenants'). Cheap to clone (the
/// name is shared) and compare.
#[derive(Debug, Clone)]
pub struct Share {
    name: Arc<str>,
    weight: u32,
}

impl Share {
    /// `weight`: its share relative to the others, 1 to [`MAX_WEIGHT`]
    /// (clamped: a weight 0 would make its requests free).
    pub fn new(name: impl Into<Arc<str>>, weight: u32) -> Self {
        Share {
            name: name.into(),
            weight: weight.clamp(1, MAX_WEIGHT),
        }
    }

    /// Its name (the tenant's metric label).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn is(&self, other: &Share) -> bool {
        Arc::ptr_eq(&self.name, &other.name) || self.name == other.name
    }

    /// One of its requests, in virtual time.
    fn cost(&self) -> u64 {
        REQUEST / u64::from(self.weight)
    }
}

/// The waiting requests of one backend: `T` each, known by the id
/// [`Line::push`] returns.
pub struct Line<T> {
    tenants: Vec<Entry<T>>,
    /// Per class.
    clocks: [u64; 2],
    waiting: [usize; 2],
    next_id: u64,
    /// Queues of tenants that left, for the next that comes.
    spare: Vec<VecDeque<(u64, T)>>,
}

struct Entry<T> {
    tenant: Share,
    /// Per class.
    lanes: [Lane<T>; 2],
}

struct Lane<T> {
    /// Oldest first, with their ids (increasing).
    waiters: VecDeque<(u64, T)>,
    /// While waiting: the virtual start of the oldest; else the virtual
    /// finish of the last granted.
    tag: u64,
}

impl<T> Entry<T> {
    fn places(&self) -> usize {
        self.lanes.iter().map(|l| l.waiters.len()).sum()
    }
}

impl<T> Default for Line<T> {
    fn default() -> Self {
        Line {
            tenants: Vec::new(),
            clocks: [0; 2],
            waiting: [0; 2],
            next_id: 0,
            spare: Vec::new(),
        }
    }
}

impl<T> Line<T> {
    pub fn len(&self) -> usize {
        self.waiting.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Join the line (the caller checked there is room).
    pub fn push(&mut self, class: Class, tenant: &Share, waiter: T) -> u64 {
        let c = class as usize;
        let i = match self.tenants.iter().position(|e| e.tenant.is(tenant)) {
            Some(i) => i,
            None => {
                let lanes = [(); 2].map(|()| Lane {
                    waiters: self.spare.pop().unwrap_or_default(),
                    tag: 0,
                });
                self.tenants.push(Entry {
                    tenant: tenant.clone(),
                    lanes,
                });
                self.tenants.len() - 1
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let lane = &mut self.tenants[i].lanes[c];
        if lane.waiters.is_empty() {
            lane.tag = lane.tag.max(self.clocks[c]);
        }
        lane.waiters.push_back((id, waiter));
        self.waiting[c] += 1;
        id
    }

    /// The next waiter to be given a slot.
    pub fn pop(&mut self) -> Option<T> {
        let class = CLASSES
            .into_iter()
            .find(|&c| self.waiting[c as usize] > 0)?;
        let c = class as usize;
        let (_, i) = self
            .tenants
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let lane = &e.lanes[c];
                Some(((lane.tag, lane.waiters.front()?.0), i))
            })
            .min()?;
        let entry = &mut self.tenants[i];
        let cost = entry.tenant.cost();
        let lane = &mut entry.lanes[c];
        let (_, waiter) = lane.waiters.pop_front()?;
        self.clocks[c] = lane.tag;
        lane.tag += cost;
        self.left(class);
        Some(waiter)
    }

    /// With `depth` places, make room for a request of `tenant`: nothing to
    /// do, or the waiter whose place it takes, or refused.
    pub fn make_room(
        &mut self,
        class: Class,
        tenant: &Share,
        depth: usize,
    ) -> Result<Option<T>, AdmitError> {
        if self.len() < depth {
            return Ok(None);
        }
        let mut own = 0;
        let mut total_weight = u64::from(tenant.weight);
        for e in &self.tenants {
            let places = e.places();
            if e.tenant.is(tenant) {
                own = places;
            } else if places > 0 {
                total_weight += u64::from(e.tenant.weight);
            }
        }
        // Places over the share, in 1/W of a place, so integers compare.
        let excess = |places: usize, weight: u32| {
            places as i128 * i128::from(total_weight) - depth as i128 * i128::from(weight)
        };
        if excess(own, tenant.weight) >= 0 {
            return Err(AdmitError::QueueFull);
        }
        let over_warmup = class == Class::Agent && self.waiting[Class::Warmup as usize] > 0;
        let from = if over_warmup { Class::Warmup } else { class };
        let victim = self
            .tenants
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let newest = e.lanes[from as usize].waiters.back()?.0;
                Some((excess(e.places(), e.tenant.weight), newest, i))
            })
            .max();
        let i = match victim {
            Some((over, _, i)) if over_warmup || over > 0 => i,
            _ => return Err(AdmitError::QueueFull),
        };
        let displaced = self.tenants[i].lanes[from as usize].waiters.pop_back();
        self.left(from);
        Ok(displaced.map(|(_, waiter)| waiter))
    }

    /// Take the waiter `id` out of the line; false if it is not in it.
    pub fn remove(&mut self, id: u64) -> bool {
        for class in CLASSES {
            let c = class as usize;
            for e in &mut self.tenants {
                let waiters = &mut e.lanes[c].waiters;
                if let Some(k) = waiters.iter().position(|&(w, _)| w == id) {
                    // The next inherits the tag: no slot was granted.
                    waiters.remove(k);
                    self.left(class);
                    return true;
                }
            }
        }
        false
    }

    /// A waiter of `class` left the line.
    fn left(&mut self, class: Class) {
        let c = class as usize;
        self.waiting[c] -= 1;
        if self.waiting[c] == 0 {
            self.clocks[c] = 0;
            for e in &mut self.tenants {
                e.lanes[c].tag = 0;
            }
        }
        // Forget tenants that neither wait nor owe: they would re-enter at
        // the clock anyway.
        let mut i = 0;
        while i < self.tenants.len() {
            let e = &self.tenants[i];
            let done = (e.lanes.iter().zip(self.clocks))
                .all(|(l, clock)| l.waiters.is_empty() && l.tag <= clock);
            if done {
                let e = self.tenants.swap_remove(i);
                self.spare.extend(e.lanes.map(|l| l.waiters));
            } else {
                i += 1;
            }
        }
        debug_assert!(!self.is_empty() || self.tenants.is_empty());
    }
}
