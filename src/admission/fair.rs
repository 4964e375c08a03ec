//! One backend's line of waiting requests, fair between tenants.
//!
//! Order. Agent requests go before warmups. Within a class a freed slot goes
//! to the tenant granted the least service for its weight, by start-time
//! fair queueing (Goyal, Vin and Cheng, 1996), on each backend apart. A
//! request's service is what the caller says it costs (`tokens`: one unit,
//! or its weighted tokens as the Virtual Token Counter counts them, Sheng
//! et al. 2024), estimated when it is granted and corrected once when it
//! ends:
//!
//! - Each class has a virtual clock, and each tenant a tag per class: while
//!   the tenant waits, the virtual start of its oldest request; otherwise the
//!   virtual finish of its last one granted.
//! - A slot goes to the waiting tenant with the lowest tag (a tie: to the
//!   older request), its oldest request: first-in first-out within a tenant.
//!   The clock moves to that tag and the tenant's tag grows by the request's
//!   `service / weight` (rounded down, less than 0.1% off). Tenants that all
//!   wait are so served in proportion to their weights, interleaved: 3:1
//!   in requests gives A B A A A B A A A B...
//! - When a granted request ends, its tenant's tag moves by the difference
//!   between what it cost and what it was charged (`settle`): a request
//!   that reported fewer tokens than estimated gives the rest back. A
//!   request whose attempt failed before it was served is charged nothing.
//! - A tenant that starts waiting takes the tag `max(its tag, clock)`: idle,
//!   it banks no credit; it re-enters level with the tenant served last, at
//!   most one request ahead of the others, then takes its weighted turn. A
//!   tag still ahead of the clock (service granted lately) counts against
//!   it.
//! - Work-conserving: a slot is never kept for an absent tenant; a tenant
//!   alone gets every slot, whatever its weight.
//! - When no one of a class waits, its clock and tags restart at 0, and the
//!   corrections still to come of that class are dropped (each grant
//!   carries its epoch): slots granted while no one waited took no one's
//!   turn. For the same reason a request that finds a free slot and no
//!   line takes it without a tag.
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
//! Places are counted in requests, in either unit: a place is a wait, and
//! the order of service is what the unit decides.
//!
//! Cost: each grant, place taken, request leaving or request settled looks
//! once at every tenant in the line (those waiting, those whose tag is
//! still ahead of its clock, and those with a granted request still to
//! settle); a tenant's queues are kept for reuse when it leaves.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{AdmitError, Class};

/// The largest weight; a larger one is taken as this.
pub const MAX_WEIGHT: u32 = 1000;

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

    /// `units` of service, in its virtual time.
    fn cost(&self, units: u64) -> u64 {
        units / u64::from(self.weight)
    }
}

/// The waiting requests of one backend: `T` each, known by the id
/// [`Line::push`] returns.
pub struct Line<T> {
    tenants: Vec<Entry<T>>,
    /// Per class.
    clocks: [u64; 2],
    waiting: [usize; 2],
    /// Per class: how many times its clock restarted.
    epochs: [u64; 2],
    next_id: u64,
    /// Queues of tenants that left, for the next that comes.
    spare: Vec<VecDeque<Waiting<T>>>,
}

/// A waiter, its id (increasing) and the units it is charged when granted.
type Waiting<T> = (u64, u64, T);

/// A slot granted from the line: what to correct when the request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    class: Class,
    epoch: u64,
    /// What its tenant's tag grew by.
    cost: u64,
}

struct Entry<T> {
    tenant: Share,
    /// Per class.
    lanes: [Lane<T>; 2],
}

struct Lane<T> {
    /// Oldest first.
    waiters: VecDeque<Waiting<T>>,
    /// While waiting: the virtual start of the oldest; else the virtual
    /// finish of the last granted.
    tag: u64,
    /// Granted in this epoch and not yet settled.
    unsettled: usize,
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
            epochs: [0; 2],
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

    /// Join the line (the caller checked there is room), to be charged
    /// `units` of service when granted.
    pub fn push(&mut self, class: Class, tenant: &Share, units: u64, waiter: T) -> u64 {
        let c = class as usize;
        let i = match self.tenants.iter().position(|e| e.tenant.is(tenant)) {
            Some(i) => i,
            None => {
                let lanes = [(); 2].map(|()| Lane {
                    waiters: self.spare.pop().unwrap_or_default(),
                    tag: 0,
                    unsettled: 0,
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
        lane.waiters.push_back((id, units, waiter));
        self.waiting[c] += 1;
        id
    }

    /// The next waiter to be given a slot, and its grant to settle.
    pub fn pop(&mut self) -> Option<(T, Grant)> {
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
        let lane = &mut entry.lanes[c];
        let (_, units, waiter) = lane.waiters.pop_front()?;
        let cost = entry.tenant.cost(units);
        self.clocks[c] = lane.tag;
        lane.tag += cost;
        lane.unsettled += 1;
        let grant = Grant {
            class,
            epoch: self.epochs[c],
            cost,
        };
        self.left(class);
        Some((waiter, grant))
    }

    /// A request of `tenant` granted by [`Line::pop`] ended having cost
    /// `units`: its tenant's tag moves by the difference from its charge.
    /// Nothing after its class's clock restarted.
    pub fn settle(&mut self, tenant: &Share, grant: Grant, units: u64) {
        let c = grant.class as usize;
        if grant.epoch != self.epochs[c] {
            return;
        }
        // Present: a tenant with a grant to settle is never forgotten.
        let Some(e) = self.tenants.iter_mut().find(|e| e.tenant.is(tenant)) else {
            return;
        };
        let lane = &mut e.lanes[c];
        lane.unsettled -= 1;
        lane.tag = (lane.tag + e.tenant.cost(units)).saturating_sub(grant.cost);
        self.forget_done();
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
        Ok(displaced.map(|(_, _, waiter)| waiter))
    }

    /// Take the waiter `id` out of the line; false if it is not in it.
    pub fn remove(&mut self, id: u64) -> bool {
        for class in CLASSES {
            let c = class as usize;
            for e in &mut self.tenants {
                let waiters = &mut e.lanes[c].waiters;
                if let Some(k) = waiters.iter().position(|&(w, _, _)| w == id) {
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
            self.epochs[c] += 1;
            for e in &mut self.tenants {
                e.lanes[c].tag = 0;
                e.lanes[c].unsettled = 0;
            }
        }
        self.forget_done();
    }

    /// Forget tenants that neither wait, nor owe, nor have a grant to
    /// settle: they would re-enter at the clock anyway.
    fn forget_done(&mut self) {
        let mut i = 0;
        while i < self.tenants.len() {
            let e = &self.tenants[i];
            let done = (e.lanes.iter().zip(self.clocks))
                .all(|(l, clock)| l.waiters.is_empty() && l.tag <= clock && l.unsettled == 0);
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
