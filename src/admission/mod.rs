//! Per-backend admission: at most `max_num_seqs` requests in
//! flight upstream, at most `max_queue_depth` waiting, and nothing more: the
//! next request is refused at once, so no task piles up.
//!
//! Waiters are served agent requests first, then warmups; within each class
//! fairly between tenants by weight, in requests or in the GPU work they
//! cost (`tokens`), first-in first-out within a tenant. A full queue gives
//! the place of a tenant over its share to a tenant under it (see `fair`).
//! With one tenant: first-in first-out within each class, and a full queue
//! refuses.
//!
//! Every resource is a guard: a [`Permit`] frees its slot when dropped
//! (handing it straight to the next waiter), a [`Ticket`] leaves the queue
//! when dropped, so cancellation (a client gone, a timeout, an error) cannot
//! leak a slot or a place. A permit also carries its request's charge:
//! [`Permit::finish`] corrects it by what the response reported,
//! [`Permit::refund`] takes it back (an attempt that failed and moves on);
//! dropped otherwise, the estimate stands.
//!
//! With `scheduler.load_feedback` the slot limit moves with the backend's
//! load reports (see `feedback`): a lower limit takes effect as slots are
//! freed (none is taken back), a higher one hands slots to waiters at once.

mod fair;
mod feedback;
pub mod load_report;
mod tokens;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus::IntGauge;
use tokio::sync::oneshot;

use fair::{Grant, Line};
pub use fair::{Share, MAX_WEIGHT};
use feedback::Feedback;
pub use feedback::Fleet;
use tokens::Pricing;
pub use tokens::{Demand, Fairness, Reported, Work};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Agent,
    Warmup,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// Also when a tenant under its share took the place.
    #[error("every slot and queue place of the backend is taken")]
    QueueFull,
    #[error("waited longer than the queue timeout")]
    QueueTimeout,
}

/// What one backend takes from this gateway: requests holding a slot,
/// and requests waiting for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub max_num_seqs: usize,
    pub max_queue_depth: usize,
}

impl Capacity {
    /// One replica's share when `replicas` gateways admit to the same
    /// backend: each limit divided, rounded up so that no replica is left
    /// without a slot (together they may exceed it by `replicas - 1`).
    pub fn shared_by(self, replicas: usize) -> Capacity {
        Capacity {
            max_num_seqs: self.max_num_seqs.div_ceil(replicas),
            max_queue_depth: self.max_queue_depth.div_ceil(replicas),
        }
    }
}

/// Live counts, mirrored into the gauges on every change.
pub struct Gauges {
    pub inflight: IntGauge,
    pub queued: IntGauge,
}

pub struct Admission {
    limits: Capacity,
    state: Mutex<State>,
    /// In flight plus queued, readable without the lock (routing reads it).
    load: AtomicUsize,
    /// Load feedback on: the slot limit moves (and is read under the lock).
    steered: bool,
    gauges: Gauges,
}

/// A waiting request: where its permit is sent (dropped unsent, its place
/// was taken), and what it will be charged.
struct Waiter {
    tx: oneshot::Sender<Permit>,
    charge: Charge,
}

/// What a request in flight was charged, to settle when it ends.
struct Charge {
    tenant: Share,
    estimate: Work,
    /// Granted from the line: its tenant's tag to correct. None when it
    /// found a free slot and no line.
    grant: Option<Grant>,
}

/// How a request's charge is settled when its slot is freed.
enum Settled {
    /// By what its response reported, after this long in the slot.
    Reported(Reported, Duration),
    /// Its estimate stands.
    Estimated,
    /// Served nothing: charged nothing.
    Refunded,
}

struct State {
    running: usize,
    line: Line<Waiter>,
    /// With load feedback: the moving slot limit.
    feedback: Option<Feedback>,
    pricing: Pricing,
}

impl State {
    fn queued(&self) -> usize {
        self.line.len()
    }

    fn slot_limit(&self, limits: Capacity, now: Instant) -> usize {
        match &self.feedback {
            Some(f) => f.limit(now),
            None => limits.max_num_seqs,
        }
    }
}

impl Admission {
    /// `feedback`: with `scheduler.load_feedback`, the backend as the
    /// replicas share it (its whole `max_num_seqs` is the most slots its
    /// reports may lend this replica).
    /// `fairness`: the unit tenants' shares are counted in.
    pub fn new(
        limits: Capacity,
        feedback: Option<Fleet>,
        fairness: Fairness,
        gauges: Gauges,
    ) -> Arc<Self> {
        let state = State {
            running: 0,
            line: Line::default(),
            feedback: feedback.map(|fleet| Feedback::new(limits.max_num_seqs, fleet)),
            pricing: Pricing::new(fairness),
        };
        Arc::new(Admission {
            limits,
            state: Mutex::new(state),
            load: AtomicUsize::new(0),
            steered: feedback.is_some(),
            gauges,
        })
    }

    pub fn limits(&self) -> Capacity {
        self.limits
    }

    /// (in flight, queued) right now.
    pub fn counts(&self) -> (usize, usize) {
        let st = self.lock();
        (st.running, st.queued())
    }

    /// Requests in flight plus queued, as of the last change.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    /// The slots this replica may use now: `max_num_seqs`, or with load
    /// feedback the limit the backend's reports set.
    pub fn slot_limit(&self) -> usize {
        if !self.steered {
            return self.limits.max_num_seqs;
        }
        self.lock().slot_limit(self.limits, Instant::now())
    }

    /// The backend reported `waiting` requests in its queue (load feedback;
    /// ignored without it). A raised limit hands slots to waiters now.
    pub fn report(self: &Arc<Self>, waiting: usize) {
        let now = Instant::now();
        let granted = {
            let mut st = self.lock();
            let (inflight, queued) = (st.running, st.queued());
            let Some(f) = &mut st.feedback else {
                return;
            };
            f.on_report(waiting, inflight, queued, now);
            self.grant(&mut st, now)
        };
        self.send(granted);
    }

    /// Take a slot if one is free, else a queue place if one is free or
    /// `tenant` may take one (see `fair`), else refuse. Never waits.
    /// `demand`: what the request will cost this backend, as far as known.
    pub fn try_enter(
        self: &Arc<Self>,
        class: Class,
        tenant: &Share,
        demand: Demand,
    ) -> Result<Ticket, AdmitError> {
        let now = Instant::now();
        let mut st = self.lock();
        // With feedback the limit may have risen since the last release (a
        // report went stale): serve the line before joining it.
        let granted = if st.feedback.is_some() {
            self.grant(&mut st, now)
        } else {
            Vec::new()
        };
        let entered = self.enter(&mut st, class, tenant, demand, now);
        drop(st);
        self.send(granted);
        entered
    }

    fn enter(
        self: &Arc<Self>,
        st: &mut State,
        class: Class,
        tenant: &Share,
        demand: Demand,
        now: Instant,
    ) -> Result<Ticket, AdmitError> {
        let estimate = st.pricing.estimate(demand);
        let charge = Charge {
            tenant: tenant.clone(),
            estimate,
            grant: None,
        };
        if st.running < st.slot_limit(self.limits, now) && st.line.is_empty() {
            st.running += 1;
            self.publish(st);
            return Ok(Ticket::Ready(Permit::new(self, charge, now)));
        }
        let displaced = st
            .line
            .make_room(class, tenant, self.limits.max_queue_depth)?;
        // Its sender dropped, the displaced waiter is told `QueueFull`.
        drop(displaced);
        let (tx, rx) = oneshot::channel();
        let units = st.pricing.units(estimate);
        let id = st.line.push(class, tenant, units, Waiter { tx, charge });
        self.publish(st);
        Ok(Ticket::Queued(Place {
            admission: self.clone(),
            id,
            rx,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: every
        // critical section is a few plain field updates.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, st: &State) {
        self.load.store(st.running + st.queued(), Ordering::Relaxed);
        self.gauges.inflight.set(st.running as i64);
        self.gauges.queued.set(st.queued() as i64);
    }

    /// A slot was freed: settle its charge, then hand the slot to the next
    /// waiter, or give it back (also when a lowered limit has more running
    /// than it allows). Returns the service it counted.
    fn release(self: &Arc<Self>, charge: Charge, settled: Settled) -> f64 {
        let mut service = 0.0;
        let next = {
            let mut st = self.lock();
            let used = match settled {
                Settled::Reported(r, held) => {
                    let used = charge.estimate.corrected(r);
                    if let (Some(_), Some(_)) = (r.prefill, r.output) {
                        st.pricing.learn(used, held);
                    }
                    service = st.pricing.service(used);
                    st.pricing.units(used)
                }
                Settled::Estimated => st.pricing.units(charge.estimate),
                Settled::Refunded => 0,
            };
            if let Some(grant) = charge.grant {
                st.line.settle(&charge.tenant, grant, used);
            }
            let over = st.running > st.slot_limit(self.limits, Instant::now());
            let next = if over { None } else { st.line.pop() };
            if next.is_none() {
                st.running -= 1;
            }
            self.publish(&st);
            next
        };
        // Outside the lock: if the waiter is gone, the returned permit is
        // dropped here and releases again.
        self.send(next.into_iter().collect());
        service
    }

    /// Waiters given the slots a raised limit freed, counted as running.
    fn grant(&self, st: &mut State, now: Instant) -> Vec<(Waiter, Grant)> {
        let mut granted = Vec::new();
        while st.running < st.slot_limit(self.limits, now) {
            let Some(w) = st.line.pop() else {
                break;
            };
            st.running += 1;
            granted.push(w);
        }
        self.publish(st);
        granted
    }

    /// Outside the lock: send each granted waiter its permit.
    fn send(self: &Arc<Self>, granted: Vec<(Waiter, Grant)>) {
        for (w, grant) in granted {
            let charge = Charge {
                grant: Some(grant),
                ..w.charge
            };
            let _ = w.tx.send(Permit::new(self, charge, Instant::now()));
        }
    }

    /// Leave the queue; false if the place was already granted a slot (or
    /// taken).
    fn leave(&self, id: u64) -> bool {
        let mut st = self.lock();
        let left = st.line.remove(id);
        self.publish(&st);
        left
    }
}

/// A slot in flight, and its request's charge. Dropping it frees the slot,
/// its estimate standing; [`Permit::finish`] and [`Permit::refund`] settle
/// it otherwise.
pub struct Permit {
    admission: Arc<Admission>,
    /// Taken when the slot is freed.
    charge: Option<Charge>,
    granted: Instant,
}

impl Permit {
    fn new(admission: &Arc<Admission>, charge: Charge, granted: Instant) -> Self {
        Permit {
            admission: admission.clone(),
            charge: Some(charge),
            granted,
        }
    }

    /// The backend is done with the request, having reported `reported`:
    /// free the slot and settle the charge. Returns the service counted
    /// to its tenant (`tenants.fairness`'s unit).
    pub fn finish(mut self, reported: Reported) -> f64 {
        let held = self.granted.elapsed();
        self.settle(Settled::Reported(reported, held))
    }

    /// The backend served nothing of the request (its attempt failed and
    /// the request moves on): free the slot and charge nothing.
    pub fn refund(mut self) {
        self.settle(Settled::Refunded);
    }

    fn settle(&mut self, settled: Settled) -> f64 {
        match self.charge.take() {
            Some(c) => self.admission.release(c, settled),
            None => 0.0,
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.settle(Settled::Estimated);
    }
}

/// The outcome of [`Admission::try_enter`]: a slot now or a place in line.
pub enum Ticket {
    Ready(Permit),
    Queued(Place),
}

/// A place in the queue. Dropping it leaves the queue.
pub struct Place {
    admission: Arc<Admission>,
    id: u64,
    rx: oneshot::Receiver<Permit>,
}

impl Ticket {
    /// Wait for the slot, at most `timeout`.
    pub async fn wait(self, timeout: Duration) -> Result<Permit, AdmitError> {
        match self {
            Ticket::Ready(permit) => Ok(permit),
            Ticket::Queued(mut place) => {
                match tokio::time::timeout(timeout, &mut place.rx).await {
                    Ok(Ok(permit)) => Ok(permit),
                    // Dropped unsent: another request took the place.
                    Ok(Err(_)) => Err(AdmitError::QueueFull),
                    Err(_) => {
                        if place.admission.leave(place.id) {
                            Err(AdmitError::QueueTimeout)
                        } else {
                            // Granted just as time ran out: take it.
                            place.rx.try_recv().map_err(|_| AdmitError::QueueTimeout)
                        }
                    }
                }
            }
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // A permit already sent to a dropped receiver is dropped with the
        // channel and frees its slot; otherwise leave the line.
        self.admission.leave(self.id);
    }
}

#[cfg(test)]
mod tests;
