//! vLLM's KV-cache events as they come off the wire (vLLM 0.32,
//! `vllm/distributed/kv_events.py`; what a real server sent is in
//! `tests/data/kv_events/README.md`):
//!
//! ```text
//! a published message: [topic, seq as 8 bytes big-endian, payload]
//! payload: msgpack EventBatch, an array [ts, events, data_parallel_rank?]
//! an event, tagged by its class name, as a map (vLLM 0.32):
//!   {"type": "BlockStored", "block_hashes": [h...], "parent_block_hash": h | nil,
//!    "token_ids": [int...], "block_size": int, "lora_id": int | nil,
//!    "medium": str | nil, "lora_name": str | nil, "extra_keys": [keys | nil...] | nil, ...}
//!   {"type": "BlockRemoved", "block_hashes": [h...], "medium": str | nil, ...}
//!   {"type": "AllBlocksCleared"}
//! or as an array, the tag first and the fields in that order (before 2026):
//!   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name?]
//!   ["BlockRemoved", block_hashes, medium?]    ["AllBlocksCleared"]
//! h: bytes (a digest) or an integer
//! ```
//!
//! Fields this gateway does not read are skipped, whatever they hold; an
//! event of another type decodes as [`Event::Other`].

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

/// One published message.
#[derive(Debug, PartialEq)]
pub struct Message {
    pub seq: u64,
    pub events: Vec<Event>,
}

/// Why a message was not decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Not three frames, or a sequence number not of 8 bytes.
    Frames,
    /// The payload is not an event batch.
    Payload(String),
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::Frames => f.write_str("not [topic, 8-byte seq, payload]"),
            Malformed::Payload(e) => write!(f, "payload: {e}"),
        }
    }
}

/// A message's frames: `[topic, seq, payload]`.
pub fn decode(frames: &[&[u8]]) -> Result<Message, Malformed> {
    let [_topic, seq, payload] = frames else {
        return Err(Malformed::Frames);
    };
    let seq = seq_of(seq).ok_or(Malformed::Frames)?;
    let Batch(events) =
        rmp_serde::from_slice(payload).map_err(|e| Malformed::Payload(e.to_string()))?;
    Ok(Message { seq, events })
}

/// A sequence number frame: 8 bytes, big-endian.
pub fn seq_of(frame: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(frame.try_into().ok()?))
}

/// A block as vLLM names it: its hash, reduced to 64 bits (a digest is
/// hashed down; an integer is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u64);

/// One event.
#[derive(Debug, PartialEq)]
pub enum Event {
    Stored(Stored),
    Removed {
        hashes: Vec<BlockHash>,
        medium: Medium,
    },
    Cleared,
    /// A type this gateway does not know.
    Other,
}

/// Blocks a backend stored: `hashes[i]` holds
/// `token_ids[i * block_size..(i + 1) * block_size]`, chained from `parent`.
#[derive(Debug, PartialEq, Default)]
pub struct Stored {
    pub hashes: Vec<BlockHash>,
    pub parent: Option<BlockHash>,
    pub token_ids: Vec<u32>,
    pub block_size: usize,
    /// The adapter the blocks were computed with: its name, else its id.
    pub lora: Option<String>,
    pub medium: Medium,
    /// Some block carries extra keys (a cache salt, an image's hash).
    pub extra_keys: bool,
}

/// Where blocks are held: the GPU's KV cache (or unsaid), or elsewhere (an
/// offloading tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Medium {
    #[default]
    Gpu,
    Other,
}

struct Batch(Vec<Event>);

impl<'de> Deserialize<'de> for Batch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Batch;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an event batch [ts, events, ...]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Batch, A::Error> {
                let _ts: IgnoredAny = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let events: Vec<Event> = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Batch(events))
            }
        }
        d.deserialize_seq(V)
    }
}

impl<'de> Deserialize<'de> for BlockHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = BlockHash;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a block hash (bytes or an integer)")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<BlockHash, E> {
                Ok(BlockHash(xxh3_64(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<BlockHash, E> {
                Ok(BlockHash(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<BlockHash, E> {
                Ok(BlockHash(v as u64))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Medium {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let medium: Option<&str> = Deserialize::deserialize(d)?;
        Ok(match medium {
            None => Medium::Gpu,
            Some(m) if m.eq_ignore_ascii_case("gpu") => Medium::Gpu,
            Some(_) => Medium::Other,
        })
    }
}

/// `lora_name` (a string) or `lora_id` (an integer), either nil.
fn lora_of(v: Option<LoraField>) -> Option<String> {
    match v? {
        LoraField::Name(n) => Some(n),
        LoraField::Id(id) => Some(format!("#{id}")),
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum LoraField {
    Name(String),
    Id(i64),
}

/// `extra_keys`: nil, or one entry per block, each nil or keys.
fn any_extra(keys: Option<Vec<Option<IgnoredAny>>>) -> bool {
    keys.is_some_and(|k| k.iter().any(Option::is_some))
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EventVisitor)
    }
}

struct EventVisitor;

impl<'de> Visitor<'de> for EventVisitor {
    type Value = Event;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a KV-cache event (a tagged map or array)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
        let mut kind: Option<String> = None;
        let mut stored = Stored::default();
        let (mut lora_name, mut lora_id) = (None, None);
        while let Some(key) = map.next_key::<&str>()? {
            match key {
                "type" => kind = Some(map.next_value()?),
                "block_hashes" => stored.hashes = map.next_value()?,
                "parent_block_hash" => stored.parent = map.next_value()?,
                "token_ids" => stored.token_ids = map.next_value()?,
                "block_size" => stored.block_size = map.next_value()?,
                "lora_id" => lora_id = map.next_value()?,
                "lora_name" => lora_name = map.next_value()?,
                "medium" => stored.medium = map.next_value()?,
                "extra_keys" => stored.extra_keys = any_extra(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        stored.lora = lora_of(lora_name).or_else(|| lora_of(lora_id));
        Ok(event_of(kind.as_deref(), stored))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Event, A::Error> {
        let kind: String = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(0, &self))?;
        let mut stored = Stored::default();
        match kind.as_str() {
            "BlockStored" => {
                stored.hashes = seq.next_element()?.unwrap_or_default();
                stored.parent = seq.next_element()?.flatten();
                stored.token_ids = seq.next_element()?.unwrap_or_default();
                stored.block_size = seq.next_element()?.unwrap_or_default();
                let lora_id = seq.next_element()?.flatten();
                stored.medium = seq.next_element()?.unwrap_or_default();
                let lora_name = seq.next_element()?.flatten();
                stored.lora = lora_of(lora_name).or_else(|| lora_of(lora_id));
            }
            "BlockRemoved" => {
                stored.hashes = seq.next_element()?.unwrap_or_default();
                stored.medium = seq.next_element()?.unwrap_or_default();
            }
            _ => {}
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(event_of(Some(&kind), stored))
    }
}

fn event_of(kind: Option<&str>, stored: Stored) -> Event {
    match kind {
        Some("BlockStored") => Event::Stored(stored),
        Some("BlockRemoved") => Event::Removed {
            hashes: stored.hashes,
            medium: stored.medium,
        },
        Some("AllBlocksCleared") => Event::Cleared,
        _ => Event::Other,
    }
}
