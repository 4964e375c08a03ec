//! A token bucket refilled continuously at `per_minute` a minute, holding at
//! most `per_minute`, whose level may go below zero (a debt).
//!
//! The level is kept in integer units of 1/60,000,000,000 of a token (a
//! minute in nanoseconds): a refill of `per_minute` tokens a minute is then
//! exactly `per_minute` units a nanosecond, and every wait is a whole number
//! of nanoseconds after which the bucket does hold what was asked, with no
//! floating-point rounding to make a retry at the stated time fail.

use std::time::{Duration, Instant};

const UNITS_PER_TOKEN: i128 = 60_000_000_000;

fn units(tokens: u64) -> i128 {
    i128::from(tokens) * UNITS_PER_TOKEN
}

#[derive(Debug)]
pub(super) struct Bucket {
    /// The refill in units a nanosecond: `per_minute`.
    rate: i128,
    /// A full bucket: `per_minute` tokens.
    capacity: i128,
    level: i128,
    /// When `level` was last brought up to date; None until first used, the
    /// bucket full (a tenant starts with its whole burst).
    at: Option<Instant>,
}

impl Bucket {
    pub(super) fn full(per_minute: u64) -> Self {
        Bucket {
            rate: i128::from(per_minute),
            capacity: units(per_minute),
            level: units(per_minute),
            at: None,
        }
    }

    /// Bring the level up to `now`; returns the time it is now correct at.
    fn refill(&mut self, now: Instant) -> Instant {
        let Some(at) = self.at else {
            self.at = Some(now);
            return now;
        };
        // Callers read the clock before taking the lock, so `now` may be a
        // little older than `at`: that adds nothing and never moves `at` back.
        if now <= at {
            return at;
        }
        let elapsed = i128::try_from(now.duration_since(at).as_nanos()).unwrap_or(i128::MAX);
        let added = self.rate.saturating_mul(elapsed);
        self.level = self.level.saturating_add(added).min(self.capacity);
        self.at = Some(now);
        now
    }

    /// How long after `now` the bucket holds `tokens`; None if it does now.
    pub(super) fn wait(&mut self, tokens: u64, now: Instant) -> Option<Duration> {
        let at = self.refill(now);
        let short = units(tokens).saturating_sub(self.level);
        if short <= 0 {
            return None;
        }
        // Rounded up, so the bucket holds `tokens` at `now + wait`. A limit
        // of 0 never refills: the wait is u64::MAX ns, some 584 years.
        let nanos = short.saturating_add(self.rate - 1).checked_div(self.rate);
        let nanos = nanos
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(u64::MAX);
        Some(Duration::from_nanos(nanos).saturating_add(at.saturating_duration_since(now)))
    }

    /// Take `tokens`, into debt if there are fewer.
    pub(super) fn take(&mut self, tokens: u64, now: Instant) {
        // Refill first: the refill up to now is capped at a full bucket, so
        // taking before it would credit time during which the bucket was full.
        self.refill(now);
        self.level = self.level.saturating_sub(units(tokens));
    }
}
