//! The rules of a configuration field, shared by `config` and the module
//! that checks a section of its own (`auth::jwt::config`): a number's
//! accepted range ([`Bound`]) and the error that names the field, the value
//! and the rule it broke ([`Invalid`]).

use std::fmt::{Debug, Display};

/// A field's value broke a rule, e.g.
/// `gateway.models[1].addresses[0] = "x": not host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path} = {value}: {rule}")]
pub struct Invalid {
    pub path: String,
    /// As `Debug` prints it: strings quoted, secrets never.
    pub value: String,
    pub rule: String,
}

/// The error for `value` at `path`.
pub fn invalid(path: impl Into<String>, value: impl Debug, rule: &str) -> Invalid {
    Invalid {
        path: path.into(),
        value: format!("{value:?}"),
        rule: rule.into(),
    }
}

/// The accepted range of a numeric field, stated once per field. Upper
/// bounds catch unit mistakes (ms written as s, bytes as MiB).
#[derive(Debug, Clone, Copy)]
pub struct Bound<T> {
    /// The keys it bounds, list elements as `[]`
    /// (`gateway.models[].max_num_seqs`): the config key test checks the
    /// ranges the docs state against these.
    pub keys: &'static [&'static str],
    lo: T,
    hi: T,
    /// `lo` itself is refused.
    above: bool,
}

impl<T: Copy + PartialOrd + Display + Debug> Bound<T> {
    /// `lo..=hi`.
    pub const fn new(keys: &'static [&'static str], lo: T, hi: T) -> Self {
        Bound {
            keys,
            lo,
            hi,
            above: false,
        }
    }

    /// Above `lo`, at most `hi`.
    pub const fn above(keys: &'static [&'static str], lo: T, hi: T) -> Self {
        Bound {
            keys,
            lo,
            hi,
            above: true,
        }
    }

    /// `value` if in range, else an error naming `path`. NaN is never in
    /// range.
    pub fn check(self, path: &str, value: T) -> Result<T, Invalid> {
        let (lo, hi) = (self.lo, self.hi);
        let low_ok = if self.above { value > lo } else { value >= lo };
        if low_ok && value <= hi {
            Ok(value)
        } else if self.above {
            let rule = format!("must be above {lo:?} and at most {hi:?}");
            Err(invalid(path, value, &rule))
        } else {
            Err(invalid(
                path,
                value,
                &format!("must be between {lo} and {hi}"),
            ))
        }
    }
}

/// The range as the docs state it: `1..3600` (both ends included), or
/// `above 1, at most 10`.
impl<T: Display> Display for Bound<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (lo, hi) = (&self.lo, &self.hi);
        if self.above {
            write!(f, "above {lo}, at most {hi}")
        } else {
            write!(f, "{lo}..{hi}")
        }
    }
}
