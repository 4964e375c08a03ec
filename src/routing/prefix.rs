//! Keyless prefix affinity (`routing.keyless: prefix | system`): for a
//! request without `X-Poimen-Cache-Key`, an affinity key derived from the
//! body by a fixed function, so every replica derives the same key for the
//! same body:
//!
//! ```text
//! the messages, in order (each a role and a content):
//!   chat (/v1/chat/completions): `messages`
//!   Responses (/v1/responses): `instructions` as a "system" message, then
//!     `input`: a string is one "user" message; a list item is a message
//!     {role, content} (with or without "type": "message"), or, without a
//!     role (function_call, function_call_output, reasoning, ...), one whose
//!     role is its "type" and whose content is the item itself
//!   Messages (/v1/messages): `system` as a "system" message, then `messages`
//!   a `system` or `instructions` absent, null, "" or [] is no message
//! the head:
//!   prefix: the messages up to and including the first whose role is
//!           "user" (all of them if none is)
//!   system: the messages before the first "user" one (system, developer,
//!           ...); when the first message is a user's, as `prefix`
//!   h = xxh3_64( for each head message, in order: role ‖ 0x1F ‖ content ‖ 0x1E )   seed 0
//!   content: a string as is; any other value (a list of parts, an item) as
//!   its JSON text, keys sorted; absent or null: empty
//! completions (/v1/completions): the first `keyless_prefix_bytes` bytes of a
//!   string `prompt`: h = xxh3_64(those bytes)
//! key = h as 16 lowercase hex digits, ranked exactly like a header key
//! ```
//!
//! One function for the three message APIs: a conversation sent through any
//! of them with the same strings (a system prompt, then user and assistant
//! texts) derives the same key. Parts are hashed as sent, so bodies that
//! differ in form key apart: Responses' `input_text` parts against chat's
//! and Messages' `text` ones, a Messages `system` as blocks against a string.
//! A Responses turn sent with `previous_response_id` carries only its new
//! `input`, so it derives that input's key, not its conversation's.
//!
//! That head is what stays the same across a conversation's turns. `prefix`
//! tells conversations apart by their first question, but a warmup that
//! carries only the system messages, or a sub-agent with its own first
//! question, gets another key than the turns of its session. `system` keys on
//! the system messages alone: right when they carry the session (an agent's
//! memory context: warmups and sub-agents then land with its turns), wrong
//! when one fixed system prompt serves every conversation (they would all
//! share one key; with `routing.prefix_index` the cost rule then spreads
//! them by load, each turn following its own prompt). A request with no
//! head (no messages, an empty or non-string prompt, another endpoint) has
//! no key and is routed round-robin.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, Error as _, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

use crate::api::{Api, Conversation, Field};
use crate::body;

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

/// Which messages form the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Up to and including the first user message.
    FirstUser,
    /// Before the first user message, when there are any.
    System,
}

/// The derived key of a request of `api` with `prompt` (its body's fields),
/// if it has a head.
pub fn derive(
    api: Api,
    prompt: &body::Prompt,
    head: Head,
    prompt_bytes: usize,
) -> Option<DerivedKey> {
    let hash = match api.describe().conversation? {
        Conversation::Messages { system, messages } => {
            let system = match system.and_then(|f| prompt.field(f)) {
                Some(raw) => Some(serde_json::from_str::<Value>(raw.get()).ok()?),
                None => None,
            };
            let raw = prompt.field(messages)?.get();
            let list = match messages {
                Field::Input => serde_json::from_str::<ResponsesInput>(raw).ok()?.0,
                _ => serde_json::from_str::<HeadList>(raw).ok()?.0,
            };
            hash_head(system, list, head)?
        }
        Conversation::Text => {
            let text = match serde_json::from_str::<Prompt>(prompt.prompt?.get()).ok()? {
                Prompt::Text(t) => t,
                Prompt::Other(_) => return None,
            };
            let head = &text.as_bytes()[..text.len().min(prompt_bytes)];
            if head.is_empty() {
                return None;
            }
            xxh3_64(head)
        }
    };
    Some(DerivedKey::new(hash))
}

/// The derived key of a whole request body of `api` (`derive` reads the
/// fields the body's one parse found).
pub fn of_body(api: Api, body: &[u8], head: Head, prompt_bytes: usize) -> Option<DerivedKey> {
    derive(api, &body::prompt_of(body), head, prompt_bytes)
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

/// A Responses `input`: a list, as `HeadList`, or a string: one user message.
struct ResponsesInput(Vec<Message>);

impl<'de> Deserialize<'de> for ResponsesInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(HeadVisitor).map(ResponsesInput)
    }
}

struct HeadVisitor;

impl<'de> Visitor<'de> for HeadVisitor {
    type Value = Vec<Message>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of messages")
    }

    // Reached only through `ResponsesInput`: `deserialize_seq` refuses a string.
    fn visit_str<E>(self, text: &str) -> Result<Vec<Message>, E> {
        Ok(vec![Message {
            role: "user".into(),
            content: Value::String(text.to_owned()),
        }])
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
        of_body(CHAT, body.as_bytes(), head, 2048).map(|k| k.to_string())
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
            of_body(Api::Completions, body, Head::FirstUser, 2048)
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
            of_body(CHAT, reordered.as_bytes(), Head::FirstUser, 2048).map(|k| k.to_string())
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
            of_body(Api::Completions, body.as_bytes(), Head::FirstUser, n)
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
            assert_eq!(of_body(CHAT, br#"{"model":"m"}"#, head, 2048), None);
            let not_a_list = br#"{"messages":"x","model":"m"}"#;
            assert_eq!(of_body(CHAT, not_a_list, head, 2048), None);
            assert_eq!(of_body(CHAT, b"not json", head, 2048), None);
            let tokens = br#"{"prompt":[1,2,3],"model":"m"}"#;
            assert_eq!(of_body(Api::Completions, tokens, head, 2048), None);
            let embeddings = br#"{"input":"x"}"#;
            assert_eq!(of_body(Api::Engine, embeddings, head, 2048), None);
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

    fn key(api: Api, head: Head, body: serde_json::Value) -> Option<String> {
        of_body(api, body.to_string().as_bytes(), head, 2048).map(|k| k.to_string())
    }

    const SYSTEM: &str = "You are helpful. Memory: likes tea.";

    /// Turn `n` of `turn(n)` as a Responses body and as a Messages body.
    fn turn_in_every_api(n: usize) -> [serde_json::Value; 2] {
        let list = turn(n).as_array().unwrap()[1..].to_vec();
        [
            json!({"model": "m", "instructions": SYSTEM, "input": list}),
            json!({"model": "m", "system": SYSTEM, "messages": list, "max_tokens": 16}),
        ]
    }

    const OTHERS: [Api; 2] = [Api::Responses, Api::Messages];

    #[test]
    fn a_conversation_has_the_same_key_in_every_api() {
        for head in [Head::FirstUser, Head::System] {
            for n in 1..4 {
                let chat = chat_with(head, turn(n));
                assert!(chat.is_some());
                for (api, body) in OTHERS.into_iter().zip(turn_in_every_api(n)) {
                    assert_eq!(key(api, head, body), chat, "{api:?} {head:?} turn {n}");
                }
            }
            // A string input is one user message.
            let body = json!({"instructions": SYSTEM, "input": "first question"});
            assert_eq!(key(Api::Responses, head, body), chat_with(head, turn(1)));
            // No system part, or an empty one: the user message alone.
            let bare = chat_with(head, json!([{"role": "user", "content": "hi"}]));
            for instructions in [json!(null), json!("")] {
                let body = json!({"instructions": instructions, "input": "hi"});
                assert_eq!(key(Api::Responses, head, body), bare);
            }
            for system in [json!(""), json!([])] {
                let body =
                    json!({"system": system, "messages": [{"role": "user", "content": "hi"}]});
                assert_eq!(key(Api::Messages, head, body), bare);
            }
        }
    }

    #[test]
    fn responses_and_messages_keep_their_key_across_turns() {
        let keys = |n| {
            let bodies = OTHERS.into_iter().zip(turn_in_every_api(n));
            bodies.map(|(api, body)| key(api, Head::FirstUser, body).unwrap())
        };
        let first: Vec<_> = keys(1).collect();
        for n in 2..6 {
            assert!(keys(n).eq(first.iter().cloned()));
        }
    }

    #[test]
    fn responses_and_messages_differ_by_first_question_and_system() {
        let [responses, messages] = turn_in_every_api(3);
        let base = |api, body: &serde_json::Value| key(api, Head::FirstUser, body.clone());
        for (api, body, system, list) in [
            (Api::Responses, responses, "instructions", "input"),
            (Api::Messages, messages, "system", "messages"),
        ] {
            let mut other = body.clone();
            other[list][0]["content"] = json!("another first question");
            assert_ne!(base(api, &other), base(api, &body));
            let mut other = body.clone();
            other[system] = json!("You are terse.");
            assert_ne!(base(api, &other), base(api, &body));
            // The system head: the same without the first question.
            let warmup = json!({system: body[system], list: []});
            assert_eq!(
                key(api, Head::System, warmup),
                key(api, Head::System, body.clone())
            );
        }
    }

    #[test]
    fn responses_items_with_or_without_a_role() {
        let typed = json!({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ]});
        let untyped =
            br#"{"input":[{"content":[{"text":"hi","type":"input_text"}],"role":"user"}]}"#;
        assert_eq!(
            key(Api::Responses, Head::FirstUser, typed),
            of_body(Api::Responses, untyped, Head::FirstUser, 2048).map(|k| k.to_string())
        );
        // An item without a role: its type, then itself, keys sorted.
        let body = json!({"input": [
            {"type": "function_call_output", "output": "42", "call_id": "c1"},
            {"role": "user", "content": "go on"},
            {"type": "reasoning", "summary": []}
        ]});
        let documented = b"function_call_output\x1f{\"call_id\":\"c1\",\"output\":\"42\",\"type\":\"function_call_output\"}\x1e";
        assert_eq!(
            key(Api::Responses, Head::System, body.clone()).unwrap(),
            format!("{:016x}", xxh3_64(documented))
        );
        let through_user = [&documented[..], b"user\x1fgo on\x1e"].concat();
        assert_eq!(
            key(Api::Responses, Head::FirstUser, body).unwrap(),
            format!("{:016x}", xxh3_64(&through_user))
        );
    }

    #[test]
    fn pinned_values_of_responses_and_messages() {
        // If these change, every deployed conversation moves.
        let derived = |api, body: &str| {
            let key = of_body(api, body.as_bytes(), Head::FirstUser, 2048);
            key.unwrap().to_string()
        };
        let documented = b"system\x1fBe brief.\x1euser\x1fhi\x1e";
        assert_eq!(format!("{:016x}", xxh3_64(documented)), "91e89f961b137097");
        for body in [
            r#"{"model":"m","instructions":"Be brief.","input":[{"role":"user","content":"hi"}]}"#,
            r#"{"input":[{"content":"hi","role":"user"}],"instructions":"Be brief.","model":"m"}"#,
            r#"{"model":"m","instructions":"Be brief.","input":"hi"}"#,
        ] {
            assert_eq!(derived(Api::Responses, body), "91e89f961b137097");
        }
        let documented = b"system\x1f[{\"text\":\"Be brief.\",\"type\":\"text\"}]\x1e\
                           user\x1f[{\"text\":\"hi\",\"type\":\"text\"}]\x1e";
        assert_eq!(format!("{:016x}", xxh3_64(documented)), "c5d6f67dc4ec1e7e");
        for body in [
            r#"{"model":"m","max_tokens":8,"system":[{"type":"text","text":"Be brief."}],
                "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
            r#"{"messages":[{"content":[{"text":"hi","type":"text"}],"role":"user"}],
                "system":[{"text":"Be brief.","type":"text"}],"max_tokens":8,"model":"m"}"#,
        ] {
            assert_eq!(derived(Api::Messages, body), "c5d6f67dc4ec1e7e");
        }
    }

    #[test]
    fn responses_and_messages_without_a_head_have_no_key() {
        for head in [Head::FirstUser, Head::System] {
            for body in [
                json!({"model": "m"}),
                json!({"instructions": "x"}),
                json!({"instructions": "", "input": []}),
                json!({"input": [{"content": "no role, no type"}]}),
                json!({"input": 3}),
            ] {
                assert_eq!(key(Api::Responses, head, body.clone()), None, "{body}");
            }
            for body in [
                json!({"model": "m", "system": "x"}),
                json!({"system": "", "messages": []}),
                json!({"messages": "a string is not a list"}),
            ] {
                assert_eq!(key(Api::Messages, head, body.clone()), None, "{body}");
            }
            for api in OTHERS {
                assert_eq!(of_body(api, b"not json", head, 2048), None);
            }
        }
    }
}
