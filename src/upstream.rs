//! The gateway's own questions to its backends (a stored response's owner,
//! a model list): a GET with the upstream API key, over Pingora's client.

use std::net::SocketAddr;

use http::HeaderValue;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use pingora::protocols::http::client::HttpSession;

/// `upstream_api_key` as vLLM's `--api-key` expects it.
pub fn authorization(upstream_api_key: Option<&str>) -> Option<HeaderValue> {
    upstream_api_key.and_then(|k| HeaderValue::try_from(format!("Bearer {k}")).ok())
}

/// `GET path` to the backend at `addr`.
pub fn get(path: &str, addr: SocketAddr, auth: Option<&HeaderValue>) -> Option<RequestHeader> {
    let mut req = RequestHeader::build("GET", path.as_bytes(), None).ok()?;
    // uvicorn refuses an HTTP/1.1 request without one.
    req.insert_header(http::header::HOST, addr.to_string())
        .ok()?;
    if let Some(auth) = auth {
        req.insert_header(http::header::AUTHORIZATION, auth.clone())
            .ok()?;
    }
    Some(req)
}

/// `POST path` of a JSON body to the backend at `addr`.
pub fn post_json(
    path: &str,
    addr: SocketAddr,
    auth: Option<&HeaderValue>,
) -> Option<RequestHeader> {
    let mut req = get(path, addr, auth)?;
    req.set_method(http::Method::POST);
    req.insert_header(http::header::CONTENT_TYPE, "application/json")
        .ok()?;
    Some(req)
}

/// Send `request` (with `body`, if any) to `peer`: the session with the
/// response header read.
pub async fn send(
    connector: &Connector,
    peer: &HttpPeer,
    mut request: RequestHeader,
    body: Option<String>,
) -> Option<HttpSession> {
    if let Some(body) = &body {
        request
            .insert_header(http::header::CONTENT_LENGTH, body.len())
            .ok()?;
    }
    let (mut session, _) = connector.get_http_session(peer).await.ok()?;
    session.write_request_header(Box::new(request)).await.ok()?;
    if let Some(body) = body {
        session.write_request_body(body.into(), true).await.ok()?;
    }
    session.finish_request_body().await.ok()?;
    session.read_response_header().await.ok()?;
    Some(session)
}

/// Up to `max` bytes of the response body.
pub async fn body(session: &mut HttpSession, max: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = session.read_response_body().await {
        let room = max.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if room == 0 {
            break;
        }
    }
    body
}
