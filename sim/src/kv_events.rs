//! KV-cache events, published as vLLM 0.32 does (`--kv-events-port`), so a
//! gateway can route by what this simulator caches. The wire format is the
//! one captured from a real vLLM in tests/data/kv_events/README.md:
//!
//! ```text
//! PUB:    [topic, seq (u64 BE, from 0, +1 a message), payload]
//!         payload = msgpack [ts (f64), [event map...], 0]
//! ROUTER: [id, "", start seq] -> [id, "", topic, seq, payload] for each
//!         buffered message with seq >= start, then [id, "", "", ff*8, ""]
//! ```
//!
//! A message is one "engine step": one request's prompt blocks going into
//! the cache (removals first, as vLLM evicts before it stores), or nothing
//! if nothing changed. A reset is announced, as in vLLM, by an
//! AllBlocksCleared at the head of the next message.
//!
//! Token ids: one per prompt byte (the byte-level model of
//! bench/vllm-real/make_model.py), so a block of `block_size` simulated
//! tokens carries `block_size * BYTES_PER_TOKEN` ids and says that block
//! size; a gateway with the byte tokenizer and that block size then names
//! the blocks of a request the way these events do.
//!
//! Events are made under the cache lock, so they come in the cache's order,
//! and handed to one socket task over a bounded channel: a slow subscriber
//! never delays a request; when the channel is full the batch is dropped
//! and counted.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::mpsc;
use zeromq::{Endpoint, PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::cache::PrefixCache;
use crate::config::Args;
use crate::tokenize::BYTES_PER_TOKEN;

/// Batches waiting for the socket task before new ones are dropped.
const QUEUE: usize = 4096;
/// Messages kept for replay (vLLM's `buffer_steps` default).
const REPLAY_BUFFER: usize = 10_000;
/// The seq frame of the replay's end marker (-1 as a signed int).
const END_SEQ: [u8; 8] = [0xff; 8];

/// One event, a msgpack map with "type" first and the fields in vLLM's
/// declaration order (`vllm/distributed/kv_events.py`).
#[derive(Serialize, Debug)]
#[serde(tag = "type")]
enum Event {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u8>,
        block_size: usize,
        lora_id: Option<u32>,
        medium: &'static str,
        lora_name: Option<String>,
        /// nil per block: no cache salt, no images.
        extra_keys: Vec<()>,
        group_idx: u32,
        kv_cache_spec_kind: &'static str,
    },
    /// One event per block, as vLLM sends them.
    BlockRemoved {
        block_hashes: [u64; 1],
        medium: &'static str,
        group_idx: u32,
    },
    AllBlocksCleared,
}

struct Batch {
    ts: f64,
    events: Vec<Event>,
}

/// What changed in the cache since the last batch, beyond one insert.
#[derive(Debug, Default)]
struct State {
    /// A reset not yet announced.
    cleared: bool,
    /// Cached blocks never announced: a last block that ends in a partial
    /// token has fewer bytes than a block, so vLLM would not publish it
    /// either; its eviction is then not announced.
    unannounced: HashSet<u64>,
}

/// The producer side, called with the cache locked.
#[derive(Debug)]
pub struct Publisher {
    tx: mpsc::Sender<Batch>,
    block_size: usize,
    state: Mutex<State>,
    /// Batches dropped because the socket task fell behind.
    pub dropped: AtomicU64,
}

/// Where the sockets were bound (port 0 resolved).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub events: SocketAddr,
    pub replay: Option<SocketAddr>,
}

/// Binds the sockets the flags ask for and starts their tasks; `None`
/// without `--kv-events-port`.
pub async fn start(a: &Args) -> Result<Option<(Publisher, Bound)>, String> {
    let Some(port) = a.kv_events_port else {
        return Ok(None);
    };
    let mut publisher = PubSocket::new();
    let events = bind(&mut publisher, a, port).await?;
    let replay = match a.kv_replay_port {
        Some(port) => {
            let mut router = RouterSocket::new();
            Some((bind(&mut router, a, port).await?, router))
        }
        None => None,
    };
    let buffer = Arc::new(Mutex::new(VecDeque::new()));
    let (tx, rx) = mpsc::channel(QUEUE);
    let topic = Bytes::from(a.kv_events_topic.clone().into_bytes());
    tokio::spawn(publish(publisher, rx, topic, Arc::clone(&buffer)));
    let bound = Bound {
        events,
        replay: replay.as_ref().map(|(addr, _)| *addr),
    };
    if let Some((_, router)) = replay {
        tokio::spawn(serve_replay(router, buffer));
    }
    let p = Publisher {
        tx,
        block_size: a.block_size as usize * BYTES_PER_TOKEN,
        state: Mutex::default(),
        dropped: AtomicU64::new(0),
    };
    Ok(Some((p, bound)))
}

/// Binds `tcp://<listen host>:port`, as vLLM binds `tcp://*:port`.
async fn bind(s: &mut impl Socket, a: &Args, port: u16) -> Result<SocketAddr, String> {
    let want = SocketAddr::new(a.listen.ip(), port);
    match s.bind(&format!("tcp://{want}")).await {
        Ok(Endpoint::Tcp(_, port)) => Ok(SocketAddr::new(want.ip(), port)),
        Ok(other) => Err(format!("bound {other}, not TCP")),
        Err(e) => Err(format!("cannot bind the KV events socket on {want}: {e}")),
    }
}

impl Publisher {
    /// Inserts a request's blocks (`hashes`, over `prompt`'s bytes) into
    /// `cache` and publishes the blocks it evicted and the ones it newly
    /// stored; a reused prefix is not announced again.
    pub fn insert(
        &self,
        cache: &mut PrefixCache,
        hashes: &[u64],
        prompt: &[u8],
        lora_name: Option<&str>,
    ) {
        let fresh: Vec<bool> = hashes.iter().map(|&h| !cache.contains(h)).collect();
        let evicted = cache.insert(hashes);
        let mut state = self.state.lock().expect("kv events lock");
        let mut events = Vec::new();
        if std::mem::take(&mut state.cleared) {
            events.push(Event::AllBlocksCleared);
        }
        // A block stored and evicted by this very insert (a chain longer
        // than the cache) was never announced, so neither is its removal.
        let just_stored: HashSet<u64> = if evicted.is_empty() {
            HashSet::new()
        } else {
            hashes
                .iter()
                .zip(&fresh)
                .filter(|p| *p.1)
                .map(|p| *p.0)
                .collect()
        };
        for h in evicted {
            if !just_stored.contains(&h) && !state.unannounced.remove(&h) {
                events.push(removed(h));
            }
        }
        // Runs of consecutive new full blocks, each one BlockStored.
        let mut run: Option<usize> = None;
        for i in 0..=hashes.len() {
            let new = i < hashes.len() && fresh[i] && cache.contains(hashes[i]);
            let full = (i + 1) * self.block_size <= prompt.len();
            if new && !full {
                state.unannounced.insert(hashes[i]);
            }
            match (run, new && full) {
                (None, true) => run = Some(i),
                (Some(start), false) => {
                    events.push(self.stored(hashes, prompt, start..i, lora_name));
                    run = None;
                }
                _ => {}
            }
        }
        drop(state);
        self.send(events);
    }

    /// Empties `cache`; the next batch starts with AllBlocksCleared.
    pub fn clear(&self, cache: &mut PrefixCache) {
        cache.clear();
        let mut state = self.state.lock().expect("kv events lock");
        state.cleared = true;
        state.unannounced.clear();
    }

    fn stored(
        &self,
        hashes: &[u64],
        prompt: &[u8],
        blocks: std::ops::Range<usize>,
        lora_name: Option<&str>,
    ) -> Event {
        let bytes = blocks.start * self.block_size..blocks.end * self.block_size;
        Event::BlockStored {
            parent_block_hash: blocks.start.checked_sub(1).map(|p| hashes[p]),
            extra_keys: vec![(); blocks.len()],
            block_hashes: hashes[blocks].to_vec(),
            token_ids: prompt[bytes].to_vec(),
            block_size: self.block_size,
            lora_id: None,
            medium: "GPU",
            lora_name: lora_name.map(str::to_owned),
            group_idx: 0,
            kv_cache_spec_kind: "full_attention",
        }
    }

    fn send(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(Batch { ts, events }) {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            log::warn!("KV events: socket task behind, batch dropped ({n} so far)");
        }
    }
}

fn removed(hash: u64) -> Event {
    Event::BlockRemoved {
        block_hashes: [hash],
        medium: "GPU",
        group_idx: 0,
    }
}

/// The frames of one message: topic, seq, payload.
type Frames = [Bytes; 3];

/// Numbers, encodes and sends each batch, keeping the last ones for replay.
async fn publish(
    mut socket: PubSocket,
    mut rx: mpsc::Receiver<Batch>,
    topic: Bytes,
    buffer: Arc<Mutex<VecDeque<(u64, Frames)>>>,
) {
    let mut seq = 0u64;
    while let Some(b) = rx.recv().await {
        let payload = match rmp_serde::to_vec_named(&(b.ts, &b.events, 0u32)) {
            Ok(p) => p,
            Err(e) => {
                log::error!("KV events: cannot encode a batch: {e}");
                continue;
            }
        };
        let frames: Frames = [
            topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ];
        {
            let mut buf = buffer.lock().expect("replay buffer lock");
            if buf.len() == REPLAY_BUFFER {
                buf.pop_front();
            }
            buf.push_back((seq, frames.clone()));
        }
        seq += 1;
        if let Err(e) = socket.send(message(frames.to_vec())).await {
            log::warn!("KV events: publish failed: {e}");
        }
    }
}

/// Answers replay requests from the buffer.
async fn serve_replay(mut socket: RouterSocket, buffer: Arc<Mutex<VecDeque<(u64, Frames)>>>) {
    loop {
        let req = match socket.recv().await {
            Ok(m) => m.into_vec(),
            Err(e) => {
                log::warn!("KV events replay: receive failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // vLLM reads [identity, "", start] and ignores anything else.
        let start = match req.as_slice() {
            [_, empty, start] if empty.is_empty() => <[u8; 8]>::try_from(&start[..]).ok(),
            _ => None,
        };
        let Some(start) = start.map(u64::from_be_bytes) else {
            log::warn!("KV events replay: ignoring a {}-frame request", req.len());
            continue;
        };
        let replies: Vec<Frames> = {
            let buf = buffer.lock().expect("replay buffer lock");
            let from = buf.partition_point(|(s, _)| *s < start);
            buf.range(from..).map(|(_, f)| f.clone()).collect()
        };
        let end: Frames = [Bytes::new(), Bytes::from_static(&END_SEQ), Bytes::new()];
        for frames in replies.into_iter().chain([end]) {
            let mut reply = vec![req[0].clone(), Bytes::new()];
            reply.extend(frames);
            if let Err(e) = socket.send(message(reply)).await {
                log::debug!("KV events replay: client gone: {e}");
                break;
            }
        }
    }
}

fn message(frames: Vec<Bytes>) -> ZmqMessage {
    ZmqMessage::try_from(frames).expect("a message has frames")
}

#[cfg(test)]
mod tests {
    use std::fmt;
    use std::time::Duration;

    use serde::de::{Deserializer, MapAccess, Visitor};
    use serde::Deserialize;
    use serde_json::{json, Value};
    use zeromq::{DealerSocket, SubSocket};

    use super::*;
    use crate::conversation::{render, Turn};
    use crate::testkit::{self, Sim};
    use crate::tokenize::block_hashes;

    const STORED_KEYS: [&str; 11] = [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
    ];
    const REMOVED_KEYS: [&str; 4] = ["type", "block_hashes", "medium", "group_idx"];

    /// An event map with its keys in wire order.
    #[derive(Debug)]
    struct Ordered(Vec<(String, Value)>);

    impl Ordered {
        fn keys(&self) -> Vec<&str> {
            self.0.iter().map(|(k, _)| k.as_str()).collect()
        }
        fn get(&self, key: &str) -> &Value {
            let v = self.0.iter().find(|(k, _)| k == key);
            &v.unwrap_or_else(|| panic!("no {key} in {self:?}")).1
        }
        fn kind(&self) -> &str {
            self.get("type").as_str().unwrap()
        }
    }

    impl<'de> Deserialize<'de> for Ordered {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Ordered;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("an event map")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Ordered, A::Error> {
                    let mut out = Vec::new();
                    while let Some(kv) = m.next_entry()? {
                        out.push(kv);
                    }
                    Ok(Ordered(out))
                }
            }
            d.deserialize_map(V)
        }
    }

    /// The events of a payload, checking the envelope `[ts, events, 0]`.
    fn events(payload: &[u8]) -> Vec<Ordered> {
        let (ts, events, rank): (f64, Vec<Ordered>, u32) = rmp_serde::from_slice(payload).unwrap();
        assert!(ts > 1.7e9, "{ts}");
        assert_eq!(rank, 0);
        events
    }

    async fn start(flags: &[&str]) -> (Sim, SubSocket) {
        let mut argv = vec!["--kv-events-port", "0"];
        argv.extend_from_slice(flags);
        let sim = testkit::start(&argv).await;
        let mut sub = SubSocket::new();
        let addr = sim.kv.unwrap().events;
        sub.connect(&format!("tcp://{addr}")).await.unwrap();
        sub.subscribe("").await.unwrap();
        // The subscription reaches the PUB side asynchronously.
        tokio::time::sleep(Duration::from_millis(300)).await;
        (sim, sub)
    }

    /// The next message's frames.
    async fn next(sub: &mut SubSocket) -> Vec<Bytes> {
        let m = tokio::time::timeout(Duration::from_secs(5), sub.recv());
        m.await.expect("a message in time").unwrap().into_vec()
    }

    fn seq(frame: &Bytes) -> u64 {
        u64::from_be_bytes(frame[..].try_into().unwrap())
    }

    async fn complete(sim: &Sim, prompt: &str) {
        let body = json!({"prompt": prompt, "max_tokens": 2}).to_string();
        assert_eq!(sim.post("/v1/completions", &body).await.status, 200);
    }

    fn hashes(v: &Value) -> Vec<u64> {
        serde_json::from_value(v.clone()).unwrap()
    }

    #[tokio::test]
    async fn chat_turns_publish_their_new_blocks_as_the_cache_holds_them() {
        let (sim, mut sub) = start(&[
            "--block-size",
            "4",
            "--kv-events-topic",
            "kv",
            "--lora-modules",
            "a=/a",
        ])
        .await;
        let system = "s".repeat(106);
        let mut turns = vec![
            Turn::new("system", &system),
            Turn::new("user", "hello there"),
        ];
        let chat = |turns: &[Turn], model: &str| {
            let messages: Vec<Value> = turns
                .iter()
                .map(|t| json!({"role": t.role, "content": t.text}))
                .collect();
            json!({"model": model, "messages": messages, "max_tokens": 2}).to_string()
        };
        sim.post("/v1/chat/completions", &chat(&turns, "sim-model"))
            .await;
        // 131 bytes: 8 full blocks of 16 bytes (4 tokens of 4 bytes).
        let first = render(&[], &turns);
        assert_eq!(first.len(), 131);
        let m = next(&mut sub).await;
        assert_eq!(m.len(), 3);
        assert_eq!((&m[0][..], seq(&m[1])), (&b"kv"[..], 0));
        let ev = events(&m[2]);
        assert_eq!(ev.len(), 1);
        let s = &ev[0];
        assert_eq!(s.keys(), STORED_KEYS);
        assert_eq!(s.kind(), "BlockStored");
        let first_hashes = block_hashes(0, &first, 4);
        assert_eq!(first_hashes.len(), 8);
        assert_eq!(hashes(s.get("block_hashes")), first_hashes);
        assert_eq!(s.get("parent_block_hash"), &Value::Null);
        assert_eq!(s.get("token_ids"), &json!(first.as_bytes()[..128]));
        assert_eq!(s.get("block_size"), 16);
        assert_eq!(s.get("lora_id"), &Value::Null);
        assert_eq!(s.get("medium"), "GPU");
        assert_eq!(s.get("lora_name"), &Value::Null);
        assert_eq!(s.get("extra_keys"), &json!(vec![Value::Null; 8]));
        assert_eq!(s.get("group_idx"), 0);
        assert_eq!(s.get("kv_cache_spec_kind"), "full_attention");

        // The same prompt again stores nothing; the next turn only its new
        // blocks, chained to the last one already announced.
        sim.post("/v1/chat/completions", &chat(&turns, "sim-model"))
            .await;
        turns.push(Turn::new("assistant", " tok tok"));
        turns.push(Turn::new("user", "and a second question, please"));
        sim.post("/v1/chat/completions", &chat(&turns, "sim-model"))
            .await;
        let second = render(&[], &turns);
        let all = block_hashes(0, &second, 4);
        let m = next(&mut sub).await;
        assert_eq!(seq(&m[1]), 1);
        let ev = events(&m[2]);
        assert_eq!(ev.len(), 1);
        assert_eq!(hashes(ev[0].get("block_hashes")), all[8..]);
        assert_eq!(ev[0].get("parent_block_hash"), &json!(first_hashes[7]));
        let n = all.len() * 16;
        assert!(n <= second.len(), "no short last block here");
        assert_eq!(ev[0].get("token_ids"), &json!(second.as_bytes()[128..n]));

        // An adapter's blocks: its own chain, its name.
        sim.post("/v1/chat/completions", &chat(&turns, "a")).await;
        let ev = events(&next(&mut sub).await[2]);
        assert_eq!(ev[0].get("lora_name"), "a");
        assert_eq!(ev[0].get("parent_block_hash"), &Value::Null);
        assert_eq!(hashes(ev[0].get("block_hashes")).len(), all.len());
        assert!(hashes(ev[0].get("block_hashes"))
            .iter()
            .all(|h| !all.contains(h)));
    }

    #[tokio::test]
    async fn evictions_come_first_one_block_each() {
        // Room for 2 blocks of 4 tokens.
        let (sim, mut sub) = start(&["--block-size", "4", "--kv-cache-tokens", "8"]).await;
        let (a, b) = ("a".repeat(32), "b".repeat(32));
        complete(&sim, &a).await;
        complete(&sim, &b).await;
        let _ = next(&mut sub).await;
        let ev = events(&next(&mut sub).await[2]);
        let kinds: Vec<&str> = ev.iter().map(Ordered::kind).collect();
        assert_eq!(kinds, ["BlockRemoved", "BlockRemoved", "BlockStored"]);
        // The tail goes first, as vLLM frees a request's blocks.
        let a_hashes = block_hashes(0, &a, 4);
        for (e, h) in ev.iter().zip(a_hashes.iter().rev()) {
            assert_eq!(e.keys(), REMOVED_KEYS);
            assert_eq!(e.get("block_hashes"), &json!([h]));
            assert_eq!(
                (e.get("medium"), e.get("group_idx")),
                (&json!("GPU"), &json!(0))
            );
        }
        assert_eq!(hashes(ev[2].get("block_hashes")), block_hashes(0, &b, 4));
    }

    #[tokio::test]
    async fn a_reset_is_announced_at_the_head_of_the_next_batch() {
        let (sim, mut sub) = start(&["--block-size", "4"]).await;
        let p = "p".repeat(40);
        complete(&sim, &p).await;
        let before = events(&next(&mut sub).await[2]);
        assert_eq!(sim.metric("sim_kv_events_dropped_total").await, 0);
        let r = sim.post("/reset_prefix_cache", "").await;
        assert_eq!((r.status, r.json()), (200, json!({"success": true})));
        complete(&sim, &p).await;
        let m = next(&mut sub).await;
        assert_eq!(seq(&m[1]), 1);
        let ev = events(&m[2]);
        assert_eq!(ev[0].keys(), ["type"]);
        assert_eq!(ev[0].kind(), "AllBlocksCleared");
        // The same blocks again, stored from scratch.
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[1].get("block_hashes"), before[0].get("block_hashes"));
        assert_eq!(ev[1].get("parent_block_hash"), &Value::Null);
    }

    #[tokio::test]
    async fn replay_answers_from_a_seq_then_ends_with_the_marker() {
        let (sim, mut sub) = start(&["--kv-replay-port", "0"]).await;
        let mut published = Vec::new();
        for c in ["x", "y", "z"] {
            complete(&sim, &c.repeat(64)).await;
            published.push(next(&mut sub).await);
        }
        let mut dealer = DealerSocket::new();
        let addr = sim.kv.unwrap().replay.unwrap();
        dealer.connect(&format!("tcp://{addr}")).await.unwrap();
        let ask = vec![Bytes::new(), Bytes::copy_from_slice(&1u64.to_be_bytes())];
        dealer.send(message(ask)).await.unwrap();
        for want in &published[1..] {
            let got = dealer.recv().await.unwrap().into_vec();
            // Byte for byte the PUB message, after the empty delimiter.
            assert_eq!((&got[0][..], &got[1..]), (&b""[..], &want[..]));
        }
        let end = dealer.recv().await.unwrap().into_vec();
        assert_eq!(end, [&b""[..], b"", &END_SEQ, b""]);
    }

    /// The messages of a fixture file: per message a u32 BE frame count,
    /// per frame a u32 BE length and the bytes.
    fn fixture(name: &str) -> Vec<Vec<Vec<u8>>> {
        let path = format!(
            "{}/../tests/data/kv_events/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let data = std::fs::read(path).unwrap();
        let u32_at = |at: usize| u32::from_be_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        let (mut at, mut out) = (0, Vec::new());
        while at < data.len() {
            let frames = u32_at(at);
            at += 4;
            let mut msg = Vec::new();
            for _ in 0..frames {
                let n = u32_at(at);
                msg.push(data[at + 4..at + 4 + n].to_vec());
                at += 4 + n;
            }
            out.push(msg);
        }
        out
    }

    fn field<T: serde::de::DeserializeOwned>(e: &Ordered, key: &str) -> T {
        serde_json::from_value(e.get(key).clone()).unwrap()
    }

    /// Our encoding of what a real vLLM 0.32 sent is the bytes it sent.
    #[test]
    fn payloads_are_byte_for_byte_vllm_s() {
        let pubs = fixture("vllm-0.32-pub.bin");
        assert_eq!(pubs.len(), 21);
        for msg in &pubs {
            let (ts, theirs, _): (f64, Vec<Ordered>, u32) = rmp_serde::from_slice(&msg[2]).unwrap();
            let ours: Vec<Event> = theirs
                .iter()
                .map(|e| match e.kind() {
                    "BlockStored" => Event::BlockStored {
                        block_hashes: field(e, "block_hashes"),
                        parent_block_hash: field(e, "parent_block_hash"),
                        token_ids: field(e, "token_ids"),
                        block_size: field(e, "block_size"),
                        lora_id: None,
                        medium: "GPU",
                        lora_name: None,
                        extra_keys: field(e, "extra_keys"),
                        group_idx: 0,
                        kv_cache_spec_kind: "full_attention",
                    },
                    "BlockRemoved" => removed(hashes(e.get("block_hashes"))[0]),
                    _ => Event::AllBlocksCleared,
                })
                .collect();
            let bytes = rmp_serde::to_vec_named(&(ts, &ours, 0u32)).unwrap();
            assert!(bytes == msg[2], "seq {:?} differs", msg[1]);
        }
        // And the replay's end marker, as the DEALER got it.
        let replay = fixture("vllm-0.32-replay.bin");
        assert_eq!(replay[21], [&b""[..], b"", &END_SEQ, b""]);
    }

    /// A publisher whose batches the test reads itself.
    fn publisher(queue: usize, block_size: usize) -> (Publisher, mpsc::Receiver<Batch>) {
        let (tx, rx) = mpsc::channel(queue);
        let p = Publisher {
            tx,
            block_size,
            state: Mutex::default(),
            dropped: AtomicU64::new(0),
        };
        (p, rx)
    }

    fn json_of(b: Batch) -> Value {
        serde_json::to_value(&b.events).unwrap()
    }

    #[test]
    fn a_last_block_short_of_bytes_is_never_announced() {
        let (p, mut rx) = publisher(8, 16);
        let mut cache = PrefixCache::new(2);
        // 31 bytes = 8 tokens = 2 cache blocks, the second of 15 bytes.
        let text = "q".repeat(31);
        let h = block_hashes(0, &text, 4);
        assert_eq!(h.len(), 2);
        p.insert(&mut cache, &h, text.as_bytes(), None);
        let v = json_of(rx.try_recv().unwrap());
        assert_eq!(v[0]["block_hashes"], json!([h[0]]));
        // Evicted, it is not announced as removed either.
        let other = "o".repeat(32);
        let o = block_hashes(0, &other, 4);
        p.insert(&mut cache, &o, other.as_bytes(), None);
        let v = json_of(rx.try_recv().unwrap());
        let kinds: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["BlockRemoved", "BlockStored"]);
        assert_eq!(v[0]["block_hashes"], json!([h[0]]));
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_a_hit_sends_nothing() {
        let (p, mut rx) = publisher(1, 16);
        let mut cache = PrefixCache::new(100);
        for c in ["a", "b"] {
            let text = c.repeat(32);
            p.insert(
                &mut cache,
                &block_hashes(0, &text, 4),
                text.as_bytes(),
                None,
            );
        }
        assert_eq!(p.dropped.load(Ordering::Relaxed), 1);
        assert!(rx.try_recv().is_ok());
        let text = "a".repeat(32);
        p.insert(
            &mut cache,
            &block_hashes(0, &text, 4),
            text.as_bytes(),
            None,
        );
        assert!(rx.try_recv().is_err());
    }
}
