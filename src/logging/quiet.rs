//! Pingora messages that say ERROR or WARN where nothing failed, and the
//! level they are logged at instead.
//!
//! Operators page on ERROR, so a healthy gateway must not log it. Each entry
//! names the target and the whole message text: the same target with any
//! other message (a real failure) keeps its level.

use std::fmt;

use log::Level;

struct Lowered {
    target: &'static str,
    message: &'static str,
    level: Level,
}

const LOWERED: &[Lowered] = &[
    // A pooled upstream connection was locked by its idle watcher at the
    // moment a request wanted it, so a new connection was made: routine
    // under concurrent keep-alive load.
    Lowered {
        target: "pingora_core::connectors",
        message: "failed to acquire reusable stream",
        level: Level::Debug,
    },
    // A graceful upgrade (`-u`): the new process waits for the old one to
    // hand its sockets over (SIGQUIT comes after the new process started).
    // Giving up after the retries is still an error, logged as such.
    Lowered {
        target: "pingora_core::server::transfer_fd",
        message: "No incoming socket transfer, sleep 1s and try again",
        level: Level::Info,
    },
];

/// The level to log `record` at: lower than its own if it is listed.
pub fn lowered(record: &log::Record) -> Option<Level> {
    if record.level() > Level::Warn {
        return None;
    }
    LOWERED
        .iter()
        .find(|l| l.target == record.target() && formats_to(record.args(), l.message))
        .map(|l| l.level)
}

/// Whether `args` formats to exactly `text`, compared piece by piece as it
/// formats: nothing is allocated.
fn formats_to(args: &fmt::Arguments, text: &str) -> bool {
    if let Some(s) = args.as_str() {
        return s == text;
    }
    struct Rest<'a>(&'a str);
    impl fmt::Write for Rest<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 = self.0.strip_prefix(s).ok_or(fmt::Error)?;
            Ok(())
        }
    }
    let mut rest = Rest(text);
    fmt::write(&mut rest, *args).is_ok() && rest.0.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(level: Level, target: &str, args: fmt::Arguments) -> Option<Level> {
        lowered(
            &log::Record::builder()
                .level(level)
                .target(target)
                .args(args)
                .build(),
        )
    }

    #[test]
    fn a_listed_message_is_lowered() {
        let target = "pingora_core::connectors";
        assert_eq!(
            level(
                Level::Error,
                target,
                format_args!("failed to acquire reusable stream")
            ),
            Some(Level::Debug)
        );
        // Formatted at run time, as Pingora logs it.
        let retry = std::time::Duration::from_secs(1);
        assert_eq!(
            level(
                Level::Error,
                "pingora_core::server::transfer_fd",
                format_args!("No incoming socket transfer, sleep {retry:?} and try again")
            ),
            Some(Level::Info)
        );
    }

    #[test]
    fn other_messages_of_the_same_target_keep_their_level() {
        let target = "pingora_core::server::transfer_fd";
        let e = "ECONNRESET";
        for args in [
            format_args!("Error accepting socket transfer: {e}"),
            format_args!("No incoming socket transfer, sleep 2s and try again"),
            format_args!("No incoming socket transfer, sleep 1s and try again!"),
            format_args!("No incoming socket transfer"),
        ] {
            assert_eq!(level(Level::Error, target, args), None, "{args}");
        }
    }

    #[test]
    fn the_same_message_elsewhere_keeps_its_level() {
        assert_eq!(
            level(
                Level::Error,
                "pingora_proxy",
                format_args!("failed to acquire reusable stream")
            ),
            None
        );
    }

    #[test]
    fn only_errors_and_warnings_are_lowered() {
        let message = format_args!("failed to acquire reusable stream");
        assert_eq!(
            level(Level::Warn, "pingora_core::connectors", message),
            Some(Level::Debug)
        );
        assert_eq!(
            level(Level::Info, "pingora_core::connectors", message),
            None
        );
    }
}
