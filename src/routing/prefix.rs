//! Keyless prefix affinity (`routing.keyless: prefix | system`): for a
//! request without `X-Poimen-Cache-Key`, an affinity key derived from the
//! body by a fixed function, so every replica derives the same key for the
//! same body:
//!
//! ```text
//! chat (/v1/chat/completions), the head:
//!   prefix: the messages up to and including the first whose role is
//!           "user" (all of them if none is)
//!   system: the messages before the first "user" one (system, developer,
//!           ...); when the first message is a user's, as `prefix`
//!   h = xxh3_64( for each head message, in order: role ‖ 0x1F ‖ content ‖ 0x1E )   seed 0
//!   content: a string as is; any other value (a list of parts) as its JSON
//!   text, keys sorted; absent or null: empty
//! completions (/v1/completions): the first `keyless_prefix_bytes` bytes of a
//!   string `prompt`: h = xxh3_64(those bytes)
//! key = h as 16 lowercase hex digits, ranked exactly like a header key
//! ```
//!
//! That head is what stays the same across a conversation's turns. `prefix`
//! tells conversations apart by their first question, but a warmup that
//! carries only the system messages, or a sub-agent with its own first
//! question, gets another key than the turns of its session. `system` keys on
//! the system messages alone: right when they carry the session (an agent's
//! memory context: warmups and sub-agents then land with its turns), wrong
//! when one fixed system prompt serves every conversation (they would all
//! share one key; bounded load then spreads them, without per-conversation
//! affinity). A request with no head (no messages, an empty or non-string
//! prompt, another endpoint) has no key and is routed round-robin.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, Error as _, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

use crate::api::Api;

/// A derived key: the head's hash as 16 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DerivedKey([u8; 16]);

impl DerivedKey {
    fn new(hash: u64) -> Self {
        let mut out = [0u8; 16];
        let hex = format!("{hash:016x}");
        out.copy_from_slice(hex.as_bytes());
        DerivedKey(out)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn as_str(&self) -> &str {
        // Built from ASCII hex digits only.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which messages of a chat form its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Up to and including the first user message.
    FirstUser,
    /// Before the first user message, when there are any.
    System,
}

/// The derived key of a request body of `api`, if it has a head.
pub fn derive(api: Api, body: &[u8], head: Head, prompt_bytes: usize) -> Option<DerivedKey> {
    let hash = match api {
        Api::ChatCompletions => {
            let chat = serde_json::from_slice::<ChatBody>(body).ok()?;
            hash_head(None, chat.messages?.0, head)?
        }
        Api::Completions => {
            let prompt = match serde_json::from_slice::<CompletionBody>(body)
                .ok()?
                .prompt?
            {
                Prompt::Text(t) => t,
                Prompt::Other(_) => return None,
            };
            let head = &prompt.as_bytes()[..prompt.len().min(prompt_bytes)];
            if head.is_empty() {
                return None;
            }
            xxh3_64(head)
        }
        Api::Other => return None,
    };
    Some(DerivedKey::new(hash))
}

/// The hash of `head` of the messages `system` (as a message of role
/// "system", unless absent or empty) then `list` (through its first user
/// message); none when there are no messages.
fn hash_head(system: Option<Value>, list: Vec<Message>, head: Head) -> Option<u64> {
    let system = system
        .filter(|s| s.as_str() != Some("") && s.as_array().is_none_or(|a| !a.is_empty()))
        .map(|content| Message {
            role: "system".into(),
            content,
        });
    let mut h = Xxh3Default::new();
    let (mut count, mut before_user) = (0, None);
    for m in system.iter().chain(&list) {
        if m.role == "user" && count > 0 {
            before_user = Some(h.digest());
        }
        count += 1;
        h.update(m.role.as_bytes());
        h.update(&[0x1f]);
        match &m.content {
            Value::String(s) => h.update(s.as_bytes()),
            Value::Null => {}
            other => h.update(other.to_string().as_bytes()),
        }
        h.update(&[0x1e]);
    }
    let through_user = (count > 0).then(|| h.digest())?;
    Some(match head {
        Head::FirstUser => through_user,
        // Nothing before the user message, or no user message: all of it.
        Head::System => before_user.unwrap_or(through_user),
    })
}

#[derive(Deserialize)]
struct ChatBody {
    #[serde(default)]
    messages: Option<HeadList>,
}

#[derive(Deserialize)]
struct CompletionBody<'a> {
    #[serde(borrow, default)]
    prompt: Option<Prompt<'a>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Other(IgnoredAny),
}

/// A head message, as hashed.
struct Message {
    role: String,
    content: Value,
}

impl Message {
    /// A list item: `{role, content}`, other fields ignored; an item without
    /// a role (a Responses `function_call`, `reasoning`, ...) has its `type`
    /// as role and itself as content. None for anything else.
    fn of_item(item: Value) -> Option<Message> {
        let Value::Object(mut item) = item else {
            return None;
        };
        match item.remove("role") {
            Some(Value::String(role)) => Some(Message {
                role,
                content: item.remove("content").unwrap_or_default(),
            }),
            Some(_) => None,
            None => Some(Message {
                role: item.get("type")?.as_str()?.to_owned(),
                content: Value::Object(item),
            }),
        }
    }
}

/// A list's messages through the first user message; the items after it
/// are skipped, not built.
struct HeadList(Vec<Message>);

impl<'de> Deserialize<'de> for HeadList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(HeadVisitor).map(HeadList)
    }
}

struct HeadVisitor;

impl<'de> Visitor<'de> for HeadVisitor {
    type Value = Vec<Message>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Message>, A::Error> {
        let mut head = Vec::new();
        while let Some(item) = seq.next_element::<Value>()? {
            let m = Message::of_item(item).ok_or_else(|| A::Error::custom("not a message"))?;
            let user = m.role == "user";
            head.push(m);
            if user {
                break;
            }
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHAT: Api = Api::ChatCompletions;

    fn chat_with(head: Head, messages: serde_json::Value) -> Option<String> {
        let body = json!({"messages": messages, "model": "m"}).to_string();
        derive(CHAT, body.as_bytes(), head, 2048).map(|k| k.to_string())
    }

    fn chat(messages: serde_json::Value) -> Option<String> {
        chat_with(Head::FirstUser, messages)
    }

    fn turn(n: usize) -> serde_json::Value {
        let mut m = vec![
            json!({"role": "system", "content": "You are helpful. Memory: likes tea."}),
            json!({"role": "user", "content": "first question"}),
        ];
        for i in 1..n {
            m.push(json!({"role": "assistant", "content": format!("answer {i}")}));
            m.push(json!({"role": "user", "content": format!("question {i}")}));
        }
        serde_json::Value::Array(m)
    }

    #[test]
    fn a_conversation_keeps_its_key_across_turns() {
        let first = chat(turn(1)).unwrap();
        for n in 2..6 {
            assert_eq!(chat(turn(n)).unwrap(), first);
        }
    }

    #[test]
    fn a_different_first_question_or_system_is_a_different_key() {
        let base = chat(turn(3)).unwrap();
        let mut other = turn(3);
        other[1]["content"] = json!("another first question");
        assert_ne!(chat(other).unwrap(), base);
        let mut other = turn(3);
        other[0]["content"] = json!("You are terse.");
        assert_ne!(chat(other).unwrap(), base);
        let mut other = turn(3);
        other[0]["role"] = json!("developer");
        assert_ne!(chat(other).unwrap(), base);
    }

    #[test]
    fn pinned_values() {
        // If these change, every deployed conversation moves.
        assert_eq!(chat(turn(1)).unwrap(), "67331a3e2d2d9f24");
        let documented =
            b"system\x1fYou are helpful. Memory: likes tea.\x1euser\x1ffirst question\x1e";
        assert_eq!(format!("{:016x}", xxh3_64(documented)), "67331a3e2d2d9f24");
        assert_eq!(
            chat(json!([{"role": "user", "content": "hi"}])).unwrap(),
            format!("{:016x}", xxh3_64(b"user\x1fhi\x1e"))
        );
        let body = br#"{"prompt":"Once upon a time","model":"m"}"#;
        assert_eq!(
            derive(Api::Completions, body, Head::FirstUser, 2048)
                .unwrap()
                .to_string(),
            format!("{:016x}", xxh3_64(b"Once upon a time"))
        );
    }

    #[test]
    fn content_parts_and_field_order_do_not_matter_but_content_does() {
        let parts = json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]);
        let reordered =
            r#"{"model":"m","messages":[{"content":[{"text":"hi","type":"text"}],"role":"user"}]}"#;
        assert_eq!(
            chat(parts.clone()),
            derive(CHAT, reordered.as_bytes(), Head::FirstUser, 2048).map(|k| k.to_string())
        );
        assert_ne!(
            chat(parts),
            chat(json!([{"role": "user", "content": "hi"}]))
        );
    }

    #[test]
    fn a_completion_prompt_is_cut_at_the_configured_bytes() {
        let key = |p: &str, n| {
            let body = json!({"prompt": p, "model": "m"}).to_string();
            derive(Api::Completions, body.as_bytes(), Head::FirstUser, n)
        };
        assert_eq!(key("abcdef-1", 6), key("abcdef-2", 6));
        assert_ne!(key("abcdef-1", 8), key("abcdef-2", 8));
        assert_eq!(key("", 6), None);
    }

    #[test]
    fn no_head_no_key() {
        assert_eq!(chat(json!([])), None);
        for head in [Head::FirstUser, Head::System] {
            assert_eq!(chat_with(head, json!([])), None);
            assert_eq!(derive(CHAT, br#"{"model":"m"}"#, head, 2048), None);
            let not_a_list = br#"{"messages":"x","model":"m"}"#;
            assert_eq!(derive(CHAT, not_a_list, head, 2048), None);
            assert_eq!(derive(CHAT, b"not json", head, 2048), None);
            let tokens = br#"{"prompt":[1,2,3],"model":"m"}"#;
            assert_eq!(derive(Api::Completions, tokens, head, 2048), None);
            let embeddings = br#"{"input":"x"}"#;
            assert_eq!(derive(Api::Other, embeddings, head, 2048), None);
        }
    }

    #[test]
    fn the_system_head_ties_warmups_and_sub_agents_to_their_session() {
        let system = |m: serde_json::Value| chat_with(Head::System, m);
        let session = system(turn(3)).unwrap();
        // The warmup: the system message alone.
        assert_eq!(system(json!([turn(1)[0]])).unwrap(), session);
        // A sub-agent: the same system message, another first question.
        let mut sub = turn(2);
        sub[1]["content"] = json!("another first question");
        assert_eq!(system(sub).unwrap(), session);
        // Pinned: the documented function over the system message.
        let documented = b"system\x1fYou are helpful. Memory: likes tea.\x1e";
        assert_eq!(session, format!("{:016x}", xxh3_64(documented)));
        // No system part: as `prefix`.
        let bare = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(system(bare.clone()), chat(bare));
    }
}
