//! The failure exclusion window (CAG-3 AC4): a backend that failed is left
//! out of routing for a while. Lock-free: one atomic deadline per backend,
//! shared by the proxy (which excludes) and the health check (which may end
//! an exclusion early).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct Exclusions {
    /// Deadline per backend, in ms since `epoch`; 0 when not excluded.
    until: HashMap<SocketAddr, AtomicU64>,
    epoch: Instant,
    window: Duration,
}

impl Exclusions {
    pub fn new(addrs: &[SocketAddr], window: Duration) -> Self {
        Exclusions {
            until: addrs.iter().map(|a| (*a, AtomicU64::new(0))).collect(),
            epoch: Instant::now(),
            window,
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

    /// The backends this window covers.
    pub fn addrs(&self) -> impl Iterator<Item = &SocketAddr> {
        self.until.keys()
    }

    pub fn is_excluded(&self, addr: &SocketAddr, now: Instant) -> bool {
        self.remaining(addr, now).is_some()
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
}
