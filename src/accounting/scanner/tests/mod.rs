//! Exact-sequence tests of the scanners, one module per API, on bodies
//! shaped as vLLM writes them. Streams are cut at every byte boundary.

use super::*;

mod completions;
mod messages;
mod responses;

/// Feed `pieces` to a stream scanner; return what the client got, and the
/// scanner.
fn feed_sse<'a>(
    api: Dialect,
    strip: bool,
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> (Vec<u8>, SseScanner) {
    let mut s = SseScanner::new(api, strip);
    let mut out = Vec::new();
    for piece in pieces {
        out.extend_from_slice(&s.feed(Bytes::copy_from_slice(piece)));
    }
    out.extend_from_slice(&s.finish());
    (out, s)
}

/// Feed `body` in two pieces split at `at`.
fn run_sse(api: Dialect, body: &[u8], at: usize, strip: bool) -> (Vec<u8>, SseScanner) {
    feed_sse(api, strip, [&body[..at], &body[at..]])
}

/// A JSON body fed in two pieces split at `at`.
fn run_json(api: Dialect, body: &[u8], at: usize) -> JsonScanner {
    let mut s = JsonScanner::new(api);
    s.feed(&body[..at]);
    s.feed(&body[at..]);
    s
}

fn usage(prompt: Option<u64>, cached: Option<u64>, completion: Option<u64>) -> Usage {
    Usage {
        prompt_tokens: prompt,
        cached_tokens: cached,
        completion_tokens: completion,
    }
}
