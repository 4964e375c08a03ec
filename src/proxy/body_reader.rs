//! Reading a request body whole, bounded, before the backend is chosen.
//!
//! Pingora forwards only the body bytes it reads itself; this body it finds
//! already read. The patched pingora-proxy (`vendor/README.md`) then calls
//! `request_body_filter` once on every upstream attempt, where the gateway
//! emits its copy; so a body of any size and framing (`Content-Length` or
//! chunked) is forwarded, and re-sent on a retry.

use bytes::{Bytes, BytesMut};
use pingora::proxy::Session;

use super::respond::Stop;
use crate::errors::ApiError;

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
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                // A chunked body declares no length: stop at the limit, before
                // holding more than it.
                if buf.len() + chunk.len() > limit {
                    return Err(too_large());
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return Err(Stop::ClientGone(e)),
        }
    }
    Ok(buf.freeze())
}
