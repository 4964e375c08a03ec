//! A fake vLLM backend on 127.0.0.1: records what it receives, answers as
//! told (JSON, an SSE stream with gaps, after a delay), and can be stopped
//! and restarted on the same port to simulate a crash. It speaks plain HTTP,
//! or HTTPS with a given certificate (`start_tls`).

use std::convert::Infallible;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// One request as the backend saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// How the backend answers.
#[derive(Clone, Debug)]
pub enum Reply {
    /// `{"backend": <addr>, "model": <model of the body>}`.
    Echo,
    /// Server-sent events, one per string, `gap` apart, then `data: [DONE]`.
    /// Like vLLM, `usage` (a final chunk) is sent only to a request with
    /// `stream_options.include_usage`.
    Sse {
        events: Vec<String>,
        gap: Duration,
        usage: Option<String>,
    },
    /// A fixed JSON body with extra headers.
    Json {
        body: String,
        headers: Vec<(&'static str, String)>,
    },
}

impl Reply {
    /// A stream of `events`, `gap` apart, without usage.
    pub fn sse(events: Vec<String>, gap: Duration) -> Reply {
        Reply::Sse {
            events,
            gap,
            usage: None,
        }
    }
}

struct State {
    addr: SocketAddr,
    seen: Mutex<Vec<Seen>>,
    reply: Mutex<Reply>,
    delay: Mutex<Duration>,
    inflight: AtomicUsize,
    max_inflight: AtomicUsize,
    /// When each SSE event was written, for streaming assertions.
    sent_at: Mutex<Vec<Instant>>,
    /// Bytes written to its connections, as the sockets took them.
    written: AtomicU64,
}

pub struct FakeBackend {
    pub addr: SocketAddr,
    state: Arc<State>,
    tasks: Option<JoinSet<()>>,
    tls: Option<TlsAcceptor>,
}

impl FakeBackend {
    pub async fn start() -> Self {
        FakeBackend::start_with(SocketAddr::from(([127, 0, 0, 1], 0)), None).await
    }

    /// On `addr`: another loopback IP, or a port already used on another
    /// IP (the backends of one DNS name share a port).
    pub async fn start_on(addr: SocketAddr) -> Self {
        FakeBackend::start_with(addr, None).await
    }

    /// An HTTPS backend serving `config`'s certificate.
    pub async fn start_tls(config: Arc<ServerConfig>) -> Self {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        FakeBackend::start_with(loopback, Some(TlsAcceptor::from(config))).await
    }

    async fn start_with(addr: SocketAddr, tls: Option<TlsAcceptor>) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            addr,
            seen: Mutex::default(),
            reply: Mutex::new(Reply::Echo),
            delay: Mutex::default(),
            inflight: AtomicUsize::new(0),
            max_inflight: AtomicUsize::new(0),
            sent_at: Mutex::default(),
            written: AtomicU64::new(0),
        });
        let mut backend = FakeBackend {
            addr,
            state,
            tasks: None,
            tls,
        };
        backend.serve(listener);
        backend
    }

    fn serve(&mut self, listener: TcpListener) {
        let mut tasks = JoinSet::new();
        let (state, tls) = (self.state.clone(), self.tls.clone());
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (state, tls) = (state.clone(), tls.clone());
                conns.spawn(async move {
                    match tls {
                        // A failed handshake (e.g. a client that does not
                        // trust the certificate) never reaches `handle`.
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(stream).await {
                                serve_connection(stream, state).await;
                            }
                        }
                        None => serve_connection(stream, state).await,
                    }
                });
            }
        });
        self.tasks = Some(tasks);
    }

    /// Crash: close the listener and every open connection.
    pub fn stop(&mut self) {
        self.tasks = None;
    }

    /// Come back on the same port.
    pub async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    pub fn set_reply(&self, reply: Reply) {
        *self.state.reply.lock().unwrap() = reply;
    }

    pub fn set_delay(&self, delay: Duration) {
        *self.state.delay.lock().unwrap() = delay;
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }

    pub fn inflight(&self) -> usize {
        self.state.inflight.load(Ordering::SeqCst)
    }

    pub fn max_inflight(&self) -> usize {
        self.state.max_inflight.load(Ordering::SeqCst)
    }

    /// Start counting `max_inflight` afresh.
    pub fn reset_max_inflight(&self) {
        self.state.max_inflight.store(0, Ordering::SeqCst);
    }

    pub fn sent_at(&self) -> Vec<Instant> {
        self.state.sent_at.lock().unwrap().clone()
    }

    /// The bytes written to its connections once writing has stopped (the
    /// same count twice, 200 ms apart): what the other side took before it
    /// stopped taking more.
    pub async fn written_when_stalled(&self) -> u64 {
        let read = || self.state.written.load(Ordering::SeqCst);
        let mut last = read();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = read();
            if now == last {
                return now;
            }
            last = now;
        }
        panic!("the backend was still writing after 20 s ({last} bytes)");
    }
}

async fn serve_connection<S>(stream: S, state: Arc<State>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let counted = Counted {
        inner: stream,
        state: state.clone(),
    };
    let svc = service_fn(move |req| handle(state.clone(), req));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(counted), svc)
        .await;
}

/// A connection that counts what the backend writes to it.
struct Counted<S> {
    inner: S,
    state: Arc<State>,
}

impl<S> Counted<S> {
    fn count(&self, written: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = written {
            self.state.written.fetch_add(*n as u64, Ordering::SeqCst);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.count(&written);
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.count(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Counts a request in flight until dropped (also when the client leaves).
struct InFlight(Arc<State>);

impl InFlight {
    fn new(state: Arc<State>) -> Self {
        let now = state.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_inflight.fetch_max(now, Ordering::SeqCst);
        InFlight(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let guard = InFlight::new(state.clone());
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    state.seen.lock().unwrap().push(Seen {
        path: parts.uri.path().to_string(),
        headers: parts.headers,
        body: body.clone(),
    });
    let delay = *state.delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    let reply = state.reply.lock().unwrap().clone();
    let response = match reply {
        Reply::Echo => {
            let model = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["model"].as_str().map(String::from));
            let json = serde_json::json!({"backend": state.addr.to_string(), "model": model});
            drop(guard);
            Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(json.to_string())).boxed())
                .unwrap()
        }
        Reply::Json { body, headers } => {
            drop(guard);
            let mut resp = Response::builder().header("content-type", "application/json");
            for (k, v) in headers {
                resp = resp.header(k, v);
            }
            resp.body(Full::new(Bytes::from(body)).boxed()).unwrap()
        }
        Reply::Sse { events, gap, usage } => {
            let asked = serde_json::from_slice::<serde_json::Value>(&body)
                .is_ok_and(|v| v["stream_options"]["include_usage"] == true);
            let mut chunks: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
            if let (true, Some(u)) = (asked, usage) {
                chunks.push(format!("data: {u}\n\n"));
            }
            chunks.push("data: [DONE]\n\n".into());
            // The in-flight guard lives as long as the stream does.
            let frames = futures::stream::unfold(
                (chunks.into_iter().enumerate(), state.clone(), guard),
                move |(mut it, state, guard)| async move {
                    let (i, chunk) = it.next()?;
                    if i > 0 {
                        tokio::time::sleep(gap).await;
                    }
                    state.sent_at.lock().unwrap().push(Instant::now());
                    let frame = Ok::<_, Infallible>(Frame::data(Bytes::from(chunk)));
                    Some((frame, (it, state, guard)))
                },
            );
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(BodyExt::boxed(StreamBody::new(frames)))
                .unwrap()
        }
    };
    Ok(response)
}
