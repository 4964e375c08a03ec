//! Bounded scanners that find vLLM's usage in a response body as it streams
//! past, without holding the response.
//!
//! - JSON (non-streamed): vLLM writes `usage` after `choices`, near the end.
//!   The scanner keeps only the last [`JSON_TAIL_BYTES`] and, at the end,
//!   parses the last `"usage"` object in them. A key cannot occur inside a
//!   JSON string unescaped, so the match is a real key.
//! - SSE: events are split at blank lines (at any byte boundary across
//!   chunks). The last event carrying a `usage` object wins (vLLM sends it in
//!   a final chunk with `"choices": []`). With `strip` on (the gateway asked
//!   for the usage itself), that usage-only event is removed from what the
//!   client receives and every other byte passes unchanged.

use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use memchr::memmem;
use serde::Deserialize;

/// The tail of a JSON body searched for `usage`.
pub const JSON_TAIL_BYTES: usize = 64 * 1024;
/// An SSE event larger than this is passed on unscanned (and unstripped).
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

/// Searchers built once: building one per search would cost more than the
/// search itself on small events.
static USAGE: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"usage\""));
static USAGE_REV: LazyLock<memmem::FinderRev<'static>> =
    LazyLock::new(|| memmem::FinderRev::new(b"\"usage\""));

/// What vLLM reported about a request's prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct UsageField {
    prompt_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

impl From<UsageField> for Usage {
    fn from(u: UsageField) -> Self {
        Usage {
            prompt_tokens: u.prompt_tokens,
            cached_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        }
    }
}

/// Parse the usage object that follows the last `"usage"` key in `bytes`.
fn last_usage(bytes: &[u8]) -> Option<Usage> {
    let at = USAGE_REV.rfind(bytes)?;
    let rest = &bytes[at + b"\"usage\"".len()..];
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    if !rest.starts_with(b"{") {
        return None; // `"usage": null`
    }
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<UsageField>();
    values.next()?.ok().map(Usage::from)
}

/// The tail of a non-streamed JSON body.
#[derive(Default)]
pub struct JsonScanner {
    tail: Vec<u8>,
}

impl JsonScanner {
    pub fn feed(&mut self, chunk: &[u8]) {
        if chunk.len() >= JSON_TAIL_BYTES {
            self.tail.clear();
            self.tail
                .extend_from_slice(&chunk[chunk.len() - JSON_TAIL_BYTES..]);
            return;
        }
        let overflow = (self.tail.len() + chunk.len()).saturating_sub(JSON_TAIL_BYTES);
        self.tail.drain(..overflow);
        self.tail.extend_from_slice(chunk);
    }

    pub fn finish(&self) -> Option<Usage> {
        last_usage(&self.tail)
    }
}

/// Server-sent events, scanned (and optionally stripped) event by event.
pub struct SseScanner {
    strip: bool,
    /// The bytes of the event not yet complete.
    pending: BytesMut,
    /// The pending event outgrew the bound: pass it through unscanned.
    oversized: bool,
    usage: Option<Usage>,
}

impl SseScanner {
    pub fn new(strip: bool) -> Self {
        SseScanner {
            strip,
            pending: BytesMut::new(),
            oversized: false,
            usage: None,
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Feed one chunk; returns what the client should receive for it. Without
    /// `strip` that is the chunk itself.
    pub fn feed(&mut self, chunk: Bytes) -> Bytes {
        // The common case: whole events, none with usage: nothing to read,
        // and the chunk goes on as it is, without copying.
        let plain = self.pending.is_empty()
            && !self.oversized
            && chunk.ends_with(b"\n\n")
            && USAGE.find(&chunk).is_none();
        if plain {
            return chunk;
        }
        if !self.strip {
            self.scan_only(&chunk);
            return chunk;
        }
        let mut out = BytesMut::new();
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let (event, tail) = self.take_event(rest);
            rest = tail;
            match event {
                Some(event) if self.is_usage_only(&event) => {}
                Some(event) => out.extend_from_slice(&event),
                // An incomplete event too large to hold: release it as is.
                None if self.oversized => out.extend_from_slice(&self.pending.split()),
                None => {}
            }
        }
        out.freeze()
    }

    /// End of stream. Returns what is still owed to the client: with
    /// `strip`, a last event that had no terminator.
    pub fn finish(&mut self) -> Bytes {
        let rest = self.pending.split().freeze();
        if !self.oversized {
            self.note_usage(&rest);
        }
        if self.strip {
            rest
        } else {
            Bytes::new()
        }
    }

    fn scan_only(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        // Finish an event begun in an earlier chunk.
        if !self.pending.is_empty() || self.oversized {
            let (event, tail) = self.take_event(rest);
            rest = tail;
            match event {
                Some(event) => self.note_usage(&event),
                // Still inside an oversized event: keep nothing of it.
                None if self.oversized => self.pending.clear(),
                None => {}
            }
        }
        // Whole events in this chunk are scanned in place.
        while let Some(end) = find_event_end(rest) {
            self.note_usage(&rest[..end]);
            rest = &rest[end..];
        }
        if rest.len() > MAX_EVENT_BYTES {
            self.oversized = true;
        } else {
            self.pending.extend_from_slice(rest);
        }
    }

    /// Move bytes from `input` into `pending` up to the end of the current
    /// event. Returns the completed event (if any) and the unread input.
    fn take_event<'a>(&mut self, input: &'a [u8]) -> (Option<BytesMut>, &'a [u8]) {
        // The terminator may straddle chunks: search from a little before
        // the new bytes.
        let start = self.pending.len().saturating_sub(3);
        self.pending.extend_from_slice(input);
        let end = find_event_end(&self.pending[start..]).map(|e| start + e);
        match end {
            Some(end) => {
                let consumed = end - (self.pending.len() - input.len());
                let event = self.pending.split_to(end);
                self.pending.clear();
                let done_oversized = std::mem::replace(&mut self.oversized, false);
                if done_oversized && !self.strip {
                    return (None, &input[consumed..]);
                }
                (Some(event), &input[consumed..])
            }
            None => {
                if self.pending.len() > MAX_EVENT_BYTES {
                    self.oversized = true;
                }
                (None, &[])
            }
        }
    }

    fn is_usage_only(&mut self, event: &[u8]) -> bool {
        let Some(data) = data_of(event) else {
            return false;
        };
        if USAGE.find(data).is_none() {
            return false;
        }
        #[derive(Deserialize)]
        struct Chunk {
            choices: Option<Vec<serde::de::IgnoredAny>>,
            usage: Option<UsageField>,
        }
        match serde_json::from_slice::<Chunk>(data) {
            Ok(Chunk {
                choices,
                usage: Some(u),
            }) => {
                self.usage = Some(u.into());
                choices.is_some_and(|c| c.is_empty())
            }
            _ => false,
        }
    }

    fn note_usage(&mut self, event: &[u8]) {
        if let Some(data) = data_of(event) {
            if let Some(u) = last_usage(data) {
                self.usage = Some(u);
            }
        }
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
