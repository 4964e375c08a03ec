//! Timing model: how long prefill and each decode step take.
//!
//! Prefill costs `prefill_us_per_token` per uncached prompt token, so cache
//! hits make the first token arrive sooner. Each decode step produces one
//! token for a request and costs `decode_us_per_token +
//! step_us_per_running_seq * running`, so a fuller batch decodes slower, as a
//! real GPU does. Loading a LoRA adapter takes `lora_load_us`, listing the
//! models `models_delay_us`. Everything is multiplied by `time_scale` (0 = no delays)
//! and by the `slow` fault's factor (1 when no slow fault is active).

use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct TimingModel {
    pub prefill_us_per_token: u64,
    pub decode_us_per_token: u64,
    pub step_us_per_running_seq: u64,
    pub lora_load_us: u64,
    pub models_delay_us: u64,
    pub time_scale: f64,
}

impl TimingModel {
    /// Prefill time for `uncached_tokens` tokens.
    pub fn prefill(&self, uncached_tokens: usize, slow: f64) -> Duration {
        self.scale(
            self.prefill_us_per_token as f64 * uncached_tokens as f64,
            slow,
        )
    }

    /// Time of one decode step while `running` requests share the batch.
    pub fn decode_step(&self, running: usize, slow: f64) -> Duration {
        let us =
            self.decode_us_per_token as f64 + self.step_us_per_running_seq as f64 * running as f64;
        self.scale(us, slow)
    }

    /// Time to load one LoRA adapter.
    pub fn lora_load(&self, slow: f64) -> Duration {
        self.scale(self.lora_load_us as f64, slow)
    }

    /// Time to answer `GET /v1/models`.
    pub fn models(&self, slow: f64) -> Duration {
        self.scale(self.models_delay_us as f64, slow)
    }

    fn scale(&self, us: f64, slow: f64) -> Duration {
        let us = us * self.time_scale * slow;
        if us.is_finite() && us > 0.0 {
            // Whole nanoseconds, rounded, so exact microsecond inputs stay exact.
            Duration::from_nanos((us * 1000.0).round() as u64)
        } else {
            Duration::ZERO
        }
    }
}

/// Sleeps for `d`; a zero delay returns at once without touching the timer.
pub async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(scale: f64) -> TimingModel {
        TimingModel {
            prefill_us_per_token: 20,
            decode_us_per_token: 2000,
            step_us_per_running_seq: 200,
            lora_load_us: 50_000,
            models_delay_us: 0,
            time_scale: scale,
        }
    }

    #[test]
    fn costs_follow_the_formula() {
        let m = model(1.0);
        assert_eq!(m.prefill(100, 1.0), Duration::from_micros(2000));
        assert_eq!(m.decode_step(3, 1.0), Duration::from_micros(2600));
        // The slow fault multiplies, time_scale multiplies too.
        assert_eq!(m.decode_step(0, 10.0), Duration::from_micros(20_000));
        assert_eq!(model(0.5).prefill(100, 1.0), Duration::from_micros(1000));
        assert_eq!(model(0.5).lora_load(2.0), Duration::from_millis(50));
    }

    #[test]
    fn zero_scale_means_no_delay() {
        let m = model(0.0);
        assert_eq!(m.prefill(1000, 10.0), Duration::ZERO);
        assert_eq!(m.decode_step(4, 10.0), Duration::ZERO);
        assert_eq!(m.lora_load(10.0), Duration::ZERO);
    }
}
