//! Log lines as JSON objects, one per line, for journald and log shippers.
//!
//! Every line carries `ts`, `level` and `target`. The gateway's structured
//! events (a message that is itself a JSON object, e.g. `prefix_cache`) keep
//! their fields at the top level; any other message, Pingora's included, goes
//! into `msg` as a string.

use std::fmt::Display;
use std::io::Write;

/// Installs the logger: `RUST_LOG` filters, `info` by default.
pub fn init() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(|buf, record| {
            let ts = buf.timestamp_millis();
            let message = record.args().to_string();
            write_line(buf, ts, record.level(), record.target(), &message)
        })
        .init();
}

fn write_line(
    out: &mut impl Write,
    ts: impl Display,
    level: log::Level,
    target: &str,
    message: &str,
) -> std::io::Result<()> {
    write!(
        out,
        r#"{{"ts":"{ts}","level":"{level}","target":{}"#,
        serde_json::Value::from(target)
    )?;
    match event_fields(target, message) {
        Some("") => writeln!(out, "}}"),
        Some(fields) => writeln!(out, ",{fields}}}"),
        None => writeln!(out, r#","msg":{}}}"#, serde_json::Value::from(message)),
    }
}

/// The inside of a structured event (`{...}` minus the braces). Only the
/// gateway's own messages qualify: they are serialized JSON objects, where a
/// text from elsewhere that merely starts with `{` might not be.
fn event_fields<'a>(target: &str, message: &'a str) -> Option<&'a str> {
    if !target.starts_with("poimen_gateway") {
        return None;
    }
    message.strip_prefix('{')?.strip_suffix('}').map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::Level;

    fn line(target: &str, message: &str) -> serde_json::Value {
        let mut out = Vec::new();
        write_line(
            &mut out,
            "2026-11-30T18:00:00.123Z",
            Level::Info,
            target,
            message,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "one line: {text}");
        assert!(text.ends_with('\n'));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    #[test]
    fn an_event_keeps_its_fields_at_the_top() {
        let v = line(
            "poimen_gateway::cache",
            r#"{"event":"prefix_cache","cached_tokens":512}"#,
        );
        assert_eq!(v["ts"], "2026-11-30T18:00:00.123Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "poimen_gateway::cache");
        assert_eq!(v["event"], "prefix_cache");
        assert_eq!(v["cached_tokens"], 512);
        assert!(v.get("msg").is_none());
    }

    #[test]
    fn text_goes_into_msg_escaped() {
        let v = line("pingora_core::server", "Bootstrap \"done\"\n\tnext\\");
        assert_eq!(v["target"], "pingora_core::server");
        assert_eq!(v["msg"], "Bootstrap \"done\"\n\tnext\\");
    }

    #[test]
    fn braces_from_elsewhere_are_text() {
        let v = line("pingora_proxy", "{not json");
        assert_eq!(v["msg"], "{not json");
        let v = line("pingora_proxy", "{a} b {c}");
        assert_eq!(v["msg"], "{a} b {c}");
    }

    #[test]
    fn an_empty_event_is_still_an_object() {
        let v = line("poimen_gateway", "{}");
        assert_eq!(v["target"], "poimen_gateway");
        assert_eq!(v.as_object().unwrap().len(), 3);
    }
}
