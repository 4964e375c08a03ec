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
    // A declared length over HTTP/1 is read into one buffer of that size,
    // in as few reads as the socket allows and with no copy
    // (vendor/pingora-core).
    if declared.is_some() {
        match session.read_body_whole().await {
            Ok(Some(body)) => return Ok(body),
            Ok(None) => {}
            Err(e) => return Err(Stop::ClientGone(e)),
        }
    }
    // Otherwise (HTTP/2, chunked), a body that arrives in one piece is kept
    // as it came, not copied. A declared length is read into one buffer of that
    // size; a chunked body's pieces are kept and joined once at the end, so
    // no buffer is regrown (and copied) on the way, which would leave the
    // allocator holding every smaller buffer it outgrew.
    let mut pieces: Vec<Bytes> = Vec::new();
    let mut buf: Option<BytesMut> = None;
    let mut held = 0;
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                // A chunked body declares no length: stop at the limit, before
                // holding more than it.
                held += chunk.len();
                if held > limit {
                    return Err(too_large());
                }
                match (&mut buf, declared) {
                    (Some(buf), _) => buf.extend_from_slice(&chunk),
                    (None, Some(n)) if !pieces.is_empty() => {
                        let mut b = BytesMut::with_capacity(n);
                        b.extend_from_slice(&pieces.pop().unwrap_or_default());
                        b.extend_from_slice(&chunk);
                        buf = Some(b);
                    }
                    (None, _) => pieces.push(chunk),
                }
            }
            Ok(None) => break,
            // The client's framing is broken: its error, not the backend's
            // (and the connection cannot carry another request).
            Err(e) if e.etype().as_str() == "InvalidChunk" => {
                session.set_keepalive(None);
                let why = "the chunked request body is malformed";
                return Err(Stop::Answer(ApiError::BadRequest(why.into())));
            }
            Err(e) => return Err(Stop::ClientGone(e)),
        }
    }
    Ok(match (buf, pieces.len()) {
        (Some(buf), _) => buf.freeze(),
        (None, 0) => Bytes::new(),
        (None, 1) => pieces.pop().unwrap_or_default(),
        (None, _) => {
            let mut whole = BytesMut::with_capacity(held);
            pieces.iter().for_each(|p| whole.extend_from_slice(p));
            whole.freeze()
        }
    })
}
