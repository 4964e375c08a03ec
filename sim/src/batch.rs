//! Continuous-batching admission: at most `max_num_seqs` requests run at
//! once and the rest wait in a FIFO queue, which (like vLLM) never rejects.
//!
//! The queue is a fair tokio `Semaphore`: waiters are served in the order
//! they started waiting, and dropping a waiting future removes it from the
//! queue. Both the "waiting" and the "running" states are held by guards
//! whose `Drop` undoes the bookkeeping, so a client that disconnects while
//! queued or mid-generation frees its place without any explicit cleanup.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Shared admission state.
#[derive(Debug)]
pub struct Scheduler {
    slots: Arc<Semaphore>,
    running: AtomicUsize,
    waiting: AtomicUsize,
    max_running_seen: AtomicUsize,
    /// Requests that found every slot taken and had to wait.
    queued_total: AtomicU64,
    /// Their time waiting, in microseconds.
    queued_us_total: AtomicU64,
}

/// Held while a request runs; releases its slot on drop.
#[derive(Debug)]
pub struct RunningGuard {
    sched: Arc<Scheduler>,
    _permit: OwnedSemaphorePermit,
}

/// Held while a request waits; leaves the queue count on drop.
struct WaitingGuard<'a>(&'a Scheduler);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.sched.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Scheduler {
    pub fn new(max_num_seqs: usize) -> Arc<Self> {
        Arc::new(Scheduler {
            slots: Arc::new(Semaphore::new(max_num_seqs)),
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            max_running_seen: AtomicUsize::new(0),
            queued_total: AtomicU64::new(0),
            queued_us_total: AtomicU64::new(0),
        })
    }

    /// Waits in FIFO order for a running slot. Cancel-safe: dropping the
    /// future before it resolves leaves the queue.
    pub async fn admit(self: &Arc<Self>) -> RunningGuard {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let permit = {
            let _waiting = WaitingGuard(self);
            match Arc::clone(&self.slots).try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    let started = std::time::Instant::now();
                    let permit = Arc::clone(&self.slots)
                        .acquire_owned()
                        .await
                        .expect("the scheduler never closes its semaphore");
                    let us = started.elapsed().as_micros() as u64;
                    self.queued_total.fetch_add(1, Ordering::Relaxed);
                    self.queued_us_total.fetch_add(us, Ordering::Relaxed);
                    permit
                }
            }
        };
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running_seen.fetch_max(now, Ordering::SeqCst);
        RunningGuard {
            sched: Arc::clone(self),
            _permit: permit,
        }
    }

    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    pub fn max_running_seen(&self) -> usize {
        self.max_running_seen.load(Ordering::SeqCst)
    }

    /// (requests that had to wait for a slot, their total wait in µs).
    pub fn queued(&self) -> (u64, u64) {
        (
            self.queued_total.load(Ordering::Relaxed),
            self.queued_us_total.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// Yields until `cond` holds (bounded, so a bug fails instead of hanging).
    async fn until(cond: impl Fn() -> bool) {
        for _ in 0..10_000 {
            if cond() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("condition never became true");
    }

    #[tokio::test]
    async fn never_more_than_max_and_fifo_order() {
        let sched = Scheduler::new(2);
        let order = Arc::new(Mutex::new(Vec::new()));
        let concurrent = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        // Nobody finishes before every request has queued.
        let (go, gate) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (s, o, c, p) = (
                sched.clone(),
                order.clone(),
                concurrent.clone(),
                peak.clone(),
            );
            let mut gate = gate.clone();
            tasks.push(tokio::spawn(async move {
                let _g = s.admit().await;
                o.lock().unwrap().push(i);
                let now = c.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                gate.wait_for(|open| *open).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                c.fetch_sub(1, Ordering::SeqCst);
            }));
            // Make the arrival order certain before the next task starts.
            let s = sched.clone();
            until(move || s.running() + s.waiting() == i + 1).await;
        }
        assert_eq!((sched.running(), sched.waiting()), (2, 6));
        go.send(true).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
        assert_eq!(peak.load(Ordering::SeqCst), 2);
        assert_eq!(sched.max_running_seen(), 2);
        assert_eq!(sched.queued().0, 6, "all but the first two waited");
        assert_eq!((sched.running(), sched.waiting()), (0, 0));
    }

    #[tokio::test]
    async fn dropping_a_queued_request_leaves_the_queue() {
        let sched = Scheduler::new(1);
        let first = sched.admit().await;
        let s = sched.clone();
        let queued = tokio::spawn(async move {
            let _g = s.admit().await;
        });
        let s = sched.clone();
        until(move || s.waiting() == 1).await;
        // Simulates a client disconnect while queued.
        queued.abort();
        let _ = queued.await;
        assert_eq!(sched.waiting(), 0);
        drop(first);
        assert_eq!(sched.running(), 0);
        // The slot is free again for the next request.
        let _again = sched.admit().await;
        assert_eq!(sched.running(), 1);
    }
}
