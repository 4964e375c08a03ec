//! An OTLP/HTTP trace receiver on 127.0.0.1: decodes what arrives on
//! `POST /v1/traces` with the protocol's own generated types and keeps the
//! spans; or takes requests and never answers (a stalled collector).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// A span as received, with its resource's attributes.
#[derive(Clone, Debug)]
pub struct Received {
    pub span: Span,
    pub resource: BTreeMap<String, Value>,
}

impl Received {
    /// Its attributes, values as JSON (strings, numbers, booleans).
    pub fn attributes(&self) -> BTreeMap<String, Value> {
        attributes(&self.span.attributes)
    }

    /// Its events: name and attributes.
    pub fn events(&self) -> Vec<(String, BTreeMap<String, Value>)> {
        let events = self.span.events.iter();
        events
            .map(|e| (e.name.clone(), attributes(&e.attributes)))
            .collect()
    }
}

#[derive(Default)]
struct State {
    spans: Mutex<Vec<Received>>,
    /// Content types of the posts, and their paths.
    posts: Mutex<Vec<(String, String)>>,
}

pub struct Collector {
    pub addr: SocketAddr,
    state: Arc<State>,
    _tasks: JoinSet<()>,
}

impl Collector {
    /// A collector that answers every export with success.
    pub async fn start() -> Collector {
        Collector::start_with(false).await
    }

    /// A collector that reads each export and never answers.
    pub async fn start_stalled() -> Collector {
        Collector::start_with(true).await
    }

    async fn start_with(stall: bool) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let mut tasks = JoinSet::new();
        let shared = state.clone();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| handle(state.clone(), stall, req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Collector {
            addr,
            state,
            _tasks: tasks,
        }
    }

    /// Its base URL, as `gateway.tracing.otlp_endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<Received> {
        self.state.spans.lock().unwrap().clone()
    }

    /// Paths and content types of every export received.
    pub fn posts(&self) -> Vec<(String, String)> {
        self.state.posts.lock().unwrap().clone()
    }

    /// The spans once `n` have arrived (10 s at most).
    pub async fn wait_for(&self, n: usize) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} spans arrived",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn handle(
    state: Arc<State>,
    stall: bool,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let content_type = parts
        .headers
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    state.posts.lock().unwrap().push((path, content_type));
    if stall {
        std::future::pending::<()>().await;
    }
    let export = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf trace export");
    let mut received = Vec::new();
    for resource_spans in export.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let resource = resource.clone();
                received.push(Received { span, resource });
            }
        }
    }
    state.spans.lock().unwrap().extend(received);
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    Ok(Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(answer)))
        .unwrap())
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, Value> {
    let value = |v: &Any| match v {
        Any::StringValue(s) => Value::from(s.clone()),
        Any::IntValue(i) => Value::from(*i),
        Any::DoubleValue(d) => Value::from(*d),
        Any::BoolValue(b) => Value::from(*b),
        other => Value::from(format!("{other:?}")),
    };
    kvs.iter()
        .filter_map(|kv| {
            let v = kv.value.as_ref()?.value.as_ref()?;
            Some((kv.key.clone(), value(v)))
        })
        .collect()
}

/// Bytes as lowercase hex, as in `traceparent`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
