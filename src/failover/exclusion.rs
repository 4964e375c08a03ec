//! The failure exclusion window: a backend that failed is left
//! out of routing for a while. Lock-free: one atomic deadline per backend,
//! shared by the proxy (which excludes) and the health check (which may end
//! an exclusion early). A backend set that changes gets a new table
//! ([`Exclusions::carried_to`]) in which the backends that stay keep their
//! deadlines.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The exclusions of a model's current backend set, for those that outlive
/// one set (the health check, the metrics).
pub type CurrentExclusions = Arc<dyn Fn() -> Arc<Exclusions> + Send + Sync>;

pub struct Exclusions {
    /// Deadline per backend, in ms since `epoch`; 0 when not excluded.
    /// Shared with the tables of later sets the backend stays in.
    until: HashMap<SocketAddr, Arc<AtomicU64>>,
    epoch: Instant,
    window: Duration,
}

impl Exclusions {
    pub fn new(addrs: &[SocketAddr], window: Duration) -> Self {
        Exclusions {
            until: addrs.iter().map(|a| (*a, Arc::default())).collect(),
            epoch: Instant::now(),
            window,
        }
    }

    /// The table of a new set, `addrs`: a backend already here keeps its
    /// deadline (shared, so an exclusion made through this table still
    /// counts), a new one starts not excluded.
    pub fn carried_to(&self, addrs: &[SocketAddr]) -> Self {
        Exclusions {
            until: addrs
                .iter()
                .map(|a| (*a, self.until.get(a).cloned().unwrap_or_default()))
                .collect(),
            epoch: self.epoch,
            window: self.window,
        }
    }

    /// Leave `addr` out for the window from `now`. True when it was not
    /// excluded before (a new exclusion).
    pub fn exclude(&self, addr: SocketAddr, now: Instant) -> bool {
        let Some(until) = self.until.get(&addr) else {
            return false;
        };
        let was_excluded = self.is_excluded(&addr, now);
        until.fetch_max(self.millis(now + self.window), Ordering::Relaxed);
        !was_excluded
    }

    /// End `addr`'s exclusion now. True when it was excluded.
    pub fn clear(&self, addr: &SocketAddr, now: Instant) -> bool {
        let was_excluded = self.is_excluded(addr, now);
        if let Some(until) = self.until.get(addr) {
            until.store(0, Ordering::Relaxed);
        }
        was_excluded
    }

    /// Whether `addr` is one of the backends this table covers.
    pub fn covers(&self, addr: &SocketAddr) -> bool {
        self.until.contains_key(addr)
    }

    /// The backends this window covers.
    pub fn addrs(&self) -> impl Iterator<Item = &SocketAddr> {
        self.until.keys()
    }

    pub fn is_excluded(&self, addr: &SocketAddr, now: Instant) -> bool {
        self.remaining(addr, now).is_some()
    }

    /// `addr`'s deadline, for [`Exclusions::excludes`] to read without
    /// looking the backend up.
    pub fn deadline(&self, addr: &SocketAddr) -> Option<Arc<AtomicU64>> {
        self.until.get(addr).cloned()
    }

    /// `now` as the deadlines count time, read once for many
    /// [`Exclusions::excludes`].
    pub fn clock(&self, now: Instant) -> u64 {
        self.millis(now)
    }

    /// Whether the backend of `deadline` (from [`Exclusions::deadline`]) is
    /// excluded at `clock` (from [`Exclusions::clock`]).
    pub fn excludes(deadline: &AtomicU64, clock: u64) -> bool {
        deadline.load(Ordering::Relaxed) > clock
    }

    /// Time left in `addr`'s exclusion, if it is excluded.
    pub fn remaining(&self, addr: &SocketAddr, now: Instant) -> Option<Duration> {
        let until = self.until.get(addr)?.load(Ordering::Relaxed);
        let now = self.millis(now);
        (until > now).then(|| Duration::from_millis(until - now))
    }

    /// The time until the earliest excluded backend returns (zero if none is).
    pub fn retry_after(&self, now: Instant) -> Duration {
        self.until
            .keys()
            .filter_map(|a| self.remaining(a, now))
            .min()
            .unwrap_or_default()
    }

    fn millis(&self, t: Instant) -> u64 {
        // +1 keeps 0 free to mean "not excluded".
        t.saturating_duration_since(self.epoch).as_millis() as u64 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_then_return_and_early_clear() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let ex = Exclusions::new(&[a, b], Duration::from_secs(30));
        let now = Instant::now();
        assert!(ex.exclude(a, now));
        assert!(
            !ex.exclude(a, now + Duration::from_secs(1)),
            "already excluded"
        );
        assert!(
            ex.is_excluded(&a, now + Duration::from_secs(30)),
            "extended by the second failure"
        );
        assert!(!ex.is_excluded(&a, now + Duration::from_secs(32)));
        assert_eq!(ex.retry_after(now), Duration::from_secs(31));
        assert!(ex.clear(&a, now));
        assert!(!ex.is_excluded(&a, now));
        assert!(!ex.clear(&b, now));
        let unknown: SocketAddr = "127.0.0.1:3".parse().unwrap();
        assert!(!ex.exclude(unknown, now));
    }

    #[test]
    fn a_new_set_keeps_the_deadlines_of_those_that_stay() {
        let [a, b, c]: [SocketAddr; 3] =
            ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"].map(|s| s.parse().unwrap());
        let old = Exclusions::new(&[a, b], Duration::from_secs(30));
        let now = Instant::now();
        old.exclude(a, now);
        old.exclude(b, now);
        let new = old.carried_to(&[a, c]);
        assert!(new.is_excluded(&a, now), "stayed: still excluded");
        assert!(!new.is_excluded(&c, now), "new: fresh");
        assert!(!new.is_excluded(&b, now), "gone: not in the new table");
        assert!(new.covers(&c) && !new.covers(&b));
        assert_eq!(new.addrs().count(), 2);
        // A request routed in the old set still excludes for the new one.
        new.clear(&a, now);
        old.exclude(a, now);
        assert!(new.is_excluded(&a, now));
    }
}
