//! Decoding what a real vLLM 0.32 server sent (`tests/data/kv_events/`).

use super::view::Holdings;
use super::wire::{self, Event, Medium};
use crate::routing::chain::of_tokens;
use crate::routing::index::PrefixIndex;

/// The messages of a fixture: each a u32 BE count of frames, each frame a
/// u32 BE length and its bytes.
fn fixture(name: &str) -> Vec<Vec<Vec<u8>>> {
    let path = format!("{}/tests/data/kv_events/{name}", env!("CARGO_MANIFEST_DIR"));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut at = 0;
    let mut take = |n: usize| {
        at += n;
        data[at - n..at].to_vec()
    };
    let mut messages = Vec::new();
    while messages
        .iter()
        .map(|m: &Vec<Vec<u8>>| size(m))
        .sum::<usize>()
        < data.len()
    {
        let count = u32::from_be_bytes(take(4).try_into().unwrap());
        let frames = (0..count)
            .map(|_| {
                let len = u32::from_be_bytes(take(4).try_into().unwrap());
                take(len as usize)
            })
            .collect();
        messages.push(frames);
    }
    messages
}

/// Bytes of a message in a fixture.
fn size(m: &[Vec<u8>]) -> usize {
    4 + m.iter().map(|f| 4 + f.len()).sum::<usize>()
}

fn decoded(name: &str) -> Vec<wire::Message> {
    fixture(name)
        .iter()
        .map(|frames| {
            let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            wire::decode(&frames).unwrap()
        })
        .collect()
}

fn tokenize() -> serde_json::Value {
    let path = format!(
        "{}/tests/data/kv_events/tokenize.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_real_servers_stream_decodes_in_order_with_every_event_type() {
    let messages = decoded("vllm-0.32-pub.bin");
    let seqs: Vec<u64> = messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (0..21).collect::<Vec<_>>());
    let events = || messages.iter().flat_map(|m| &m.events);
    let stored = events().filter(|e| matches!(e, Event::Stored(_))).count();
    let removed = events()
        .filter(|e| matches!(e, Event::Removed { .. }))
        .count();
    let cleared = events().filter(|e| **e == Event::Cleared).count();
    assert_eq!((stored, removed, cleared), (21, 497, 1));
    for e in events() {
        match e {
            Event::Stored(s) => {
                assert_eq!(s.block_size, 32);
                assert_eq!(s.token_ids.len(), 32 * s.hashes.len());
                assert_eq!(
                    (s.medium, &s.lora, s.extra_keys),
                    (Medium::Gpu, &None, false)
                );
            }
            Event::Removed { hashes, medium } => {
                assert_eq!((hashes.len(), *medium), (1, Medium::Gpu));
            }
            Event::Cleared => {}
            Event::Other => panic!("an unknown event"),
        }
    }
}

#[test]
fn the_events_token_ids_are_the_prompts_as_vllm_tokenized_it() {
    let t = tokenize();
    let tokens: Vec<u32> =
        serde_json::from_value(t["tokenize_response"]["tokens"].clone()).unwrap();
    let messages = decoded("vllm-0.32-pub.bin");
    let Event::Stored(s) = &messages[6].events[0] else {
        panic!("seq 6 stores the request's blocks")
    };
    assert_eq!(s.parent, None);
    assert_eq!(s.token_ids, tokens[..160]);
    // Applied, the index holds the prompt's five full blocks.
    let index = PrefixIndex::new(1 << 16, 1 << 16);
    let addr = "127.0.0.1:8000".parse().unwrap();
    let mut holdings = Holdings::new(addr, 32, 1 << 16);
    holdings.apply(&index, &messages[6].events[0]);
    let held = index.lookup(&of_tokens(&tokens, 32));
    assert_eq!((held[0].addr, held[0].blocks), (addr, 5));
}

#[test]
fn the_whole_stream_applied_holds_what_the_server_holds_at_the_end() {
    let messages = decoded("vllm-0.32-pub.bin");
    let index = PrefixIndex::new(1 << 16, 1 << 16);
    let addr = "127.0.0.1:8000".parse().unwrap();
    let mut holdings = Holdings::new(addr, 32, 1 << 16);
    let mut skipped = 0;
    for e in messages.iter().flat_map(|m| &m.events) {
        skipped += holdings.apply(&index, e).skipped;
    }
    // Every block chains from one stored before it, every removal was
    // of a block stored: nothing is left unplaced.
    assert_eq!(skipped, 0);
    // The last batch cleared the cache, then stored the tokenize request's
    // five blocks: that is all the server holds.
    assert_eq!(index.blocks_of(&[addr]), vec![(addr, 5)]);
}

#[test]
fn the_older_array_form_decodes_to_the_same_events() {
    let maps = decoded("vllm-0.32-pub.bin");
    let arrays = decoded("array-form.bin");
    assert_eq!(maps, arrays);
}

#[test]
fn a_replay_answers_from_the_asked_seq_then_ends() {
    let replies = fixture("vllm-0.32-replay.bin");
    assert_eq!(replies.len(), 34);
    let live = fixture("vllm-0.32-pub.bin");
    // Each reply, as a DEALER gets it: an empty frame, then the message.
    let (first, second) = replies.split_at(22);
    for (asked, replies) in [(0, first), (10, second)] {
        let (end, batch) = replies.split_last().unwrap();
        assert_eq!(super::replayed(end), Some(super::Replayed::End));
        for (k, r) in batch.iter().enumerate() {
            let frames: Vec<&[u8]> = r.iter().map(Vec::as_slice).collect();
            let Some(super::Replayed::Message(m)) = super::replayed(r) else {
                panic!("reply {k} is a message: {frames:?}")
            };
            assert_eq!(m.seq, asked + k as u64);
            assert_eq!(r[1..], live[asked as usize + k][..]);
        }
    }
}

#[test]
fn malformed_frames_are_errors_not_panics() {
    let ok = fixture("vllm-0.32-pub.bin").remove(0);
    let f: Vec<&[u8]> = ok.iter().map(Vec::as_slice).collect();
    assert!(wire::decode(&f[..2]).is_err());
    assert!(wire::decode(&[f[0], &f[1][..7], f[2]]).is_err());
    for cut in [0, 1, 5, f[2].len() / 2, f[2].len() - 1] {
        assert!(wire::decode(&[f[0], f[1], &f[2][..cut]]).is_err());
    }
    let mut flipped = f[2].to_vec();
    for i in (0..flipped.len()).step_by(7) {
        flipped[i] ^= 0x5a;
        // Any outcome but a panic.
        let _ = wire::decode(&[f[0], f[1], &flipped]);
    }
}

/// msgpack written value by value with rmp's encoder, in forms vLLM's
/// encoder may choose and the captured stream does not show.
mod forms {
    use rmp::encode as mp;

    use super::super::wire::{self, BlockHash, Event, Medium, Stored};

    fn decode(payload: &[u8]) -> Result<Vec<Event>, wire::Malformed> {
        wire::decode(&[b"kv", &7u64.to_be_bytes(), payload]).map(|m| m.events)
    }

    /// Writes one value.
    type Write<'a> = &'a dyn Fn(&mut Vec<u8>);

    /// `[ts, [events...], rank]`, each event written by its writer.
    fn batch(events: &[Write]) -> Vec<u8> {
        let mut b = Vec::new();
        mp::write_array_len(&mut b, 3).unwrap();
        mp::write_f64(&mut b, 1.5).unwrap();
        mp::write_array_len(&mut b, events.len() as u32).unwrap();
        for e in events {
            e(&mut b);
        }
        mp::write_uint(&mut b, 0).unwrap();
        b
    }

    fn key(b: &mut Vec<u8>, k: &str) {
        mp::write_str(b, k).unwrap();
    }

    #[test]
    fn every_integer_form_fields_in_any_order_and_unknown_values_skipped() {
        let stored = |b: &mut Vec<u8>| {
            mp::write_map_len(b, 9).unwrap();
            key(b, "future_field"); // nested values of every kind, skipped
            mp::write_map_len(b, 2).unwrap();
            key(b, "a");
            mp::write_array_len(b, 3).unwrap();
            mp::write_f32(b, 0.5).unwrap();
            mp::write_bin(b, &[1, 2, 3]).unwrap();
            mp::write_ext_meta(b, 4, 9).unwrap();
            b.extend_from_slice(&[0; 4]);
            key(b, "b");
            mp::write_bool(b, true).unwrap();
            key(b, "token_ids");
            mp::write_array_len(b, 6).unwrap();
            mp::write_pfix(b, 5).unwrap();
            mp::write_u8(b, 200).unwrap();
            mp::write_u16(b, 300).unwrap();
            mp::write_u32(b, 151_000).unwrap();
            mp::write_u64(b, 7).unwrap();
            mp::write_i16(b, 9).unwrap();
            key(b, "block_size");
            mp::write_u64(b, 3).unwrap();
            key(b, "block_hashes");
            mp::write_array_len(b, 2).unwrap();
            mp::write_bin(b, &[0xab; 32]).unwrap();
            mp::write_sint(b, -2).unwrap();
            key(b, "parent_block_hash");
            mp::write_u64(b, u64::MAX).unwrap();
            key(b, "lora_id");
            mp::write_uint(b, 12).unwrap();
            key(b, "medium");
            mp::write_str(b, "CPU").unwrap();
            key(b, "extra_keys");
            mp::write_array_len(b, 2).unwrap();
            mp::write_nil(b).unwrap();
            mp::write_array_len(b, 1).unwrap();
            mp::write_str(b, "salt").unwrap();
            key(b, "type");
            mp::write_str(b, "BlockStored").unwrap();
        };
        let other = |b: &mut Vec<u8>| {
            mp::write_map_len(b, 1).unwrap();
            key(b, "type");
            mp::write_str(b, "SomethingNew").unwrap();
        };
        let cleared = |b: &mut Vec<u8>| {
            mp::write_array_len(b, 1).unwrap();
            mp::write_str(b, "AllBlocksCleared").unwrap();
        };
        // The array form with its fields cut short after the parent.
        let short = |b: &mut Vec<u8>| {
            mp::write_array_len(b, 3).unwrap();
            mp::write_str(b, "BlockStored").unwrap();
            mp::write_array_len(b, 1).unwrap();
            mp::write_uint(b, 4).unwrap();
            mp::write_nil(b).unwrap();
        };
        let events = decode(&batch(&[&stored, &other, &cleared, &short])).unwrap();
        assert_eq!(
            events,
            [
                Event::Stored(Stored {
                    hashes: vec![
                        BlockHash(xxhash_rust::xxh3::xxh3_64(&[0xab; 32])),
                        BlockHash(-2i64 as u64),
                    ],
                    parent: Some(BlockHash(u64::MAX)),
                    token_ids: vec![5, 200, 300, 151_000, 7, 9],
                    block_size: 3,
                    lora: Some("#12".into()),
                    medium: Medium::Other,
                    extra_keys: true,
                }),
                Event::Other,
                Event::Cleared,
                Event::Stored(Stored {
                    hashes: vec![BlockHash(4)],
                    ..Stored::default()
                }),
            ]
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_or_range_is_an_error() {
        let token = |id: Write| {
            let mut b = Vec::new();
            mp::write_map_len(&mut b, 2).unwrap();
            key(&mut b, "type");
            mp::write_str(&mut b, "BlockStored").unwrap();
            key(&mut b, "token_ids");
            mp::write_array_len(&mut b, 1).unwrap();
            id(&mut b);
            b
        };
        for bad in [
            token(&|b| mp::write_u64(b, 1 << 33).map(drop).unwrap()),
            token(&|b| mp::write_sint(b, -1).map(drop).unwrap()),
            token(&|b| mp::write_str(b, "7").unwrap()),
        ] {
            let e = move |b: &mut Vec<u8>| b.extend_from_slice(&bad);
            assert!(decode(&batch(&[&e])).is_err());
        }
        let mut not_a_batch = Vec::new();
        mp::write_array_len(&mut not_a_batch, 1).unwrap();
        mp::write_f64(&mut not_a_batch, 1.0).unwrap();
        assert!(decode(&not_a_batch).is_err());
    }

    #[test]
    fn a_deeply_nested_or_overlong_value_is_no_crash() {
        // An unknown field nested a million arrays deep is skipped without
        // recursion.
        let deep = |b: &mut Vec<u8>| {
            mp::write_map_len(b, 2).unwrap();
            key(b, "nested");
            for _ in 0..1_000_000 {
                mp::write_array_len(b, 1).unwrap();
            }
            mp::write_nil(b).unwrap();
            key(b, "type");
            mp::write_str(b, "AllBlocksCleared").unwrap();
        };
        assert_eq!(decode(&batch(&[&deep])).unwrap(), [Event::Cleared]);
        // A list claiming four billion entries in a few bytes is an error,
        // not a four-billion-entry allocation.
        let mut b = Vec::new();
        mp::write_array_len(&mut b, 2).unwrap();
        mp::write_f64(&mut b, 1.0).unwrap();
        mp::write_array_len(&mut b, u32::MAX).unwrap();
        assert!(decode(&b).is_err());
    }
}
