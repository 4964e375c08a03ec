//! vLLM's KV-cache events (`models[].kv_events`): each backend of the model
//! publishes every block it stores and evicts; the gateway subscribes to
//! every backend, off the request path, and keeps the model's prefix index
//! (`routing::index`) to what they say, so that the index knows what each
//! backend holds instead of estimating it.
//!
//! - `wire.rs`: the frames and the msgpack payloads, both event forms;
//! - `feed.rs`: the sequence, its gaps and restarts;
//! - `view.rs`: applying events to the index, vLLM's block names mapped to
//!   the index's own (a chain over the blocks' token ids, which a request's
//!   prompt gets from the model's tokenizer, `crate::prompt`).
//!
//! A backend is subscribed to while it is a member of the model's pool.
//! While its events cannot be trusted (before the first message, after a
//! disconnection or a gap its replay socket could not fill, a restart),
//! what they said is forgotten and the index holds, for that backend, only
//! what the gateway routed there since: the estimate a model without events
//! has. A block routed but not yet confirmed by events counts the same way,
//! so that two turns in quick succession stay together.

mod feed;
pub mod view;
pub mod wire;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use log::{info, warn};
use zeromq::{DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket};

use crate::metrics;
use crate::routing::index::PrefixIndex;
use feed::{Feed, Step};
use view::Holdings;

/// Where one model's backends publish (`models[].kv_events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// Each backend's ports, on the backend's host...
    pub ports: Ports,
    /// ...unless it has its own (several vLLM servers on one host).
    pub own: Vec<(SocketAddr, Ports)>,
    /// vLLM's `--block-size`: the tokens of a block.
    pub block_size: usize,
}

/// A backend's event ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// Its PUB socket's.
    pub port: u16,
    /// Its replay (ROUTER) socket's; none: gaps are not replayed.
    pub replay_port: Option<u16>,
}

impl Endpoints {
    pub fn of(&self, addr: &SocketAddr) -> Ports {
        self.own
            .iter()
            .find(|(a, _)| a == addr)
            .map_or(self.ports, |(_, p)| *p)
    }
}

/// How long connecting, and a whole replay, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Between attempts to reach a publisher that did not answer.
const RETRY: Duration = Duration::from_secs(1);

/// A reply of a replay socket, as a DEALER receives it.
#[derive(Debug, PartialEq)]
pub enum Replayed {
    Message(wire::Message),
    /// Nothing more is buffered.
    End,
}

/// Read a replay reply: `["", topic, seq, payload]`, the end an empty
/// payload with seq -1 (8 bytes 0xff).
pub fn replayed<F: AsRef<[u8]>>(frames: &[F]) -> Option<Replayed> {
    let [empty, topic, seq, payload] = frames else {
        return None;
    };
    if !empty.as_ref().is_empty() {
        return None;
    }
    if wire::seq_of(seq.as_ref()) == Some(u64::MAX) {
        return Some(Replayed::End);
    }
    let frames = [topic.as_ref(), seq.as_ref(), payload.as_ref()];
    wire::decode(&frames).ok().map(Replayed::Message)
}

/// One model's subscriptions: a task per backend, started and stopped as
/// the pool's members change.
pub struct Subscriptions {
    model: Arc<str>,
    endpoints: Endpoints,
    index: Arc<PrefixIndex>,
    /// The blocks one backend may be known to hold at most.
    max_blocks: usize,
    running: HashMap<SocketAddr, tokio::task::JoinHandle<()>>,
}

impl Subscriptions {
    pub fn new(
        model: Arc<str>,
        endpoints: Endpoints,
        index: Arc<PrefixIndex>,
        max_blocks: usize,
    ) -> Self {
        Subscriptions {
            model,
            endpoints,
            index,
            max_blocks,
            running: HashMap::new(),
        }
    }

    /// Subscribe to each of `members` not yet subscribed to; stop the
    /// subscriptions of backends that left.
    pub fn follow(&mut self, members: &[SocketAddr]) {
        self.running.retain(|addr, task| {
            let stays = members.contains(addr);
            if !stays {
                task.abort();
            }
            stays
        });
        for addr in members {
            if !self.running.contains_key(addr) {
                let sub = Subscriber {
                    model: self.model.clone(),
                    label: addr.to_string(),
                    addr: *addr,
                    ports: self.endpoints.of(addr),
                    index: self.index.clone(),
                    holdings: Holdings::new(*addr, self.endpoints.block_size, self.max_blocks),
                    feed: Feed::default(),
                };
                self.running.insert(*addr, tokio::spawn(sub.run()));
            }
        }
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        self.running.values().for_each(|t| t.abort());
    }
}

/// One backend's subscription.
struct Subscriber {
    model: Arc<str>,
    label: String,
    addr: SocketAddr,
    ports: Ports,
    index: Arc<PrefixIndex>,
    holdings: Holdings,
    feed: Feed,
}

impl Subscriber {
    fn endpoint(&self, port: u16) -> String {
        // vLLM binds `tcp://*:port` (an endpoint without `*` makes it
        // connect instead): the gateway connects to the backend's host.
        format!("tcp://{}", SocketAddr::new(self.addr.ip(), port))
    }

    fn connected(&self, up: bool) {
        metrics::KV_EVENTS_CONNECTED
            .with_label_values(&[&*self.model, &self.label])
            .set(up as i64);
    }

    async fn run(mut self) {
        self.connected(false);
        // A publisher that stays away is logged once, not at every retry.
        let mut warned = false;
        loop {
            let mut options = SocketOptions::default();
            options.connect_timeout(CONNECT_TIMEOUT);
            let mut sub = SubSocket::with_options(options);
            let mut monitor = sub.monitor();
            let endpoint = self.endpoint(self.ports.port);
            if let Err(e) = sub.connect(&endpoint).await {
                if !std::mem::replace(&mut warned, true) {
                    warn!("kv events of {} ({endpoint}): {e}; retrying", self.label);
                }
                tokio::time::sleep(RETRY).await;
                continue;
            }
            warned = false;
            if sub.subscribe("").await.is_err() {
                continue;
            }
            info!("kv events of {}: subscribed to {endpoint}", self.label);
            self.connected(true);
            self.feed.reconnected();
            self.catch_up().await;
            loop {
                tokio::select! {
                    message = sub.recv() => match message {
                        Ok(m) => self.received(&m.into_vec()).await,
                        Err(_) => break,
                    },
                    event = monitor.next() => match event {
                        // zeromq reconnects by itself: what was said before
                        // is not known to be true any more.
                        Some(SocketEvent::Disconnected(_)) => self.lost(),
                        Some(SocketEvent::Connected(..)) => {
                            self.connected(true);
                            if !self.feed.started() {
                                self.catch_up().await;
                            }
                        }
                        Some(_) => {}
                        None => break,
                    },
                }
            }
            self.lost();
        }
    }

    /// The connection broke: forget what the events said.
    fn lost(&mut self) {
        self.connected(false);
        self.feed.reconnected();
        self.holdings.clear(&self.index);
    }

    async fn received(&mut self, frames: &[Bytes]) {
        let frames: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
        let message = match wire::decode(&frames) {
            Ok(m) => m,
            Err(e) => {
                self.count_message("malformed");
                warn!("kv events of {}: a message skipped: {e}", self.label);
                return;
            }
        };
        match self.feed.step(message.seq) {
            Step::Skip => return,
            Step::Apply => {}
            Step::Restart => {
                self.gap("restart");
                self.holdings.clear(&self.index);
            }
            Step::Replay { from } => {
                let first = from == 0;
                let covered = self.replay(from, message.seq).await;
                match (covered, first) {
                    (true, false) => self.gap("replayed"),
                    // A gap of a subscription begun: before it, nothing was known.
                    (_, true) => {}
                    (false, false) => {
                        self.gap("lost");
                        self.holdings.clear(&self.index);
                    }
                }
            }
        }
        self.apply(&message);
    }

    /// Ask the replay socket for `[from, until)` and apply it; whether it
    /// covered the whole gap.
    async fn replay(&mut self, from: u64, until: u64) -> bool {
        let mut got = self.replayed_since(from).await;
        got.retain(|m| m.seq < until);
        let unbroken = got.windows(2).all(|w| w[1].seq == w[0].seq + 1)
            && got.last().is_none_or(|m| m.seq + 1 == until);
        let covers = unbroken && feed::replay_covers(from, got.first().map(|m| m.seq), until);
        // A subscription begun takes what history is still buffered.
        if covers || (unbroken && from == 0) {
            got.iter().for_each(|m| self.apply(m));
        }
        covers
    }

    /// Learn what the backend published before this subscription: the
    /// replay socket's whole buffer, its last unbroken run.
    async fn catch_up(&mut self) {
        let got = self.replayed_since(0).await;
        let start = got
            .windows(2)
            .rposition(|w| w[1].seq != w[0].seq + 1)
            .map_or(0, |i| i + 1);
        let run = &got[start..];
        run.iter().for_each(|m| self.apply(m));
        if let Some(last) = run.last() {
            self.feed.replayed(last.seq);
        }
    }

    /// What the replay socket answers from `from` on, in order (none if it
    /// cannot be reached or does not end its answer in time).
    async fn replayed_since(&self, from: u64) -> Vec<wire::Message> {
        let Some(port) = self.ports.replay_port else {
            return Vec::new();
        };
        let endpoint = self.endpoint(port);
        let mut options = SocketOptions::default();
        options.connect_timeout(REPLAY_TIMEOUT);
        let mut dealer = DealerSocket::with_options(options);
        let mut got = Vec::new();
        let asked = async {
            dealer.connect(&endpoint).await.ok()?;
            let ask = vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())];
            dealer.send(ask.try_into().ok()?).await.ok()?;
            loop {
                let reply = dealer.recv().await.ok()?.into_vec();
                match replayed(&reply)? {
                    Replayed::End => return Some(()),
                    Replayed::Message(m) if m.seq >= from => got.push(m),
                    Replayed::Message(_) => {}
                }
            }
        };
        match tokio::time::timeout(REPLAY_TIMEOUT, asked).await {
            Ok(Some(())) => got,
            _ => {
                warn!("kv events of {}: no replay from {endpoint}", self.label);
                Vec::new()
            }
        }
    }

    fn apply(&mut self, message: &wire::Message) {
        self.count_message("applied");
        let mut total = view::Applied::default();
        for event in &message.events {
            let a = self.holdings.apply(&self.index, event);
            total.stored += a.stored;
            total.removed += a.removed;
            total.skipped += a.skipped;
        }
        let blocks = |kind: &str, n: u64| {
            if n > 0 {
                metrics::KV_EVENT_BLOCKS
                    .with_label_values(&[&*self.model, &self.label, kind])
                    .inc_by(n);
            }
        };
        blocks("stored", total.stored);
        blocks("removed", total.removed);
        blocks("skipped", total.skipped);
    }

    fn count_message(&self, result: &str) {
        metrics::KV_EVENT_MESSAGES
            .with_label_values(&[&*self.model, &self.label, result])
            .inc();
    }

    fn gap(&self, result: &str) {
        metrics::KV_EVENT_GAPS
            .with_label_values(&[&*self.model, &self.label, result])
            .inc();
    }
}
