//! Bounded scanners that find a response's usage (and a Responses API
//! response's id) in its body as it streams past, without holding the
//! response. Which fields mean what is [`Dialect`]'s business; this module only
//! finds them.
//!
//! - JSON (non-streamed): every API writes `usage` as a top-level member
//!   near the end. The scanner keeps only the last [`TAIL_BYTES`] and, at the
//!   end, parses the last `"usage"` object in them. A key cannot occur
//!   inside a JSON string unescaped, so the match is a real key. A Responses
//!   body opens with its id (`{"id":"resp_…"`): only that first member is
//!   read, so the ids of output items and `"id"` inside strings never match.
//! - SSE: events are split at blank lines (at any byte boundary across
//!   chunks). Each event whose data mentions `"usage"` is parsed, and each
//!   report overrides the fields it carries; for Responses the first event
//!   with data (`response.created`) is parsed too, for the id. With `strip`
//!   on (completions, when the gateway asked for the usage itself), the
//!   usage-only chunk is removed from what the client receives and every
//!   other byte passes unchanged.
//! - An event that would have to be held across chunks beyond
//!   [`MAX_EVENT_BYTES`] is passed on as it arrives; its last [`TAIL_BYTES`]
//!   are searched for usage like a JSON body (a Responses
//!   `response.completed` repeats the whole output before its usage). Its id
//!   is not read.

use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use memchr::memmem;

use super::dialect::{Dialect, Usage, WireUsage};

/// The tail of a JSON body, or of an event too large to hold, searched for
/// `usage`.
pub const TAIL_BYTES: usize = 64 * 1024;
/// An SSE event held across chunks beyond this is passed on as it arrives
/// (never stripped).
pub const MAX_EVENT_BYTES: usize = 256 * 1024;
/// A longer response id is ignored rather than kept.
pub use crate::api::MAX_RESPONSE_ID_BYTES;
/// The first bytes of a JSON body held until its leading id is complete:
/// room for an id of [`MAX_RESPONSE_ID_BYTES`] with some escapes.
const HEAD_BYTES: usize = 1024;

/// Searchers built once: building one per search would cost more than the
/// search itself on small events.
static USAGE: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"usage\""));
static USAGE_REV: LazyLock<memmem::FinderRev<'static>> =
    LazyLock::new(|| memmem::FinderRev::new(b"\"usage\""));

/// Parse the usage object that follows the last `"usage"` key in `bytes`.
fn last_usage(bytes: &[u8]) -> Option<WireUsage> {
    let at = USAGE_REV.rfind(bytes)?;
    let rest = &bytes[at + b"\"usage\"".len()..];
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    if !rest.starts_with(b"{") {
        return None; // `"usage": null`
    }
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<WireUsage>();
    values.next()?.ok()
}

/// What the first bytes of a JSON body say about its leading id.
enum Lead {
    /// Not decided yet.
    More,
    Id(Box<str>),
    /// The body does not open with an id (or one too long).
    Absent,
}

/// The id a JSON body opens with, as `{"id":"…"`.
fn leading_id(head: &[u8]) -> Lead {
    let mut rest = head;
    for token in [&b"{"[..], b"\"id\"", b":"] {
        rest = rest.trim_ascii_start();
        match rest.strip_prefix(token) {
            Some(after) => rest = after,
            None if token.starts_with(rest) => return Lead::More,
            None => return Lead::Absent,
        }
    }
    let mut value = serde_json::Deserializer::from_slice(rest).into_iter::<Box<str>>();
    match value.next() {
        Some(Ok(id)) if id.len() <= MAX_RESPONSE_ID_BYTES => Lead::Id(id),
        None => Lead::More,
        Some(Err(e)) if e.is_eof() => Lead::More,
        _ => Lead::Absent,
    }
}

/// The last [`TAIL_BYTES`] of the bytes pushed into it.
#[derive(Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= TAIL_BYTES {
            self.0.clear();
            self.0.extend_from_slice(&bytes[bytes.len() - TAIL_BYTES..]);
            return;
        }
        let overflow = (self.0.len() + bytes.len()).saturating_sub(TAIL_BYTES);
        self.0.drain(..overflow);
        self.0.extend_from_slice(bytes);
    }
}

/// A non-streamed JSON body: its tail, and for Responses its head.
pub struct JsonScanner {
    dialect: Dialect,
    tail: Tail,
    /// The first bytes, while the leading id is undecided (Responses only).
    head: Option<Vec<u8>>,
    response_id: Option<Box<str>>,
}

impl JsonScanner {
    pub fn new(dialect: Dialect) -> Self {
        JsonScanner {
            dialect,
            tail: Tail::default(),
            head: (dialect == Dialect::Responses).then(Vec::new),
            response_id: None,
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        if let Some(head) = &mut self.head {
            let room = HEAD_BYTES - head.len();
            head.extend_from_slice(&chunk[..chunk.len().min(room)]);
            match leading_id(head) {
                Lead::More if head.len() < HEAD_BYTES => {}
                Lead::Id(id) => {
                    self.response_id = Some(id);
                    self.head = None;
                }
                _ => self.head = None,
            }
        }
        self.tail.push(chunk);
    }

    pub fn finish(&self) -> Option<Usage> {
        last_usage(&self.tail.0).map(|u| self.dialect.usage(u))
    }

    /// The response's id, as soon as the body's first bytes gave it.
    pub fn response_id(&self) -> Option<&str> {
        self.response_id.as_deref()
    }
}

/// Server-sent events, scanned (and optionally stripped) event by event.
pub struct SseScanner {
    dialect: Dialect,
    strip: bool,
    /// The bytes of the event not yet complete.
    pending: BytesMut,
    /// Inside an event that outgrew [`MAX_EVENT_BYTES`]: its last bytes.
    oversized: Option<Tail>,
    /// The next event with data is read whatever it holds (Responses: it is
    /// `response.created`, which has the id).
    id_pending: bool,
    usage: Option<Usage>,
    response_id: Option<Box<str>>,
}

impl SseScanner {
    /// `strip` applies to completions only: the other APIs have no
    /// usage-only chunk.
    pub fn new(dialect: Dialect, strip: bool) -> Self {
        SseScanner {
            dialect,
            strip: strip && dialect == Dialect::Completions,
            pending: BytesMut::new(),
            oversized: None,
            id_pending: dialect == Dialect::Responses,
            usage: None,
            response_id: None,
        }
    }

    /// Whether the body may shrink (the usage-only chunk is stripped).
    pub fn strips(&self) -> bool {
        self.strip
    }

    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// The response's id, as soon as the event carrying it has passed.
    pub fn response_id(&self) -> Option<&str> {
        self.response_id.as_deref()
    }

    /// Feed one chunk; returns what the client should receive for it. Without
    /// `strip` that is the chunk itself.
    pub fn feed(&mut self, chunk: Bytes) -> Bytes {
        // The common case: whole events, none to read: the chunk goes on as
        // it is, without copying.
        let plain = self.pending.is_empty()
            && self.oversized.is_none()
            && chunk.ends_with(b"\n\n")
            && !self.id_pending
            && USAGE.find(&chunk).is_none();
        if plain {
            return chunk;
        }
        let mut out = BytesMut::new();
        let mut rest = &chunk[..];
        while let Some(end) = event_end(self.event_so_far(), rest) {
            let (event, after) = rest.split_at(end);
            self.complete(event, &mut out);
            rest = after;
        }
        if !rest.is_empty() {
            self.hold(rest, &mut out);
        }
        if self.strip {
            out.freeze()
        } else {
            chunk
        }
    }

    /// End of stream. Returns what is still owed to the client: with
    /// `strip`, a last event that had no terminator.
    pub fn finish(&mut self) -> Bytes {
        let mut out = BytesMut::new();
        self.complete(&[], &mut out);
        out.freeze()
    }

    /// The last bytes of the current event so far, for a terminator that
    /// straddles chunks.
    fn event_so_far(&self) -> &[u8] {
        match &self.oversized {
            Some(tail) => &tail.0,
            None => &self.pending,
        }
    }

    /// The current event ends with `bytes`: read it, pass it on or drop it.
    fn complete(&mut self, bytes: &[u8], out: &mut BytesMut) {
        if let Some(mut tail) = self.oversized.take() {
            tail.push(bytes);
            if let Some(u) = last_usage(&tail.0) {
                self.note(self.dialect.usage(u));
            }
            self.emit(bytes, out);
        } else if self.pending.is_empty() {
            // Whole in this chunk: read in place.
            if !self.read(bytes) {
                self.emit(bytes, out);
            }
        } else {
            self.pending.extend_from_slice(bytes);
            let event = self.pending.split();
            if !self.read(&event) {
                self.emit(&event, out);
            }
        }
    }

    /// `bytes` begin or continue an event that has not ended yet.
    fn hold(&mut self, bytes: &[u8], out: &mut BytesMut) {
        if self.oversized.is_none() && self.pending.len() + bytes.len() <= MAX_EVENT_BYTES {
            self.pending.extend_from_slice(bytes);
            return;
        }
        // Too large to hold: pass it on as it comes, keeping only its tail.
        let held = self.pending.split();
        self.emit(&held, out);
        self.emit(bytes, out);
        let tail = self.oversized.get_or_insert_with(Tail::default);
        tail.push(&held);
        tail.push(bytes);
    }

    /// With `strip`, bytes go to the client through `out`; without it the
    /// chunk itself goes on.
    fn emit(&self, bytes: &[u8], out: &mut BytesMut) {
        if self.strip {
            out.extend_from_slice(bytes);
        }
    }

    /// Read one whole event; true when it is the usage-only chunk to strip.
    fn read(&mut self, event: &[u8]) -> bool {
        let Some(data) = data_of(event) else {
            return false;
        };
        if !std::mem::take(&mut self.id_pending) && USAGE.find(data).is_none() {
            return false;
        }
        let facts = self.dialect.read_event(data);
        if let Some(u) = facts.usage {
            self.note(u);
        }
        if self.response_id.is_none() {
            self.response_id = facts
                .response_id
                .filter(|id| id.len() <= MAX_RESPONSE_ID_BYTES);
        }
        self.strip && facts.usage_only
    }

    fn note(&mut self, report: Usage) {
        self.usage = Some(report.or(self.usage.unwrap_or_default()));
    }
}

/// Where the current event ends in `input` (just after its blank line),
/// given its last bytes from earlier chunks.
fn event_end(before: &[u8], input: &[u8]) -> Option<usize> {
    // A terminator is at most 3 bytes: one that straddles lies in the last
    // 2 bytes before and the first 3 of the input.
    let k = before.len().min(2);
    let n = input.len().min(3);
    let mut joint = [0u8; 5];
    joint[..k].copy_from_slice(&before[before.len() - k..]);
    joint[k..k + n].copy_from_slice(&input[..n]);
    match find_event_end(&joint[..k + n]) {
        Some(end) if end > k => Some(end - k),
        _ => find_event_end(input),
    }
}

/// The end (exclusive) of the first event in `buf`: after a blank line.
fn find_event_end(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = memchr::memchr(b'\n', &buf[from..]) {
        let nl = from + i;
        // "\n\n" or "\n\r\n" ends the event.
        match buf.get(nl + 1) {
            Some(b'\n') => return Some(nl + 2),
            Some(b'\r') if buf.get(nl + 2) == Some(&b'\n') => return Some(nl + 3),
            _ => from = nl + 1,
        }
    }
    None
}

/// The payload of an event's single `data:` line (vLLM sends one per event).
fn data_of(event: &[u8]) -> Option<&[u8]> {
    let data = match event.strip_prefix(b"data:") {
        Some(data) => data,
        None => &event[memmem::find(event, b"data:")? + 5..],
    };
    let end = memchr::memchr(b'\n', data).unwrap_or(data.len());
    Some(data[..end].trim_ascii())
}

#[cfg(test)]
mod tests;
