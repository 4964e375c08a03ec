//! What a request costs, the unit fair admission shares a backend in
//! (`tenants.fairness`): one request, or the GPU work it needs, in weighted
//! tokens.
//!
//! ```text
//! work(r)     = prefill tokens (the prompt less what the backend holds cached) + output tokens
//! service(r)  = prefill tokens + output tokens * ratio          (tokens)
//!             = 1                                                (requests)
//! estimate(r) = prompt tokens - expected cached, and min(max_tokens, mean output)
//! ratio       = seconds of a slot per output token / per prefill token, learnt:
//!               held ~ a * prefill + b * output, least squares over recent
//!               responses, ratio = b / a; or `tenants.output_token_cost`
//! ```
//!
//! A slot is what admission shares, so a token weighs the slot time it
//! costs: a prefill token a share of the prefill, an output token a decode
//! step. Each response tells the gateway its slot time and its uncached
//! prompt and completion tokens, a sample of that line. The fit has no
//! intercept: a request's fixed cost (connection, scheduling) lands on its
//! output tokens, a few percent. It is taken only when the samples tell
//! prefill from decode (prompts of different lengths for their outputs):
//! with every request alike the two are one direction and the ratio stays
//! as it was. Until then, [`DEFAULT_OUTPUT_COST`].

use std::time::Duration;

/// How tenants' shares are counted (`tenants.fairness`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fairness {
    /// One request, one unit, however long.
    Requests,
    /// Weighted tokens; `output_cost`: an output token's weight in prefill
    /// tokens, set (`tenants.output_token_cost`) or learnt (None).
    Tokens { output_cost: Option<u32> },
}

/// What admission knows of a request before it runs, on one backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    /// Prompt tokens the backend will prefill: the prompt less what it is
    /// expected to hold.
    pub prefill: u64,
    /// The request's `max_tokens` (or its API's name for it).
    pub max_output: Option<u64>,
}

impl Demand {
    /// On a backend expected to hold `cached` of its prompt tokens.
    pub fn holding(self, cached: u64) -> Demand {
        Demand {
            prefill: self.prefill.saturating_sub(cached),
            ..self
        }
    }
}

/// Tokens the GPU works on for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    pub prefill: u64,
    pub output: u64,
}

/// What the response reported when it ended: unknown parts (a response
/// cut short, a backend that reports no cached tokens) keep the estimate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reported {
    pub prefill: Option<u64>,
    pub output: Option<u64>,
}

impl Work {
    /// The estimate, corrected by what was reported.
    pub fn corrected(self, r: Reported) -> Work {
        Work {
            prefill: r.prefill.unwrap_or(self.prefill),
            output: r.output.unwrap_or(self.output),
        }
    }
}

/// An output token's weight, in prefill tokens, until learnt: a decode
/// step of 2 to 20 ms against a prefill of 20 to 100 µs a token, on one
/// sequence, is 100 within a factor of a few either way.
pub const DEFAULT_OUTPUT_COST: f64 = 100.0;

/// Output tokens a request is expected to produce, until learnt.
pub const DEFAULT_OUTPUT_TOKENS: f64 = 256.0;

/// The range of a learnt ratio: outside it a fit is noise.
const RATIO: (f64, f64) = (1.0, 10_000.0);

/// The weight of a new response in the moving mean of outputs and in the
/// fit (about its last 50 responses).
const ALPHA: f64 = 0.02;

/// How far from one direction the samples must be to tell prefill from
/// decode: `det / (Σp² Σo²)`, 0 when every sample has the same shape.
const MIN_SPREAD: f64 = 0.01;

/// Virtual time of one request (requests) or of one weighted token
/// (tokens), at weight 1: a cost divided by a weight of up to 1000 is
/// still exact to 0.1%.
const REQUEST_UNITS: f64 = (1u64 << 24) as f64;
const TOKEN_UNITS: f64 = (1u64 << 12) as f64;

/// One backend's prices: how it counts, and what it has learnt of the
/// model it serves.
#[derive(Debug, Clone)]
pub struct Pricing {
    fairness: Fairness,
    /// An output token's weight, in prefill tokens.
    ratio: f64,
    mean_output: f64,
    /// Decayed sums of the fit: p², p·o, o², p·t, o·t (t in seconds).
    sums: [f64; 5],
}

impl Pricing {
    pub fn new(fairness: Fairness) -> Self {
        let ratio = match fairness {
            Fairness::Tokens {
                output_cost: Some(c),
            } => f64::from(c),
            _ => DEFAULT_OUTPUT_COST,
        };
        Pricing {
            fairness,
            ratio,
            mean_output: DEFAULT_OUTPUT_TOKENS,
            sums: [0.0; 5],
        }
    }

    /// The work a request is expected to take.
    pub fn estimate(&self, d: Demand) -> Work {
        let mean = self.mean_output.round() as u64;
        Work {
            prefill: d.prefill,
            output: d.max_output.map_or(mean, |m| m.min(mean)),
        }
    }

    /// `w` in the unit service is counted in: requests or weighted tokens.
    pub fn service(&self, w: Work) -> f64 {
        match self.fairness {
            Fairness::Requests => 1.0,
            Fairness::Tokens { .. } => w.prefill as f64 + w.output as f64 * self.ratio,
        }
    }

    /// `w` in the line's virtual time, at weight 1; at least one token, so
    /// that no request is free.
    pub fn units(&self, w: Work) -> u64 {
        match self.fairness {
            Fairness::Requests => REQUEST_UNITS as u64,
            Fairness::Tokens { .. } => (self.service(w).max(1.0) * TOKEN_UNITS) as u64,
        }
    }

    /// A response ended having done `w` (as reported, whole) in `held` of
    /// slot time.
    pub fn learn(&mut self, w: Work, held: Duration) {
        let Fairness::Tokens { output_cost } = self.fairness else {
            return;
        };
        self.mean_output += ALPHA * (w.output as f64 - self.mean_output);
        if output_cost.is_some() {
            return;
        }
        let (p, o, t) = (w.prefill as f64, w.output as f64, held.as_secs_f64());
        for (sum, sample) in self
            .sums
            .iter_mut()
            .zip([p * p, p * o, o * o, p * t, o * t])
        {
            *sum += ALPHA * (sample - *sum);
        }
        let [pp, po, oo, pt, ot] = self.sums;
        let det = pp * oo - po * po;
        if det <= MIN_SPREAD * pp * oo {
            return;
        }
        let prefill = (oo * pt - po * ot) / det;
        let output = (pp * ot - po * pt) / det;
        let ratio = output / prefill;
        if prefill > 0.0 && output > 0.0 && (RATIO.0..=RATIO.1).contains(&ratio) {
            self.ratio = ratio;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEARNT: Fairness = Fairness::Tokens { output_cost: None };

    /// A backend of `prefill_us` a prompt token and `decode_ms` an output
    /// token, plus `fixed_ms` a request.
    fn held(w: Work, prefill_us: f64, decode_ms: f64, fixed_ms: f64) -> Duration {
        let ms = w.prefill as f64 * prefill_us / 1000.0 + w.output as f64 * decode_ms + fixed_ms;
        Duration::from_secs_f64(ms / 1000.0)
    }

    #[test]
    fn the_ratio_is_learnt_from_slot_times_of_requests_of_different_shapes() {
        let mut p = Pricing::new(LEARNT);
        let long = Work {
            prefill: 8000,
            output: 16,
        };
        let short = Work {
            prefill: 500,
            output: 16,
        };
        // One shape alone says nothing of prefill against decode.
        for _ in 0..100 {
            p.learn(long, held(long, 30.0, 2.0, 0.0));
        }
        assert_eq!(p.ratio, DEFAULT_OUTPUT_COST);
        for _ in 0..100 {
            p.learn(short, held(short, 30.0, 2.0, 0.0));
            p.learn(long, held(long, 30.0, 2.0, 0.0));
        }
        // 2 ms against 30 µs.
        assert!((p.ratio - 66.67).abs() < 0.1, "{}", p.ratio);
        // A fixed 1 ms a request lands on the 16 output tokens: 2.06 ms.
        for _ in 0..400 {
            p.learn(short, held(short, 30.0, 2.0, 1.0));
            p.learn(long, held(long, 30.0, 2.0, 1.0));
        }
        assert!((p.ratio - 68.75).abs() < 0.1, "{}", p.ratio);
        assert_eq!(p.estimate(Demand::default()).output, 16);
    }

    #[test]
    fn a_set_ratio_stays_and_requests_cost_one_unit_whatever_their_work() {
        let mut set = Pricing::new(Fairness::Tokens {
            output_cost: Some(5),
        });
        let w = Work {
            prefill: 100,
            output: 10,
        };
        set.learn(w, Duration::from_secs(9));
        set.learn(Work { prefill: 9, ..w }, Duration::from_secs(1));
        assert_eq!(set.ratio, 5.0);
        assert_eq!(set.service(w), 150.0);
        assert_eq!(set.units(w), 150 << 12);
        // No request is free.
        assert_eq!(set.units(Work::default()), 1 << 12);
        let requests = Pricing::new(Fairness::Requests);
        assert_eq!(requests.service(w), 1.0);
        assert_eq!(requests.units(w), requests.units(Work::default()));
    }

    #[test]
    fn the_output_is_max_tokens_or_the_mean_whichever_is_less_and_reports_correct_it() {
        let mut p = Pricing::new(LEARNT);
        let demand = |max_output| Demand {
            prefill: 700,
            max_output,
        };
        assert_eq!(p.estimate(demand(None)).output, 256);
        assert_eq!(p.estimate(demand(Some(1))).output, 1);
        for _ in 0..500 {
            p.learn(
                Work {
                    prefill: 10,
                    output: 40,
                },
                Duration::from_millis(80),
            );
        }
        let estimate = p.estimate(demand(Some(4096)));
        assert_eq!(
            estimate,
            Work {
                prefill: 700,
                output: 40
            }
        );
        let cut = Reported {
            prefill: None,
            output: Some(3),
        };
        assert_eq!(
            estimate.corrected(cut),
            Work {
                prefill: 700,
                output: 3
            }
        );
    }
}
