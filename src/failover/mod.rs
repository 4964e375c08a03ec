//! What a backend's failure does. Here, what to do when an attempt at a
//! backend fails: plain policy, decided from what the proxy knows about the
//! failure, unit-tested case by case. Beside it: the window a failed backend
//! is left out for (`exclusion.rs`) and the health checks that may end it
//! early (`health.rs`).

pub mod exclusion;
pub mod health;

use pingora::ErrorType;

/// What the proxy knows about a failed attempt.
#[derive(Debug, Clone, Copy)]
pub struct Failure {
    /// The connection to the backend could not be made (Pingora's
    /// `fail_to_connect`), as opposed to failing once made.
    pub connecting: bool,
    /// The error came from the backend's side, not from the client's.
    pub upstream: bool,
    /// Some of the backend's response reached the gateway.
    pub response_started: bool,
    /// A connection-level failure: refused, reset, closed before answering.
    pub unreachable: bool,
    /// The connection was a pooled one, reused for this attempt.
    pub reused_connection: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No retry, and the backend is not blamed: the client left, or part of
    /// the answer exists (a retry could duplicate it), or the backend
    /// answered badly rather than not at all.
    GiveUp,
    /// A pooled connection the backend had closed: not the backend's fault.
    /// The same backend again, same slot, on a fresh connection.
    Reconnect,
    /// The backend is down: exclude it, and try the next one.
    ExcludeAndRetry,
}

pub fn decide(f: &Failure) -> Decision {
    if f.connecting {
        return Decision::ExcludeAndRetry;
    }
    if !f.upstream || f.response_started || !f.unreachable {
        return Decision::GiveUp;
    }
    if f.reused_connection {
        Decision::Reconnect
    } else {
        Decision::ExcludeAndRetry
    }
}

/// Connection-level failures before a response: the backend is down or
/// unreachable, not merely slow.
pub fn unreachable(etype: &ErrorType) -> bool {
    use ErrorType::*;
    matches!(
        etype,
        ConnectTimedout
            | ConnectRefused
            | ConnectNoRoute
            | ConnectError
            | BindError
            | SocketError
            | ConnectionClosed
            | ReadError
            | WriteError
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reset from a fresh connection before any response.
    const RESET: Failure = Failure {
        connecting: false,
        upstream: true,
        response_started: false,
        unreachable: true,
        reused_connection: false,
    };

    #[test]
    fn each_case_decides_as_documented() {
        use Decision::*;
        let case = |f: fn(&mut Failure)| {
            let mut failure = RESET;
            f(&mut failure);
            failure
        };
        let cases: [(&str, Failure, Decision); 8] = [
            ("a reset before the response", RESET, ExcludeAndRetry),
            (
                "a connect failure",
                case(|f| f.connecting = true),
                ExcludeAndRetry,
            ),
            (
                "a closed pooled connection",
                case(|f| f.reused_connection = true),
                Reconnect,
            ),
            ("the client gone", case(|f| f.upstream = false), GiveUp),
            (
                "a started response",
                case(|f| f.response_started = true),
                GiveUp,
            ),
            (
                "a started response on a pooled connection",
                case(|f| (f.response_started, f.reused_connection) = (true, true)),
                GiveUp,
            ),
            (
                "a bad answer or a timeout",
                case(|f| f.unreachable = false),
                GiveUp,
            ),
            (
                "a connect failure whatever else is said",
                case(|f| (f.connecting, f.upstream) = (true, false)),
                ExcludeAndRetry,
            ),
        ];
        for (what, failure, want) in cases {
            assert_eq!(decide(&failure), want, "{what}");
        }
    }

    #[test]
    fn which_errors_mean_unreachable() {
        for t in [
            ErrorType::ConnectRefused,
            ErrorType::ConnectionClosed,
            ErrorType::ReadError,
        ] {
            assert!(unreachable(&t), "{t:?}");
        }
        for t in [
            ErrorType::ReadTimedout,
            ErrorType::InvalidHTTPHeader,
            ErrorType::HTTPStatus(500),
        ] {
            assert!(!unreachable(&t), "{t:?}");
        }
    }
}
