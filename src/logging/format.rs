//! One log record as one JSON object on one line, for journald and log
//! shippers.
//!
//! Every line carries `ts`, `level` and `target`. A structured event is a
//! log record with key-values (the `log` crate's `kv`), e.g.
//! `info!(event = "backend_restored", model = name; "")`: its fields follow
//! at the top level, in the order written, each serialised as JSON. Any
//! other message, Pingora's included, goes into `msg` as a string. The
//! per-request `prefix_cache` event is written field by field into its
//! line instead ([`Event`]): the same JSON, without a key-value's dynamic
//! visit, which cost more than the rest of the line.

use std::cell::RefCell;
use std::fmt;
use std::io::Write as _;

use log::kv::{Error as KvError, Key, Value, VisitSource};

/// `record` as one line, stamped now (UTC, milliseconds, as env_logger's
/// `timestamp_millis` printed it); `None` when a value fails to format (as
/// under env_logger, such a record is not logged).
pub fn render(record: &log::Record) -> Option<Vec<u8>> {
    let mut line = Vec::with_capacity(LINE_BYTES);
    write_line(&mut line, jiff::Timestamp::now(), record).ok()?;
    Some(line)
}

/// Room for most lines (a `prefix_cache` event) without growing.
const LINE_BYTES: usize = 512;

/// An event's line, its fields written one by one in order; each value is
/// written as JSON ([`JsonValue`]).
pub struct Event(Vec<u8>);

impl Event {
    pub(super) fn new(level: log::Level, target: &str) -> Self {
        let mut line = Vec::with_capacity(LINE_BYTES);
        head(&mut line, jiff::Timestamp::now(), level, target);
        Event(line)
    }

    /// Add `"key": value`; `key`, a name in the code, is written as it is.
    pub fn field(&mut self, key: &'static str, value: impl JsonValue) -> &mut Self {
        debug_assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        self.0.extend_from_slice(b",\"");
        self.0.extend_from_slice(key.as_bytes());
        self.0.extend_from_slice(b"\":");
        value.write_json(&mut self.0);
        self
    }

    pub(super) fn finish(mut self) -> Vec<u8> {
        self.0.extend_from_slice(b"}\n");
        self.0
    }
}

/// A value an [`Event`] field takes.
pub trait JsonValue {
    fn write_json(&self, out: &mut Vec<u8>);
}

impl JsonValue for &str {
    fn write_json(&self, out: &mut Vec<u8>) {
        string(out, self);
    }
}

/// Numbers as serde_json writes them (a float that is no number: `null`).
macro_rules! json_number {
    ($($t:ty),*) => {$(
        impl JsonValue for $t {
            fn write_json(&self, out: &mut Vec<u8>) {
                // Writing into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut *out, self);
            }
        }
    )*};
}

json_number!(u16, u64, f64);

impl<T: JsonValue> JsonValue for Option<T> {
    fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Some(v) => v.write_json(out),
            None => out.extend_from_slice(b"null"),
        }
    }
}

/// `now` as `2026-11-30T18:00:00.123Z`. Each thread formats the date and
/// time of day once a second: a line is written every request, and
/// formatting a timestamp whole cost as much as the rest of the line.
fn stamp(out: &mut Vec<u8>, now: jiff::Timestamp) {
    thread_local! {
        /// A second, and its text without the `Z`.
        static SECOND: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
    }
    let (second, milli) = (now.as_second(), now.subsec_millisecond());
    if milli < 0 {
        // Before 1970 (a negative fraction): not worth the cache.
        let _ = write!(out, "{now:.3}");
        return;
    }
    SECOND.with_borrow_mut(|(cached, text)| {
        if *cached != second {
            text.clear();
            // Precision 0 cuts the fraction off.
            let _ = fmt::Write::write_fmt(text, format_args!("{now:.0}"));
            text.pop();
            *cached = second;
        }
        out.extend_from_slice(text.as_bytes());
    });
    let digit = |n: i32| b'0' + (n % 10) as u8;
    out.extend_from_slice(&[
        b'.',
        digit(milli / 100),
        digit(milli / 10),
        digit(milli),
        b'Z',
    ]);
}

/// `{"ts":…,"level":…,"target":…`: what every line opens with.
fn head(out: &mut Vec<u8>, now: jiff::Timestamp, level: log::Level, target: &str) {
    out.extend_from_slice(br#"{"ts":""#);
    stamp(out, now);
    out.extend_from_slice(br#"","level":""#);
    out.extend_from_slice(level.as_str().as_bytes());
    out.extend_from_slice(br#"","target":"#);
    string(out, target);
}

fn write_line(
    out: &mut Vec<u8>,
    now: jiff::Timestamp,
    record: &log::Record,
) -> Result<(), KvError> {
    head(out, now, record.level(), record.target());
    let mut fields = Fields { out, count: 0 };
    record.key_values().visit(&mut fields)?;
    let has_fields = fields.count > 0;
    let message = record.args();
    // Events carry an empty message; a plain message is always shown.
    let text = match message.as_str() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(message.to_string()),
    };
    if !has_fields || !text.is_empty() {
        out.extend_from_slice(br#","msg":"#);
        string(out, &text);
    }
    out.extend_from_slice(b"}\n");
    Ok(())
}

/// `s` as a JSON string. Most strings of a line (names, addresses) need no
/// escape: they are found so with a table read a byte and copied whole.
fn string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| !ESCAPED[b as usize]) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// The bytes a JSON string escapes: `"`, `\` and the control characters.
static ESCAPED: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Writes each key-value as `,"key":<JSON value>`.
struct Fields<'a> {
    out: &'a mut Vec<u8>,
    count: usize,
}

impl<'kvs> VisitSource<'kvs> for Fields<'_> {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), KvError> {
        self.count += 1;
        self.out.push(b',');
        string(self.out, key.as_str());
        self.out.push(b':');
        serde_json::to_writer(&mut *self.out, &value).map_err(KvError::boxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::kv::ToValue;
    use log::Level;

    const TS: &str = "2026-11-30T18:00:00.123Z";

    fn ts() -> jiff::Timestamp {
        TS.parse().unwrap()
    }

    /// The line of an event of `poimen_gateway::cache` with `kvs`, at `TS`.
    fn event_line(kvs: &[(&str, Value)]) -> Result<String, KvError> {
        let record = log::Record::builder()
            .level(Level::Info)
            .target("poimen_gateway::cache")
            .args(format_args!(""))
            .key_values(&kvs)
            .build();
        let mut out = Vec::new();
        write_line(&mut out, ts(), &record)?;
        Ok(String::from_utf8(out).unwrap())
    }

    fn render(record: &log::Record) -> serde_json::Value {
        let mut out = Vec::new();
        write_line(&mut out, ts(), record).unwrap();
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
        assert_eq!(
            event_line(kvs).unwrap(),
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
    fn every_kind_of_value_is_written_as_json_and_a_failing_one_drops_the_line() {
        struct Fails;
        impl serde::Serialize for Fails {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no"))
            }
        }
        let addr: std::net::SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let kvs: &[(&str, Value)] = &[
            ("ok", Value::from(true)),
            ("delta", Value::from(-3i64)),
            ("nan", Value::from(f64::NAN)),
            ("addr", Value::from_display(&addr)),
            ("odd \"key\"", Value::from("tab\there")),
        ];
        let line = event_line(kvs).unwrap();
        let tail = r#","ok":true,"delta":-3,"nan":null,"addr":"127.0.0.1:8000","odd \"key\"":"tab\there"}"#;
        assert!(line.ends_with(&format!("{tail}\n")), "{line}");
        let fails: &[(&str, Value)] =
            &[("x", Value::from(1u64)), ("bad", Value::from_serde(&Fails))];
        assert!(event_line(fails).is_err());
    }

    #[test]
    fn an_event_written_field_by_field_is_the_line_its_record_makes() {
        let kvs: &[(&str, Value)] = &[
            ("event", Value::from("prefix_cache")),
            ("cache_key", None::<&str>.to_value()),
            ("cached_tokens", Value::from(512u64)),
            ("hit_rate", Value::from(0.5f64)),
            ("status", Value::from(200u16)),
            ("note", Value::from("tab\there \"quoted\"")),
        ];
        let from_record = event_line(kvs).unwrap();
        let mut event = Event::new(Level::Info, "poimen_gateway::cache");
        event
            .field("event", "prefix_cache")
            .field("cache_key", None::<&str>)
            .field("cached_tokens", 512u64)
            .field("hit_rate", 0.5)
            .field("status", 200u16)
            .field("note", "tab\there \"quoted\"");
        // All but the time it was written.
        let event = String::from_utf8(event.finish()).unwrap();
        let after_ts = |line: &str| line.split_once(r#"","level""#).unwrap().1.to_owned();
        assert_eq!(after_ts(&event), after_ts(&from_record));
    }

    #[test]
    fn a_stamp_reads_as_jiffs_own_to_the_millisecond() {
        // Within a second, across one, and back, and a second first seen
        // at its last millisecond: the cached second is the right one every
        // time.
        for ms in [
            1_764_525_600_123,
            1_764_525_600_999,
            1_764_525_601_000,
            1_764_525_600_007,
            1_764_525_602_999,
            0,
            -1_500,
        ] {
            let now = jiff::Timestamp::from_millisecond(ms).unwrap();
            let mut ts = Vec::new();
            stamp(&mut ts, now);
            assert_eq!(String::from_utf8(ts).unwrap(), format!("{now:.3}"), "{ms}");
        }
    }

    #[test]
    fn an_empty_message_is_still_a_line() {
        let v = text("poimen_gateway", "");
        assert_eq!(v.as_object().unwrap().len(), 4);
        assert_eq!(v["msg"], "");
    }
}
