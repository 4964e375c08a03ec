//! Which backend stored each Responses API response. vLLM keeps a stored
//! response in the memory of the server that made it, so a turn that
//! continues it (`previous_response_id`), and a retrieve or cancel of it,
//! must reach that server: any other answers 404.
//!
//! The gateway learns an owner from the response itself (its `id`) and keeps
//! it here: bounded in entries and age, gateway-wide (a retrieve names no
//! model). An entry is 16 bytes of table plus 16 of eviction order: the id's
//! hash, the owner as an index into a small table of (model, backend), and
//! the second it was recorded. A miss (after a restart or a reload, or an id
//! another replica made) is resolved by asking the backends; [`verdict`]
//! turns their answers into the outcome.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::xxh3_64;

use crate::api::valid_response_id;

/// Owners remembered by default: about 3 MiB, a day of a turn a second.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;
/// How long an owner is remembered by default.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(86_400);
/// How long a backend is given to say whether it has a response, by default.
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// The backend that stored a response, and the model it was served under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub model: Arc<str>,
    pub addr: SocketAddr,
}

pub struct Owners {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_age: Duration,
    epoch: Instant,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<u64, Entry>,
    /// (id hash, second recorded), oldest first: what is forgotten first.
    order: VecDeque<(u64, u32)>,
    /// Every owner seen; entries point into it. Grows only with the
    /// distinct (model, backend) pairs ever served: a handful.
    owners: Vec<Owner>,
}

#[derive(Clone, Copy)]
struct Entry {
    owner: u32,
    at: u32,
}

impl Owners {
    /// At most `max_entries` owners, each forgotten `max_age` after it was
    /// learned.
    pub fn new(max_entries: usize, max_age: Duration) -> Self {
        Owners {
            inner: Mutex::default(),
            max_entries,
            max_age,
            epoch: Instant::now(),
        }
    }

    fn second(&self, now: Instant) -> u32 {
        let secs = now.saturating_duration_since(self.epoch).as_secs();
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The map stays consistent between statements: a panic elsewhere
        // does not poison what it means.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Response `id` was stored by `owner`.
    pub fn record(&self, id: &str, owner: &Owner, now: Instant) {
        if !valid_response_id(id) {
            return;
        }
        let at = self.second(now);
        let hash = xxh3_64(id.as_bytes());
        let mut inner = self.lock();
        let index = match inner.owners.iter().position(|o| o == owner) {
            Some(i) => i,
            None => {
                inner.owners.push(owner.clone());
                inner.owners.len() - 1
            }
        };
        let entry = Entry {
            owner: index as u32,
            at,
        };
        inner.by_id.insert(hash, entry);
        inner.order.push_back((hash, at));
        self.forget_old(&mut inner, at);
    }

    /// Who stored response `id`, if known and not too old.
    pub fn get(&self, id: &str, now: Instant) -> Option<Owner> {
        let hash = xxh3_64(id.as_bytes());
        let now = self.second(now);
        let inner = self.lock();
        let entry = inner.by_id.get(&hash)?;
        let young = u64::from(now - entry.at.min(now)) < self.max_age.as_secs();
        young.then(|| inner.owners[entry.owner as usize].clone())
    }

    /// How many owners are remembered.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop entries over the bound or the age, oldest first.
    fn forget_old(&self, inner: &mut Inner, now: u32) {
        let max_age = u32::try_from(self.max_age.as_secs()).unwrap_or(u32::MAX);
        while let Some(&(hash, at)) = inner.order.front() {
            let over = inner.order.len() > self.max_entries;
            if !over && now.saturating_sub(at) < max_age {
                break;
            }
            inner.order.pop_front();
            // Recorded again since: the newer place in the order keeps it.
            if inner.by_id.get(&hash).is_some_and(|e| e.at == at) {
                inner.by_id.remove(&hash);
            }
        }
    }
}

/// One backend's answer to "do you have response `id`?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 200: it stored the response.
    Has,
    /// 404, with the body it sent (vLLM's error, given to the client when
    /// no backend has the response).
    NotFound(bytes::Bytes),
    /// Anything else: unreachable, timed out, another status.
    Failed,
}

/// What asking every backend found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Found(SocketAddr),
    /// Every backend answered that it does not have it.
    NotFound(bytes::Bytes),
    /// None said it has it, and some did not answer: it may be on one of
    /// those.
    Unknown(Vec<SocketAddr>),
}

/// The outcome of asking each backend; `None` when none was asked.
pub fn verdict(answers: Vec<(SocketAddr, Answer)>) -> Option<Verdict> {
    if let Some((addr, _)) = answers.iter().find(|(_, a)| *a == Answer::Has) {
        return Some(Verdict::Found(*addr));
    }
    let failed: Vec<SocketAddr> = answers
        .iter()
        .filter(|(_, a)| *a == Answer::Failed)
        .map(|(addr, _)| *addr)
        .collect();
    if !failed.is_empty() {
        return Some(Verdict::Unknown(failed));
    }
    answers.into_iter().find_map(|(_, a)| match a {
        Answer::NotFound(body) => Some(Verdict::NotFound(body)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(model: &str, port: u16) -> Owner {
        Owner {
            model: model.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn an_owner_is_remembered_until_its_age() {
        let owners = Owners::new(10, DAY);
        let t = Instant::now();
        owners.record("resp_1", &owner("m", 1), t);
        owners.record("resp_2", &owner("n", 2), t);
        assert_eq!(owners.get("resp_1", t), Some(owner("m", 1)));
        assert_eq!(owners.get("resp_2", t + DAY / 2), Some(owner("n", 2)));
        assert_eq!(owners.get("resp_3", t), None);
        assert_eq!(owners.get("resp_1", t + DAY), None, "too old");
        // A new record sweeps the old ones out.
        owners.record("resp_4", &owner("m", 1), t + DAY);
        assert_eq!(owners.len(), 1);
    }

    #[test]
    fn the_oldest_are_forgotten_first_when_full() {
        let owners = Owners::new(3, DAY);
        let t = Instant::now();
        for i in 0..5 {
            owners.record(&format!("resp_{i}"), &owner("m", 1), t);
        }
        assert_eq!(owners.len(), 3);
        assert_eq!(owners.get("resp_1", t), None);
        assert_eq!(owners.get("resp_2", t), Some(owner("m", 1)));
        assert_eq!(owners.get("resp_4", t), Some(owner("m", 1)));
    }

    #[test]
    fn recorded_again_it_keeps_its_newer_place() {
        let owners = Owners::new(2, DAY);
        let t = Instant::now();
        owners.record("resp_a", &owner("m", 1), t);
        owners.record("resp_b", &owner("m", 1), t + Duration::from_secs(1));
        owners.record("resp_a", &owner("m", 2), t + Duration::from_secs(2));
        // Over the bound: b's and a's first place go, a's newer one stays.
        owners.record("resp_c", &owner("m", 1), t + Duration::from_secs(3));
        assert_eq!(owners.get("resp_a", t), Some(owner("m", 2)));
        assert_eq!(owners.get("resp_b", t), None);
        assert_eq!(owners.get("resp_c", t), Some(owner("m", 1)));
    }

    #[test]
    fn ids_that_are_not_ids_are_neither_kept_nor_asked_about() {
        for bad in ["", "resp_1/../x", "resp 1", "resp_1?x", &"a".repeat(257)] {
            assert!(!valid_response_id(bad), "{bad}");
        }
        assert!(valid_response_id("resp_0123456789abcdef"));
        let owners = Owners::new(2, DAY);
        owners.record("a/b", &owner("m", 1), Instant::now());
        assert!(owners.is_empty());
    }

    #[test]
    fn the_verdict_of_the_backends_answers() {
        let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let nf = || Answer::NotFound("404".into());
        assert_eq!(verdict(vec![]), None);
        let found = vec![(a(1), nf()), (a(2), Answer::Failed), (a(3), Answer::Has)];
        assert_eq!(verdict(found), Some(Verdict::Found(a(3))));
        let unknown = vec![(a(1), nf()), (a(2), Answer::Failed)];
        assert_eq!(verdict(unknown), Some(Verdict::Unknown(vec![a(2)])));
        let none = vec![(a(1), nf()), (a(2), nf())];
        assert_eq!(verdict(none), Some(Verdict::NotFound("404".into())));
    }
}
