//! Answering the client from the gateway itself, and why a request stops.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

use crate::errors::{json_header, ApiError};

/// Why a request goes no further.
#[derive(Debug)]
pub enum Stop {
    /// The gateway answers with this error.
    Answer(ApiError),
    /// The client went away or stalled: no response is owed.
    ClientGone(Box<pingora::Error>),
}

impl From<ApiError> for Stop {
    fn from(e: ApiError) -> Self {
        Stop::Answer(e)
    }
}

pub async fn respond(session: &mut Session, (header, body): (ResponseHeader, Bytes)) {
    // A client that is gone cannot be answered; nothing else to do.
    if session
        .write_response_header(Box::new(header), false)
        .await
        .is_ok()
    {
        let _ = session.write_response_body(Some(body), true).await;
    }
}

pub async fn respond_json(session: &mut Session, status: u16, value: serde_json::Value) {
    let body = Bytes::from(value.to_string());
    respond(session, (json_header(status, body.len()), body)).await;
}

/// Run `fut` unless the client disconnects first. The body has been read,
/// so the only thing the client can still send is its FIN.
pub async fn until_client_leaves<F: std::future::Future>(
    session: &mut Session,
    fut: F,
) -> Result<F::Output, Stop> {
    tokio::select! {
        out = fut => Ok(out),
        gone = session.downstream_session.read_body_or_idle(true) => Err(Stop::ClientGone(match gone {
            Err(e) => e,
            Ok(_) => pingora::Error::explain(
                pingora::ErrorType::ConnectionClosed,
                "client sent data while its request waited",
            ),
        })),
    }
}
