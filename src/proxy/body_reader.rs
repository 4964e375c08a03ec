//! Reading a request body whole, bounded, before the backend is chosen, in a
//! way Pingora will still forward (and re-send on a retry).
//!
//! Pingora 0.9 forwards a body that a filter already consumed only through its
//! retry buffer, which holds at most 64 KiB and is given up once a body
//! outgrows it. When that buffer is non-empty, Pingora replays it through
//! `request_body_filter` on every upstream attempt; the gateway substitutes
//! its own full copy there. So the retry buffer is switched on only for the
//! last ≤ 64 KiB of the body: it stays intact and triggers the replay, and the
//! gateway's copy supplies the bytes.

use bytes::{Bytes, BytesMut};
use pingora::proxy::Session;

use super::respond::Stop;
use crate::errors::ApiError;

/// Pingora's retry buffer size (`BODY_BUF_LIMIT` in pingora-core).
const RETRY_BUFFER_BYTES: usize = 64 * 1024;

/// Read the whole request body, at most `limit` bytes.
pub async fn read_whole(session: &mut Session, limit: usize) -> Result<Bytes, Stop> {
    let too_large = || Stop::Answer(ApiError::TooLarge { limit });
    let declared = match session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
    {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    Stop::Answer(ApiError::BadRequest("invalid Content-Length".into()))
                })?,
        ),
        None => None,
    };
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(16 * 1024));
    loop {
        // Chunked bodies have no known length: buffer from the start, so only
        // those that fit the retry buffer can be forwarded (checked below).
        let tail_left = declared.is_none_or(|n| n.saturating_sub(buf.len()) <= RETRY_BUFFER_BYTES);
        if tail_left {
            session.as_mut().enable_retry_buffering();
        }
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if buf.len() + chunk.len() > limit {
                    return Err(too_large());
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return Err(Stop::ClientGone(e)),
        }
    }
    if declared.is_none() && session.as_ref().retry_buffer_truncated() {
        return Err(Stop::Answer(ApiError::ChunkedTooLarge {
            limit: RETRY_BUFFER_BYTES,
        }));
    }
    Ok(buf.freeze())
}
