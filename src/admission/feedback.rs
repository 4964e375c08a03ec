//! `scheduler.load_feedback`: this replica's slot limit on one backend,
//! steered by the backend's own load reports (see `load_report`).
//!
//! The limit starts at the static share (`ceil(max_num_seqs / replicas)`)
//! and moves between 1 and the backend's whole `max_num_seqs`:
//!
//! - the backend reports requests waiting in its queue: together the
//!   clients send it more than it runs. This replica's part of the excess is
//!   taken as proportional to its own in-flight count (vLLM's queue is
//!   first-in first-out), so it cuts to what keeps its part of the running
//!   set: `inflight * max_num_seqs / (max_num_seqs + waiting)`, at least 1.
//!   A queue this replica alone caused (it cannot: it never sends more than
//!   `max_num_seqs`) would cut nothing; a queue of other clients cuts much.
//!   If every replica cuts alike, together they send `max_num_seqs`.
//! - the backend reports nothing waiting while this replica is using every
//!   slot it allows itself and has requests queued: one slot more, at most
//!   once per [`GROW_EVERY`] (additive increase), so a busy replica borrows
//!   what idle ones leave unused, without all replicas overshooting at once
//!   on the same burst of reports.
//! - no report for [`REPORT_TTL`]: the information is stale, back to the
//!   static share.
//!
//! Plain state, no clock of its own: the caller passes `now`.

use std::time::{Duration, Instant};

/// How long a report steers the limit.
pub const REPORT_TTL: Duration = Duration::from_secs(2);
/// The least time between a change of the limit and a rise.
pub const GROW_EVERY: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
pub struct Feedback {
    share: usize,
    ceiling: usize,
    limit: usize,
    last_report: Option<Instant>,
    last_change: Option<Instant>,
}

impl Feedback {
    /// `share`: the static per-replica slots; `ceiling`: the backend's whole
    /// `max_num_seqs`.
    pub fn new(share: usize, ceiling: usize) -> Self {
        let share = share.max(1);
        Feedback {
            share,
            ceiling: ceiling.max(share),
            limit: share,
            last_report: None,
            last_change: None,
        }
    }

    /// The slots this replica may use on the backend at `now`.
    pub fn limit(&self, now: Instant) -> usize {
        if self.fresh(now) {
            self.limit
        } else {
            self.share
        }
    }

    fn fresh(&self, now: Instant) -> bool {
        self.last_report
            .is_some_and(|t| now.saturating_duration_since(t) < REPORT_TTL)
    }

    /// A report of `waiting` requests queued at the backend, received while
    /// this replica has `inflight` requests there (the reporting one
    /// included) and `queued` more waiting for a slot here.
    pub fn on_report(&mut self, waiting: usize, inflight: usize, queued: usize, now: Instant) {
        if !self.fresh(now) {
            self.limit = self.share;
        }
        self.last_report = Some(now);
        let settled = self
            .last_change
            .is_none_or(|t| now.saturating_duration_since(t) >= GROW_EVERY);
        let limit = if waiting > 0 {
            let keep = inflight.saturating_mul(self.ceiling) / self.ceiling.saturating_add(waiting);
            self.limit.min(keep.max(1))
        } else if inflight >= self.limit && queued > 0 && settled {
            (self.limit + 1).min(self.ceiling)
        } else {
            self.limit
        };
        if limit != self.limit {
            self.limit = limit;
            self.last_change = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_millis(100);

    #[test]
    fn starts_at_the_share_and_returns_to_it_when_reports_stop() {
        let t = Instant::now();
        let mut f = Feedback::new(3, 8);
        assert_eq!(f.limit(t), 3);
        f.on_report(40, 3, 0, t);
        assert_eq!(f.limit(t), 1);
        assert_eq!(f.limit(t + REPORT_TTL - S), 1);
        assert_eq!(f.limit(t + REPORT_TTL), 3);
        // A report after the silence starts again from the share.
        f.on_report(0, 3, 5, t + REPORT_TTL * 2);
        assert_eq!(f.limit(t + REPORT_TTL * 2), 4);
    }

    #[test]
    fn other_clients_queue_cuts_below_the_share() {
        let t = Instant::now();
        // max_num_seqs 4, one replica, 4 in flight, 12 waiting there: this
        // replica's part of the running set is 4 * 4 / 16 = 1.
        let mut f = Feedback::new(4, 4);
        f.on_report(12, 4, 10, t);
        assert_eq!(f.limit(t), 1);
        // Never below one slot.
        f.on_report(1000, 1, 10, t);
        assert_eq!(f.limit(t), 1);
    }

    #[test]
    fn replicas_that_cut_alike_sum_to_the_backend() {
        let t = Instant::now();
        // 3 replicas each at 8 on a backend of 12: 24 sent, 12 waiting.
        let mut f = Feedback::new(4, 12);
        let mut now = t;
        for _ in 0..4 {
            f.on_report(0, f.limit(now), 1, now);
            now += GROW_EVERY;
        }
        assert_eq!(f.limit(now), 8);
        f.on_report(12, 8, 3, now);
        assert_eq!(f.limit(now), 4, "8 * 12 / 24");
        // Later reports of the same drain, all replicas over their limit:
        // 2 finished here (6 left), 6 more finished elsewhere (6 waiting).
        f.on_report(6, 6, 3, now + S);
        assert_eq!(f.limit(now + S), 4, "6 * 12 / 18: no compounding cut");
    }

    #[test]
    fn grows_one_at_a_time_only_when_busy_up_to_the_backend() {
        let t = Instant::now();
        let mut f = Feedback::new(2, 4);
        // Not using its slots, or nothing queued here: no growth.
        f.on_report(0, 1, 5, t);
        f.on_report(0, 2, 0, t);
        assert_eq!(f.limit(t), 2);
        f.on_report(0, 2, 1, t);
        assert_eq!(f.limit(t), 3);
        // Not again before GROW_EVERY.
        f.on_report(0, 3, 1, t + GROW_EVERY - S);
        assert_eq!(f.limit(t), 3);
        for (i, want) in [(1, 4), (2, 4)] {
            let now = t + GROW_EVERY * i;
            f.on_report(0, f.limit(now), 1, now);
            assert_eq!(f.limit(now), want);
        }
        // A cut also waits GROW_EVERY before the next rise.
        let now = t + GROW_EVERY * 3;
        f.on_report(4, 4, 1, now);
        assert_eq!(f.limit(now), 2, "4 * 4 / 8");
        f.on_report(0, 2, 1, now + S);
        assert_eq!(f.limit(now), 2);
        f.on_report(0, 2, 1, now + GROW_EVERY);
        assert_eq!(f.limit(now), 3);
    }

    #[test]
    fn one_waiting_request_cuts_a_proportional_part() {
        let t = Instant::now();
        // 4 in flight here on a backend of 4 with 1 waiting: 4 * 4 / 5 = 3.
        let mut f = Feedback::new(4, 4);
        f.on_report(1, 4, 0, t);
        assert_eq!(f.limit(t), 3);
    }
}
