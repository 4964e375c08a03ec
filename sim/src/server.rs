//! Listening socket and connections: accept loop, the `refuse` fault
//! (close the listener, bind the same address again when it ends), and
//! graceful shutdown.
//!
//! Under `refuse` open connections are also shut down gracefully: answers
//! in flight finish, then the connection closes, so a client's pooled
//! keep-alive connections do not hide the outage.

use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::app::App;
use crate::config::FaultMode;
use crate::faults::FaultState;

/// How long shutdown waits for open connections (a hung request never ends).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Binds with SO_REUSEADDR so the address can be bound again right after a
/// `refuse` fault or a restart, despite sockets in TIME_WAIT.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Serves until `shutdown` turns true, then drains connections.
pub async fn run(app: Arc<App>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let addr = listener
        .local_addr()
        .expect("bound listener has an address");
    let mut faults = app.faults.subscribe();
    // Each connection task holds a clone; recv() returns None once all end.
    let (conn_alive, mut conns_done) = mpsc::channel::<()>(1);
    // Template receiver for connection tasks (the loop borrows `shutdown`).
    let conn_shutdown = shutdown.clone();
    let mut listener = Some(listener);
    loop {
        let Some(l) = listener.take() else {
            // Refusing: wait for the fault to end, then bind again.
            tokio::select! {
                _ = fault_is(&mut faults, false) => {}
                _ = stopped(&mut shutdown) => break,
            }
            listener = rebind(addr, &mut shutdown).await;
            if listener.is_none() {
                break;
            }
            log::info!("listening again on {addr}");
            continue;
        };
        if faults.borrow_and_update().mode == FaultMode::Refuse {
            log::info!("fault refuse: closing listener on {addr}");
            drop(l);
            continue;
        }
        tokio::select! {
            r = l.accept() => {
                match r {
                    Ok((stream, _)) => spawn_conn(&app, stream, conn_alive.clone(), conn_shutdown.clone()),
                    Err(e) => {
                        // E.g. out of file descriptors: back off, do not spin.
                        log::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                listener = Some(l);
            }
            _ = faults.changed() => listener = Some(l),
            _ = stopped(&mut shutdown) => break,
        }
    }
    drop(listener);
    drop(conn_alive);
    if tokio::time::timeout(DRAIN_TIMEOUT, conns_done.recv())
        .await
        .is_err()
    {
        log::warn!("shutdown: connections still open after {DRAIN_TIMEOUT:?}, exiting anyway");
    }
}

/// Binds `addr` again, retrying while the port is still busy.
async fn rebind(addr: SocketAddr, shutdown: &mut watch::Receiver<bool>) -> Option<TcpListener> {
    loop {
        match bind(addr) {
            Ok(l) => return Some(l),
            Err(e) => log::warn!("re-bind {addr} failed: {e}; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stopped(shutdown) => return None,
        }
    }
}

fn spawn_conn(
    app: &Arc<App>,
    stream: TcpStream,
    alive: mpsc::Sender<()>,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true); // SSE events are small; send them now.
    let app = Arc::clone(app);
    let mut faults = app.faults.subscribe();
    tokio::spawn(async move {
        let _alive = alive;
        let svc = service_fn(move |req| crate::api::handle(Arc::clone(&app), req));
        let mut conn = pin!(http1::Builder::new().serve_connection(TokioIo::new(stream), svc));
        let mut closing = false;
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        log::debug!("connection ended: {e}");
                    }
                    break;
                }
                _ = close_requested(&mut faults, &mut shutdown), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    });
}

/// Resolves when this connection should close: `refuse` fault or shutdown.
async fn close_requested(
    faults: &mut watch::Receiver<FaultState>,
    shutdown: &mut watch::Receiver<bool>,
) {
    tokio::select! {
        _ = fault_is(faults, true) => {}
        _ = stopped(shutdown) => {}
    }
}

/// Resolves once the fault mode is (`refusing`) or is not (`!refusing`)
/// `refuse`. Never resolves if the sender is gone (process exit).
async fn fault_is(faults: &mut watch::Receiver<FaultState>, refusing: bool) {
    // The watch `Ref` is dropped inside this statement: it must not be held
    // across an await (it is not Send).
    let ok = faults
        .wait_for(|f| (f.mode == FaultMode::Refuse) == refusing)
        .await
        .is_ok();
    if !ok {
        std::future::pending::<()>().await;
    }
}

/// Resolves once shutdown was requested (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await.is_ok();
}
