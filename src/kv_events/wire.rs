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
//!
//! The payload is read value by value with rmp's reader (markers, lengths,
//! integers, strings), not through serde: a stored block carries its
//! token ids, and serde's visitor took each of them apart on its own (two
//! thirds of the events' decode-and-apply cost, `benches/kv_events.rs`).

use std::fmt;

use rmp::decode::bytes::BytesReadError;
use rmp::decode::{self as mp, Bytes, NumValueReadError, ValueReadError};
use rmp::Marker;
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

/// A message's frames: `[topic, seq, payload]`.
pub fn decode(frames: &[&[u8]]) -> Result<Message, Malformed> {
    let [_topic, seq, payload] = frames else {
        return Err(Malformed::Frames);
    };
    let seq = seq_of(seq).ok_or(Malformed::Frames)?;
    let events = Reader(payload)
        .batch()
        .map_err(|e| Malformed::Payload(e.to_string()))?;
    Ok(Message { seq, events })
}

/// Why a payload did not decode.
#[derive(Debug)]
enum Bad {
    /// It ended inside a value.
    Short,
    /// Not `[ts, events, ...]`.
    Batch,
    /// A value of another type than the field's.
    Type(&'static str, Marker),
    /// An integer out of the field's range.
    Range(&'static str),
    Utf8,
}

impl fmt::Display for Bad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bad::Short => f.write_str("ends inside a value"),
            Bad::Batch => f.write_str("not an event batch [ts, events, ...]"),
            Bad::Type(want, got) => write!(f, "expected {want}, found {got:?}"),
            Bad::Range(want) => write!(f, "{want} out of range"),
            Bad::Utf8 => f.write_str("a string not UTF-8"),
        }
    }
}

/// A length read after its marker was seen: only the bytes can be short.
impl From<ValueReadError<BytesReadError>> for Bad {
    fn from(_: ValueReadError<BytesReadError>) -> Bad {
        Bad::Short
    }
}

fn number<T>(
    n: Result<T, NumValueReadError<BytesReadError>>,
    what: &'static str,
) -> Result<T, Bad> {
    n.map_err(|e| match e {
        NumValueReadError::TypeMismatch(m) => Bad::Type(what, m),
        NumValueReadError::OutOfRange => Bad::Range(what),
        _ => Bad::Short,
    })
}

/// The payload not read yet.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// The next value's marker, not taken.
    fn peek(&self) -> Result<Marker, Bad> {
        self.0
            .first()
            .map(|b| Marker::from_u8(*b))
            .ok_or(Bad::Short)
    }

    /// The next value is nil: taken.
    fn nil(&mut self) -> Result<bool, Bad> {
        let nil = self.peek()? == Marker::Null;
        if nil {
            self.0 = &self.0[1..];
        }
        Ok(nil)
    }

    /// What rmp's `read` reads off the payload.
    fn rmp<T>(&mut self, read: impl FnOnce(&mut Bytes<'a>) -> T) -> T {
        let mut rd = Bytes::new(self.0);
        let value = read(&mut rd);
        self.0 = rd.remaining_slice();
        value
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        if self.0.len() < n {
            return Err(Bad::Short);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array(&mut self) -> Result<usize, Bad> {
        match self.rmp(mp::read_array_len) {
            Ok(len) => Ok(len as usize),
            Err(ValueReadError::TypeMismatch(m)) => Err(Bad::Type("an array", m)),
            Err(_) => Err(Bad::Short),
        }
    }

    fn uint(&mut self, what: &'static str) -> Result<u64, Bad> {
        number(self.rmp(mp::read_int), what)
    }

    fn sint(&mut self, what: &'static str) -> Result<i64, Bad> {
        number(self.rmp(mp::read_int), what)
    }

    fn str(&mut self) -> Result<&'a str, Bad> {
        match mp::read_str_from_slice(self.0) {
            Ok((s, rest)) => {
                self.0 = rest;
                Ok(s)
            }
            Err(mp::DecodeStringError::InvalidUtf8(..)) => Err(Bad::Utf8),
            Err(mp::DecodeStringError::TypeMismatch(m)) => Err(Bad::Type("a string", m)),
            Err(_) => Err(Bad::Short),
        }
    }

    /// A list's capacity: what its claimed length could hold in the bytes
    /// left (a value takes one at least), not what a corrupt length says.
    fn room(&self, len: usize) -> usize {
        len.min(self.0.len())
    }

    /// Skips `n` values, nested ones with them (without recursion: a
    /// payload nested deep cannot take the stack). rmp reads each length.
    fn skip(&mut self, mut n: usize) -> Result<(), Bad> {
        while n > 0 {
            n -= 1;
            let data = match self.peek()? {
                Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                    n += self.array()?;
                    0
                }
                Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
                    n += 2 * self.rmp(mp::read_map_len)? as usize;
                    0
                }
                Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                    self.rmp(mp::read_str_len)? as usize
                }
                Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                    self.rmp(mp::read_bin_len)? as usize
                }
                Marker::FixExt1
                | Marker::FixExt2
                | Marker::FixExt4
                | Marker::FixExt8
                | Marker::FixExt16
                | Marker::Ext8
                | Marker::Ext16
                | Marker::Ext32 => self.rmp(mp::read_ext_meta)?.size as usize,
                Marker::Reserved => return Err(Bad::Type("a value", Marker::Reserved)),
                // Nil, a boolean or a number: the marker, then its bytes.
                m => {
                    self.take(1)?;
                    match m {
                        Marker::U8 | Marker::I8 => 1,
                        Marker::U16 | Marker::I16 => 2,
                        Marker::U32 | Marker::I32 | Marker::F32 => 4,
                        Marker::U64 | Marker::I64 | Marker::F64 => 8,
                        _ => 0,
                    }
                }
            };
            self.take(data)?;
        }
        Ok(())
    }

    /// `[ts, events, data_parallel_rank?]`.
    fn batch(&mut self) -> Result<Vec<Event>, Bad> {
        let len = self.array()?;
        if len < 2 {
            return Err(Bad::Batch);
        }
        self.skip(1)?;
        let n = self.array()?;
        let mut events = Vec::with_capacity(self.room(n));
        for _ in 0..n {
            events.push(self.event()?);
        }
        self.skip(len - 2)?;
        Ok(events)
    }

    /// An event: a map tagged by `type`, or an array, its tag first.
    fn event(&mut self) -> Result<Event, Bad> {
        let mut stored = Stored::default();
        let (mut lora_name, mut lora_id) = (None, None);
        let kind = match self.peek()? {
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
                let mut kind = None;
                for _ in 0..self.rmp(mp::read_map_len)? {
                    match self.str()? {
                        "type" => kind = Some(self.str()?),
                        "block_hashes" => stored.hashes = self.hashes()?,
                        "parent_block_hash" => stored.parent = self.maybe(Self::hash)?,
                        "token_ids" => stored.token_ids = self.token_ids()?,
                        "block_size" => stored.block_size = self.block_size()?,
                        "lora_id" => lora_id = self.maybe(Self::lora)?,
                        "lora_name" => lora_name = self.maybe(Self::lora)?,
                        "medium" => stored.medium = self.medium()?,
                        "extra_keys" => stored.extra_keys = self.extra_keys()?,
                        _ => self.skip(1)?,
                    }
                }
                kind
            }
            _ => {
                let len = self.array()?;
                let kind = match len {
                    0 => None,
                    _ => Some(self.str()?),
                };
                // The fields in their order, as many as were sent.
                let mut left = len.saturating_sub(1);
                let mut next = |r: &mut Self| {
                    let more = left > 0;
                    left = left.saturating_sub(1);
                    more && !r.nil().unwrap_or(false)
                };
                match kind.unwrap_or_default() {
                    "BlockStored" => {
                        if next(self) {
                            stored.hashes = self.hashes()?;
                        }
                        if next(self) {
                            stored.parent = Some(self.hash()?);
                        }
                        if next(self) {
                            stored.token_ids = self.token_ids()?;
                        }
                        if next(self) {
                            stored.block_size = self.block_size()?;
                        }
                        if next(self) {
                            lora_id = Some(self.lora()?);
                        }
                        if next(self) {
                            stored.medium = self.medium()?;
                        }
                        if next(self) {
                            lora_name = Some(self.lora()?);
                        }
                    }
                    "BlockRemoved" => {
                        if next(self) {
                            stored.hashes = self.hashes()?;
                        }
                        if next(self) {
                            stored.medium = self.medium()?;
                        }
                    }
                    _ => {}
                }
                self.skip(left)?;
                kind
            }
        };
        stored.lora = lora_name.or(lora_id);
        Ok(event_of(kind, stored))
    }

    /// Nil, or what `read` reads.
    fn maybe<T>(&mut self, read: fn(&mut Self) -> Result<T, Bad>) -> Result<Option<T>, Bad> {
        if self.nil()? {
            return Ok(None);
        }
        read(self).map(Some)
    }

    /// A block hash: bytes (a digest, hashed down) or an integer.
    fn hash(&mut self) -> Result<BlockHash, Bad> {
        match self.peek()? {
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                let len = self.rmp(mp::read_bin_len)? as usize;
                Ok(BlockHash(xxh3_64(self.take(len)?)))
            }
            Marker::FixNeg(_) | Marker::I8 | Marker::I16 | Marker::I32 | Marker::I64 => {
                Ok(BlockHash(self.sint("a block hash")? as u64))
            }
            _ => self
                .uint("a block hash (bytes or an integer)")
                .map(BlockHash),
        }
    }

    fn hashes(&mut self) -> Result<Vec<BlockHash>, Bad> {
        let n = self.array()?;
        let mut hashes = Vec::with_capacity(self.room(n));
        for _ in 0..n {
            hashes.push(self.hash()?);
        }
        Ok(hashes)
    }

    /// A block's token ids: read inline in the forms msgpack writes them
    /// (a positive fixint, uint 8, 16 or 32: most of an event's bytes),
    /// any other by rmp.
    fn token_ids(&mut self) -> Result<Vec<u32>, Bad> {
        let n = self.array()?;
        let mut ids = Vec::with_capacity(self.room(n));
        for _ in 0..n {
            let (id, len) = match *self.0 {
                [b, ..] if b < 0x80 => (b as u32, 1),
                [0xcc, b, ..] => (b as u32, 2),
                [0xcd, b0, b1, ..] => (u16::from_be_bytes([b0, b1]) as u32, 3),
                [0xce, b0, b1, b2, b3, ..] => (u32::from_be_bytes([b0, b1, b2, b3]), 5),
                _ => {
                    let id = self.uint("a token id")?;
                    (u32::try_from(id).map_err(|_| Bad::Range("a token id"))?, 0)
                }
            };
            self.0 = &self.0[len..];
            ids.push(id);
        }
        Ok(ids)
    }

    fn block_size(&mut self) -> Result<usize, Bad> {
        let size = self.uint("block_size")?;
        usize::try_from(size).map_err(|_| Bad::Range("block_size"))
    }

    /// `lora_name` (a string) or `lora_id` (an integer).
    fn lora(&mut self) -> Result<String, Bad> {
        match self.peek()? {
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                self.str().map(str::to_owned)
            }
            _ => Ok(format!("#{}", self.sint("a LoRA name or id")?)),
        }
    }

    /// Nil or a string: the GPU's or another tier's.
    fn medium(&mut self) -> Result<Medium, Bad> {
        Ok(match self.maybe(Self::str)? {
            Some(m) if !m.eq_ignore_ascii_case("gpu") => Medium::Other,
            _ => Medium::Gpu,
        })
    }

    /// `extra_keys`: nil, or one entry per block, each nil or keys.
    fn extra_keys(&mut self) -> Result<bool, Bad> {
        if self.nil()? {
            return Ok(false);
        }
        let mut any = false;
        for _ in 0..self.array()? {
            if !self.nil()? {
                any = true;
                self.skip(1)?;
            }
        }
        Ok(any)
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
