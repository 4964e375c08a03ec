//! One publisher's sequence: which messages to apply, and when what the
//! gateway knows of a backend's cache can no longer be trusted.
//!
//! ```text
//! on (re)connecting: ask the replay socket from 0 (what the backend
//!     published before the gateway listened); what it answered is applied,
//!     and live messages it already answered are skipped
//! first message, nothing replayed: ask from 0 again, then apply it
//! seq == next:     apply
//! seq >  next:     a gap: replay [next, seq) first; if the replay does not
//!                  begin at next, the gap is lost: forget the backend, then apply
//! seq <  next:     the publisher restarted (its numbers start again at 0):
//!                  forget the backend, then apply
//! ```

/// What to do with a message of sequence number `seq`.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Apply it.
    Apply,
    /// Replay from `from` (up to this message), then apply it.
    Replay { from: u64 },
    /// Forget what the backend holds, then apply it.
    Restart,
    /// Applied already, from the replay.
    Skip,
}

/// A publisher's next expected sequence number.
#[derive(Debug, Default)]
pub struct Feed {
    next: Option<u64>,
    /// Live messages up to `next` may repeat what a replay answered.
    replayed: bool,
}

impl Feed {
    /// The step for a live message `seq`.
    pub fn step(&mut self, seq: u64) -> Step {
        let step = match self.next {
            Some(next) if self.replayed && seq < next => return Step::Skip,
            None => Step::Replay { from: 0 },
            Some(next) if seq == next => Step::Apply,
            Some(next) if seq > next => Step::Replay { from: next },
            Some(_) => Step::Restart,
        };
        self.next = Some(seq.wrapping_add(1));
        self.replayed = false;
        step
    }

    /// A replay answered every message up to `last`.
    pub fn replayed(&mut self, last: u64) {
        self.next = Some(last.wrapping_add(1));
        self.replayed = true;
    }

    /// Whether a message or a replay has set where the sequence is.
    pub fn started(&self) -> bool {
        self.next.is_some()
    }

    /// The connection was lost: whatever comes next is asked for again.
    pub fn reconnected(&mut self) {
        *self = Feed::default();
    }
}

/// Whether a replay that answered `first` (the first sequence number it
/// sent; `None` if it sent nothing) covers a gap from `from`: then nothing
/// was lost.
pub fn replay_covers(from: u64, first: Option<u64>, until: u64) -> bool {
    match first {
        Some(first) => first <= from,
        // Nothing buffered before `until`: only a gap of none is covered.
        None => from >= until,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_applies_and_gaps_or_restarts_are_seen() {
        let mut f = Feed::default();
        assert_eq!(f.step(7), Step::Replay { from: 0 });
        assert_eq!(f.step(8), Step::Apply);
        assert_eq!(f.step(11), Step::Replay { from: 9 });
        assert_eq!(f.step(12), Step::Apply);
        assert_eq!(f.step(0), Step::Restart);
        assert_eq!(f.step(1), Step::Apply);
        f.reconnected();
        assert_eq!(f.step(5), Step::Replay { from: 0 });
    }

    #[test]
    fn live_messages_a_replay_answered_are_skipped() {
        let mut f = Feed::default();
        f.replayed(9);
        assert_eq!(f.step(8), Step::Skip);
        assert_eq!(f.step(9), Step::Skip);
        assert_eq!(f.step(10), Step::Apply);
        // Past the replay, a lower number is a restart again.
        assert_eq!(f.step(0), Step::Restart);
    }

    #[test]
    fn a_replay_covers_a_gap_only_from_its_start() {
        assert!(replay_covers(9, Some(9), 11));
        assert!(replay_covers(9, Some(3), 11));
        assert!(!replay_covers(9, Some(10), 11));
        assert!(!replay_covers(9, None, 11));
        assert!(replay_covers(0, None, 0));
    }
}
