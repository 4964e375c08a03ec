//! The Responses API store: what `previous_response_id` and
//! `GET /v1/responses/{id}` find, in this process's memory only.
//!
//! vLLM 0.32 (with `VLLM_ENABLE_RESPONSES_API_STORE=1`) keeps every stored
//! response forever in a dict, so an id is known only to the server that
//! answered it; a gateway must send the next turn back there. The simulator
//! keeps that, but bounded in bytes, oldest out first, so a long benchmark
//! cannot grow it without limit.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use crate::conversation::Turn;

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response object as first sent (what GET answers).
    pub body: Bytes,
    /// The conversation the request was rendered from (its instructions
    /// included, as vLLM's `msg_store` keeps them).
    pub turns: Vec<Turn>,
    /// The text of its output message ("" if it had none).
    pub output: String,
}

impl Stored {
    fn size(&self) -> usize {
        self.body.len()
            + self.output.len()
            + self
                .turns
                .iter()
                .map(|t| t.role.len() + t.text.len())
                .sum::<usize>()
    }
}

#[derive(Debug)]
pub struct ResponseStore {
    max_bytes: usize,
    bytes: usize,
    entries: HashMap<String, Stored>,
    /// Ids, oldest first.
    order: VecDeque<String>,
}

impl ResponseStore {
    pub fn new(max_bytes: usize) -> Self {
        ResponseStore {
            max_bytes,
            bytes: 0,
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn get(&self, id: &str) -> Option<&Stored> {
        self.entries.get(id)
    }

    /// Stores `entry` under `id`, then drops the oldest entries until the
    /// store fits its byte budget. An entry larger than the whole budget is
    /// not stored (and evicts nothing).
    pub fn insert(&mut self, id: String, entry: Stored) {
        if entry.size() > self.max_bytes {
            return;
        }
        self.bytes += entry.size();
        if let Some(old) = self.entries.insert(id.clone(), entry) {
            self.bytes -= old.size();
        } else {
            self.order.push_back(id);
        }
        while self.bytes > self.max_bytes {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.entries.remove(&oldest) {
                self.bytes -= gone.size();
            }
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: usize) -> Stored {
        Stored {
            body: Bytes::from(vec![b'x'; n]),
            turns: vec![Turn::new("user", "hi")],
            output: String::new(),
        }
    }

    #[test]
    fn oldest_entries_leave_first_when_over_budget() {
        // Each entry is n + 6 bytes ("user" + "hi").
        let mut s = ResponseStore::new(100);
        s.insert("a".into(), entry(44));
        s.insert("b".into(), entry(44));
        assert_eq!(s.len(), 2);
        s.insert("c".into(), entry(10));
        assert!(s.get("a").is_none());
        assert!(s.get("b").is_some() && s.get("c").is_some());
        // Too big for the budget on its own: not kept, nothing evicted.
        s.insert("d".into(), entry(200));
        assert!(s.get("d").is_none());
        assert_eq!(s.len(), 2);
    }
}
