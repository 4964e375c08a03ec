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
//!   Borrowers first: a queue no longer than the fleet's own slack (the
//!   shares' rounding plus one borrowed slot from each other replica) is
//!   one the replicas' borrowing can have caused, so a replica gives back
//!   only what it borrowed (down to its share, not below); a replica within
//!   its share keeps it. Cutting them all alike there let a replica that
//!   had just borrowed keep more than the others it pushed below their
//!   share, and an even spread drifted apart.
//! - the backend reports nothing waiting while this replica is using every
//!   slot it allows itself and has requests queued: one slot more, at most
//!   once per [`GROW_EVERY`] (additive increase), so a busy replica borrows
//!   what idle ones leave unused, without all replicas overshooting at once
//!   on the same burst of reports. Nothing waiting does not mean a free
//!   slot, so a rise is a probe: one that had to be given back doubles the
//!   wait before the next (up to [`MAX_GROW_WAIT`]), one whose borrowed
//!   slots are used with nothing waiting resets it, so a fleet whose
//!   clients already fill it probes less often. (A report comes with a
//!   response, often from a request that just left the backend's queue, so
//!   "nothing waiting" is over-reported and the reset comes often.)
//! - no report for [`REPORT_TTL`]: the information is stale, back to the
//!   static share.
//!
//! Plain state, no clock of its own: the caller passes `now`.

use std::time::{Duration, Instant};

/// How long a report steers the limit.
pub const REPORT_TTL: Duration = Duration::from_secs(2);
/// The least time between a change of the limit and a rise.
pub const GROW_EVERY: Duration = Duration::from_millis(200);
/// The most that failed probes stretch it to.
pub const MAX_GROW_WAIT: Duration = Duration::from_millis(1600);

/// The backend as the replicas share it: its whole `max_num_seqs` (the
/// most its reports may lend one replica) and the replicas admitting to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fleet {
    pub ceiling: usize,
    pub replicas: usize,
}

#[derive(Debug, Clone)]
pub struct Feedback {
    share: usize,
    ceiling: usize,
    /// The longest backend queue the replicas' own shares and borrowing
    /// explain (see the module comment).
    slack: usize,
    limit: usize,
    /// The time between a change of the limit and a rise: [`GROW_EVERY`],
    /// stretched by probes that had to be given back.
    grow_wait: Duration,
    last_report: Option<Instant>,
    last_change: Option<Instant>,
}

impl Feedback {
    /// `share`: the static per-replica slots.
    pub fn new(share: usize, fleet: Fleet) -> Self {
        let share = share.max(1);
        let replicas = fleet.replicas.max(1);
        let rounding = (share * replicas).saturating_sub(fleet.ceiling);
        Feedback {
            share,
            ceiling: fleet.ceiling.max(share),
            slack: rounding + replicas - 1,
            limit: share,
            grow_wait: GROW_EVERY,
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
            .is_none_or(|t| now.saturating_duration_since(t) >= self.grow_wait);
        let limit = if waiting > 0 {
            let keep = inflight.saturating_mul(self.ceiling) / self.ceiling.saturating_add(waiting);
            let floor = if waiting > self.slack {
                1
            } else {
                self.share.min(self.limit)
            };
            let limit = self.limit.min(keep.max(floor));
            if limit < self.limit && self.limit > self.share {
                self.grow_wait = (self.grow_wait * 2).min(MAX_GROW_WAIT);
            }
            limit
        } else {
            if inflight > self.share {
                self.grow_wait = GROW_EVERY;
            }
            if inflight >= self.limit && queued > 0 && settled {
                (self.limit + 1).min(self.ceiling)
            } else {
                self.limit
            }
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

    fn fleet(ceiling: usize, replicas: usize) -> Fleet {
        Fleet { ceiling, replicas }
    }

    #[test]
    fn starts_at_the_share_and_returns_to_it_when_reports_stop() {
        let t = Instant::now();
        let mut f = Feedback::new(3, fleet(8, 3));
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
        let mut f = Feedback::new(4, fleet(4, 1));
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
        let mut f = Feedback::new(4, fleet(12, 3));
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
        let mut f = Feedback::new(2, fleet(4, 2));
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
        // A cut also waits before the next rise (twice GROW_EVERY: the
        // borrowed slots had to be given back).
        let now = t + GROW_EVERY * 3;
        f.on_report(4, 4, 1, now);
        assert_eq!(f.limit(now), 2, "4 * 4 / 8");
        f.on_report(0, 2, 1, now + GROW_EVERY);
        assert_eq!(f.limit(now), 2);
        f.on_report(0, 2, 1, now + GROW_EVERY * 2);
        assert_eq!(f.limit(now), 3);
    }

    #[test]
    fn a_probe_given_back_doubles_the_wait_for_the_next_and_a_used_one_resets_it() {
        let t = Instant::now();
        // 3 replicas on 6 slots that the clients already fill: every rise
        // queues a request at the backend and is given back.
        let mut f = Feedback::new(2, fleet(6, 3));
        let mut now = t;
        for wait in [200, 400, 800, 1600, 1600] {
            f.on_report(0, 2, 1, now);
            assert_eq!(f.limit(now), 3, "a rise {wait} ms after the last change");
            now += S;
            f.on_report(1, 3, 1, now);
            assert_eq!(f.limit(now), 2, "given back");
            let next = Duration::from_millis(wait * 2).min(MAX_GROW_WAIT);
            f.on_report(0, 2, 1, now + next - S);
            assert_eq!(f.limit(now), 2, "not before {next:?}");
            now += next;
        }
        // A rise whose slot is used with nothing waiting: back to GROW_EVERY.
        f.on_report(0, 2, 1, now);
        f.on_report(0, 3, 1, now + S);
        assert_eq!(f.limit(now), 3);
        f.on_report(0, 3, 1, now + GROW_EVERY);
        assert_eq!(f.limit(now), 4);
    }

    #[test]
    fn one_waiting_request_cuts_a_proportional_part() {
        let t = Instant::now();
        // 4 in flight here on a backend of 4 with 1 waiting: 4 * 4 / 5 = 3
        // (one replica alone: any queue is other clients').
        let mut f = Feedback::new(4, fleet(4, 1));
        f.on_report(1, 4, 0, t);
        assert_eq!(f.limit(t), 3);
    }

    #[test]
    fn a_queue_the_replicas_borrowing_explains_is_given_back_by_the_borrower_alone() {
        let t = Instant::now();
        // 3 replicas on a backend of 6: shares 2 + 2 + 2, no rounding, so
        // the replicas' own borrowing explains a queue of up to 2.
        let mut borrower = Feedback::new(2, fleet(6, 3));
        borrower.on_report(0, 2, 4, t);
        assert_eq!(borrower.limit(t), 3);
        let mut other = Feedback::new(2, fleet(6, 3));
        // 7 sent to 6 slots, 1 waiting: the borrower gives its slot back,
        // the replica within its share keeps it (cut alike, both would be
        // at 3 * 6 / 7 = 2 and 2 * 6 / 7 = 1).
        borrower.on_report(1, 3, 4, t + S);
        other.on_report(1, 2, 4, t + S);
        assert_eq!(borrower.limit(t + S), 2);
        assert_eq!(other.limit(t + S), 2);
        // Two borrowed at once: still the replicas' own, still kept.
        other.on_report(2, 2, 4, t + S * 2);
        assert_eq!(other.limit(t + S * 2), 2);
        // A longer queue is other clients': every replica takes its part.
        other.on_report(3, 2, 4, t + S * 3);
        assert_eq!(other.limit(t + S * 3), 1, "2 * 6 / 9");
    }

    #[test]
    fn a_borrower_gives_back_its_proportional_part_but_not_below_its_share() {
        let t = Instant::now();
        let mut f = Feedback::new(2, fleet(6, 3));
        for i in 0..3 {
            let now = t + GROW_EVERY * i;
            f.on_report(0, f.limit(now), 9, now);
        }
        let now = t + GROW_EVERY * 2;
        assert_eq!(f.limit(now), 5);
        // 5 in flight, 2 waiting: 5 * 6 / 8 = 3.
        f.on_report(2, 5, 9, now);
        assert_eq!(f.limit(now), 3);
        // 3 in flight, 1 waiting: 3 * 6 / 7 = 2, the share.
        f.on_report(1, 3, 9, now + S);
        assert_eq!(f.limit(now + S), 2);
        // Still 1 waiting (the borrowed requests drain): not below it.
        f.on_report(1, 2, 9, now + S * 2);
        assert_eq!(f.limit(now + S * 2), 2);
    }

    #[test]
    fn the_slack_counts_the_shares_rounding_and_one_borrowed_slot_per_other_replica() {
        let t = Instant::now();
        // 3 replicas on 8 slots: shares of 3 sum to 9 (1 over), plus 2
        // borrowed: a queue of 3 is theirs, of 4 is not.
        let mut f = Feedback::new(3, fleet(8, 3));
        f.on_report(3, 3, 0, t);
        assert_eq!(f.limit(t), 3);
        f.on_report(4, 3, 0, t);
        assert_eq!(f.limit(t), 2, "3 * 8 / 12");
    }
}
