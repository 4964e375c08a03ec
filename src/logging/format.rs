//! One log record as one JSON object on one line, for journald and log
//! shippers.
//!
//! Every line carries `ts`, `level` and `target`. A structured event is a
//! log record with key-values (the `log` crate's `kv`), e.g.
//! `info!(event = "backend_restored", model = name; "")`: its fields follow
//! at the top level, in the order written, each serialised as JSON. Any
//! other message, Pingora's included, goes into `msg` as a string.

use std::fmt::Display;
use std::io::Write;

use log::kv::{Error as KvError, Key, Value, VisitSource};

/// `record` as one line, stamped now (UTC, milliseconds, as env_logger's
/// `timestamp_millis` printed it); `None` when a value fails to format (as
/// under env_logger, such a record is not logged).
pub fn render(record: &log::Record) -> Option<Vec<u8>> {
    // Most lines (a `prefix_cache` event) fit without growing.
    let mut line = Vec::with_capacity(384);
    let ts = jiff::Timestamp::now();
    write_line(&mut line, format_args!("{ts:.3}"), record).ok()?;
    Some(line)
}

fn write_line(out: &mut impl Write, ts: impl Display, record: &log::Record) -> std::io::Result<()> {
    let level = record.level();
    write!(out, r#"{{"ts":"{ts}","level":"{level}","target":"#)?;
    serde_json::to_writer(&mut *out, record.target())?;
    let mut fields = Fields { out, count: 0 };
    // A failed write is reported by the writer itself below.
    let _ = record.key_values().visit(&mut fields);
    let has_fields = fields.count > 0;
    let message = record.args();
    // Events carry an empty message; a plain message is always shown.
    let text = match message.as_str() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(message.to_string()),
    };
    if !has_fields || !text.is_empty() {
        write!(out, r#","msg":"#)?;
        serde_json::to_writer(&mut *out, text.as_ref())?;
    }
    writeln!(out, "}}")
}

/// Writes each key-value as `,"key":<JSON value>`.
struct Fields<'a, W: Write> {
    out: &'a mut W,
    count: usize,
}

impl<'kvs, W: Write> VisitSource<'kvs> for Fields<'_, W> {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), KvError> {
        self.count += 1;
        write!(self.out, ",").map_err(KvError::boxed)?;
        serde_json::to_writer(&mut *self.out, key.as_str()).map_err(KvError::boxed)?;
        write!(self.out, ":").map_err(KvError::boxed)?;
        serde_json::to_writer(&mut *self.out, &value).map_err(KvError::boxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::kv::ToValue;
    use log::Level;

    const TS: &str = "2026-11-30T18:00:00.123Z";

    fn render(record: &log::Record) -> serde_json::Value {
        let mut out = Vec::new();
        write_line(&mut out, TS, record).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "one line: {text}");
        assert!(text.ends_with('\n'));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    fn text(target: &str, message: &str) -> serde_json::Value {
        render(
            &log::Record::builder()
                .level(Level::Info)
                .target(target)
                .args(format_args!("{message}"))
                .build(),
        )
    }

    #[test]
    fn an_event_keeps_its_fields_at_the_top_in_order() {
        let kvs: &[(&str, Value)] = &[
            ("event", Value::from("prefix_cache")),
            ("cached_tokens", Value::from(512u64)),
            ("cache_key", None::<&str>.to_value()),
            ("hit_rate", Value::from(0.5f64)),
        ];
        let record = log::Record::builder()
            .level(Level::Info)
            .target("poimen_gateway::cache")
            .args(format_args!(""))
            .key_values(&kvs)
            .build();
        let mut out = Vec::new();
        write_line(&mut out, TS, &record).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                r#"{{"ts":"{TS}","level":"INFO","target":"poimen_gateway::cache","event":"prefix_cache","cached_tokens":512,"cache_key":null,"hit_rate":0.5}}"#
            ) + "\n"
        );
    }

    #[test]
    fn text_goes_into_msg_escaped() {
        let v = text("pingora_core::server", "Bootstrap \"done\"\n\tnext\\");
        assert_eq!(v["target"], "pingora_core::server");
        assert_eq!(v["msg"], "Bootstrap \"done\"\n\tnext\\");
    }

    #[test]
    fn json_looking_text_stays_text() {
        // Only key-values make an event: a message that looks like JSON,
        // from the gateway or elsewhere, is a string.
        let v = text("pingora_proxy", r#"{"event":"x"}"#);
        assert_eq!(v["msg"], r#"{"event":"x"}"#);
        assert!(v.get("event").is_none());
        let v = text("poimen_gateway", "{a} b {c}");
        assert_eq!(v["msg"], "{a} b {c}");
    }

    #[test]
    fn a_line_is_stamped_in_utc_to_the_millisecond() {
        let record = log::Record::builder()
            .level(Level::Warn)
            .target("t")
            .args(format_args!("m"))
            .build();
        let line = String::from_utf8(super::render(&record).unwrap()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let ts = v["ts"].as_str().unwrap();
        // As TS above: 2026-11-30T18:00:00.123Z.
        let shape: String = ts
            .chars()
            .map(|c| if c.is_ascii_digit() { '0' } else { c })
            .collect();
        assert_eq!(shape, "0000-00-00T00:00:00.000Z", "{ts}");
        assert!(line.ends_with("}\n"));
    }

    #[test]
    fn an_empty_message_is_still_a_line() {
        let v = text("poimen_gateway", "");
        assert_eq!(v.as_object().unwrap().len(), 4);
        assert_eq!(v["msg"], "");
    }
}
