//! Fault switches for tests: the current mode lives in a `watch` channel so
//! request handlers read it and the listener / connections react to changes.
//!
//! Modes: `none`, `hang` (accept, never answer), `error` (500), `slow`
//! (delays times `slow_factor`), `refuse` (listening socket closed). Since a
//! refused server cannot receive the HTTP call that would end the refusal, a
//! fault can carry a duration after which it reverts to `none` by itself;
//! the listener then binds the same address again.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;

use crate::config::FaultMode;

/// The active fault. `epoch` changes on every switch so a timed revert can
/// tell whether its fault is still the current one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultState {
    pub mode: FaultMode,
    pub slow_factor: f64,
    pub epoch: u64,
}

/// Body of `POST /sim/fault`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRequest {
    pub mode: FaultMode,
    pub slow_factor: Option<f64>,
    /// Revert to `none` after this many milliseconds.
    pub duration_ms: Option<u64>,
}

#[derive(Debug)]
pub struct Faults {
    tx: watch::Sender<FaultState>,
}

impl Faults {
    pub fn new(mode: FaultMode, slow_factor: f64) -> Arc<Self> {
        let (tx, _) = watch::channel(FaultState {
            mode,
            slow_factor,
            epoch: 0,
        });
        Arc::new(Faults { tx })
    }

    pub fn current(&self) -> FaultState {
        *self.tx.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<FaultState> {
        self.tx.subscribe()
    }

    /// Delay multiplier: the slow factor under `slow`, else 1.
    pub fn delay_factor(&self) -> f64 {
        let f = self.current();
        if f.mode == FaultMode::Slow {
            f.slow_factor
        } else {
            1.0
        }
    }

    /// Switches the fault; with a duration, schedules a revert to `none`
    /// unless another switch happens first. Must run inside a tokio runtime
    /// when `duration` is set.
    pub fn set(
        self: &Arc<Self>,
        mode: FaultMode,
        slow_factor: Option<f64>,
        duration: Option<Duration>,
    ) -> FaultState {
        self.tx.send_modify(|f| {
            f.mode = mode;
            if let Some(s) = slow_factor {
                f.slow_factor = s;
            }
            f.epoch += 1;
        });
        let now = self.current();
        log::info!(
            "fault set to {} (slow_factor {})",
            mode.as_str(),
            now.slow_factor
        );
        if let Some(d) = duration {
            let me = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                if me.current().epoch == now.epoch {
                    me.set(FaultMode::None, None, None);
                }
            });
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_factor_applies_only_in_slow_mode() {
        let f = Faults::new(FaultMode::None, 10.0);
        assert_eq!(f.delay_factor(), 1.0);
        f.set(FaultMode::Slow, Some(3.0), None);
        assert_eq!(f.delay_factor(), 3.0);
        f.set(FaultMode::Error, None, None);
        assert_eq!(f.delay_factor(), 1.0);
        assert_eq!(f.current().epoch, 2);
    }

    #[tokio::test]
    async fn timed_fault_reverts_unless_replaced() {
        let f = Faults::new(FaultMode::None, 10.0);
        let mut rx = f.subscribe();
        f.set(FaultMode::Refuse, None, Some(Duration::from_millis(5)));
        rx.wait_for(|s| s.mode == FaultMode::None).await.unwrap();

        // A newer switch cancels the pending revert of an older one.
        f.set(FaultMode::Hang, None, Some(Duration::from_millis(5)));
        f.set(FaultMode::Error, None, None);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(f.current().mode, FaultMode::Error);
    }

    #[test]
    fn request_body_parses() {
        let r: FaultRequest =
            serde_json::from_str(r#"{"mode":"slow","slow_factor":10.0}"#).unwrap();
        assert_eq!(r.mode, FaultMode::Slow);
        assert_eq!(r.slow_factor, Some(10.0));
        assert!(serde_json::from_str::<FaultRequest>(r#"{"mode":"bogus"}"#).is_err());
    }
}
