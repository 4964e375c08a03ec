//! A chat as vLLM 0.32 hands it to the template (`renderers/chat_utils.py`,
//! the "string" content format): each message's text parts joined with
//! "\n", a missing content as "", Claude Code's billing header line taken
//! out of system text, an assistant's `reasoning` also as
//! `reasoning_content`. The other APIs build a [`Conversation`] of the same
//! [`Message`]s, as vLLM converts them to a chat.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::Unrendered;

/// Claude Code's per-request attribution line: vLLM drops it from system
/// text, since its hash changes every request.
pub(super) const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// What a template renders: the messages and the variables beside them.
#[derive(Default)]
pub(super) struct Conversation {
    pub messages: Vec<Message>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub reasoning_effort: Option<String>,
    /// `chat_template_kwargs`.
    pub kwargs: Map<String, Value>,
}

/// A Chat Completions message.
#[derive(Deserialize, Default)]
pub(super) struct Message {
    pub role: String,
    pub content: Option<Content>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<IgnoredAny>>,
    pub tool_call_id: Option<String>,
    pub reasoning: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Part {
    Text(String),
    Typed(TypedPart),
}

#[derive(Deserialize)]
pub(super) struct TypedPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    pub thinking: Option<String>,
    pub refusal: Option<String>,
}

impl Message {
    pub fn text(role: &str, text: String) -> Message {
        Message {
            role: role.into(),
            content: Some(Content::Text(text)),
            ..Message::default()
        }
    }

    /// The message as the template sees it.
    pub fn flattened(self) -> Result<Value, Unrendered> {
        if self.tool_calls.is_some_and(|calls| !calls.is_empty()) {
            return Err(Unrendered::Tools);
        }
        let parts = match self.content {
            None => Vec::new(),
            Some(Content::Text(t)) => vec![t],
            Some(Content::Parts(parts)) => parts
                .into_iter()
                .filter_map(|p| p.text().transpose())
                .collect::<Result<_, _>>()?,
        };
        let parts = if self.role == "system" {
            without_billing_header(parts)
        } else {
            parts
        };
        let mut m = Map::new();
        m.insert("role".into(), Value::from(self.role.as_str()));
        m.insert("content".into(), Value::from(parts.join("\n")));
        match self.role.as_str() {
            "assistant" => {
                if let Some(r) = self.reasoning {
                    m.insert("reasoning".into(), Value::from(r.as_str()));
                    m.insert("reasoning_content".into(), Value::from(r));
                }
            }
            "tool" => {
                if let Some(id) = self.tool_call_id {
                    m.insert("tool_call_id".into(), Value::from(id));
                }
            }
            "developer" => {
                m.insert("tools".into(), Value::Null);
            }
            _ => {}
        }
        if let Some(name) = self.name {
            m.insert("name".into(), Value::from(name));
        }
        Ok(Value::Object(m))
    }
}

impl Part {
    /// The part's text, `None` for a part vLLM skips.
    fn text(self) -> Result<Option<String>, Unrendered> {
        let p = match self {
            Part::Text(t) => return Ok(Some(t)),
            Part::Typed(p) => p,
        };
        match p.kind.as_str() {
            "text" => Ok(p.text),
            "refusal" => Ok(p.refusal),
            "input_text" | "output_text" => p.text.map(Some).ok_or(Unrendered::Failed),
            "thinking" => p.thinking.map(Some).ok_or(Unrendered::Failed),
            "tool_reference" => Err(Unrendered::Tools),
            _ => Err(Unrendered::NotText),
        }
    }
}

/// The messages of a template that does not name the developer role, as
/// vLLM hands them to it: developer messages made system ones, and every
/// system message's text merged into one first message (blank lines
/// between), if one is not first.
pub(super) fn developer_as_system(mut messages: Vec<Value>) -> Vec<Value> {
    for m in &mut messages {
        if m["role"] == "developer" {
            m["role"] = Value::from("system");
            if let Value::Object(map) = m {
                map.remove("tools");
            }
        }
    }
    if !messages.iter().skip(1).any(|m| m["role"] == "system") {
        return messages;
    }
    let (system, rest): (Vec<Value>, Vec<Value>) =
        messages.into_iter().partition(|m| m["role"] == "system");
    let text: Vec<&str> = system
        .iter()
        .filter_map(|m| m["content"].as_str())
        .filter(|t| !t.is_empty())
        .collect();
    let mut merged = Map::new();
    merged.insert("role".into(), Value::from("system"));
    merged.insert("content".into(), Value::from(text.join("\n\n")));
    std::iter::once(Value::Object(merged)).chain(rest).collect()
}

/// System text without the billing header line (a part that is only that
/// line goes).
fn without_billing_header(parts: Vec<String>) -> Vec<String> {
    parts
        .into_iter()
        .filter_map(|p| {
            if !p.starts_with(BILLING_HEADER) {
                return Some(p);
            }
            let rest = p.split_once('\n').map_or("", |(_, rest)| rest);
            (!rest.is_empty()).then(|| rest.to_string())
        })
        .collect()
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
    tools: Option<IgnoredAny>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    reasoning_effort: Option<String>,
    chat_template_kwargs: Option<Map<String, Value>>,
    cache_salt: Option<IgnoredAny>,
    documents: Option<IgnoredAny>,
    chat_template: Option<IgnoredAny>,
}

/// A Chat Completions body as a conversation.
pub(super) fn conversation(body: &[u8]) -> Result<Conversation, Unrendered> {
    let body: ChatBody = serde_json::from_slice(body).map_err(|_| Unrendered::Failed)?;
    if body.cache_salt.is_some() {
        return Err(Unrendered::Salted);
    }
    if body.tools.is_some() {
        return Err(Unrendered::Tools);
    }
    if body.documents.is_some() || body.chat_template.is_some() {
        return Err(Unrendered::Unsupported);
    }
    Ok(Conversation {
        messages: body.messages,
        add_generation_prompt: body.add_generation_prompt.unwrap_or(true),
        continue_final_message: body.continue_final_message.unwrap_or(false),
        reasoning_effort: body.reasoning_effort,
        kwargs: body.chat_template_kwargs.unwrap_or_default(),
    })
}
