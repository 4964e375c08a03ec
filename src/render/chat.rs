//! A chat as vLLM 0.32 hands it to the template (`renderers/chat_utils.py`,
//! the "string" content format): each message's text parts joined with
//! "\n", a missing content as "", Claude Code's billing header line taken
//! out of system text, an assistant's `reasoning` also as
//! `reasoning_content`, tool calls and tools as `tools.rs` says. The other
//! APIs build a [`Conversation`] of the same [`Message`]s, as vLLM converts
//! them to a chat.

use minijinja::Value;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Map;

use super::{tools, Unrendered};

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
    pub kwargs: Map<String, serde_json::Value>,
    /// The tools, as the template sees them once converted.
    pub tools: Option<tools::Tools>,
}

/// A Chat Completions message.
#[derive(Deserialize, Default)]
pub(super) struct Message {
    pub role: String,
    pub content: Option<Content>,
    pub name: Option<String>,
    /// As the template sees them (`tools::chat_call` makes them so).
    pub tool_calls: Option<Vec<Value>>,
    pub tool_call_id: Option<String>,
    pub reasoning: Option<String>,
    /// The old name of `reasoning`, taken when it is not set.
    pub reasoning_content: Option<String>,
}

/// A message as the template sees it: its role and text, then the other
/// fields vLLM sets, in vLLM's order.
pub(super) struct Flat {
    pub role: String,
    pub content: String,
    fields: Vec<(&'static str, Value)>,
}

impl Flat {
    pub fn value(self) -> Value {
        let head = [
            ("role", Value::from(self.role)),
            ("content", Value::from(self.content)),
        ];
        tools::map(head.into_iter().chain(self.fields))
    }
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
    /// A tool reference's tool.
    pub name: Option<String>,
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
    pub fn flattened(self) -> Result<Flat, Unrendered> {
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
        let mut fields = Vec::new();
        match self.role.as_str() {
            "assistant" => {
                if let Some(calls) = self.tool_calls.filter(|c| !c.is_empty()) {
                    fields.push(("tool_calls", Value::from(calls)));
                }
                if let Some(r) = self.reasoning.or(self.reasoning_content) {
                    fields.push(("reasoning", Value::from(r.as_str())));
                    fields.push(("reasoning_content", Value::from(r)));
                }
            }
            "tool" => {
                if let Some(id) = self.tool_call_id {
                    fields.push(("tool_call_id", Value::from(id)));
                }
            }
            _ => {}
        }
        if let Some(name) = self.name {
            fields.push(("name", Value::from(name)));
        }
        if self.role == "developer" {
            fields.push(("tools", Value::from(())));
        }
        Ok(Flat {
            role: self.role,
            content: parts.join("\n"),
            fields,
        })
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
            // The tool's name, for the template to expand.
            "tool_reference" => p.name.map(Some).ok_or(Unrendered::Failed),
            _ => Err(Unrendered::NotText),
        }
    }
}

/// The messages of a template that does not name the developer role, as
/// vLLM hands them to it: developer messages made system ones, and every
/// system message's text merged into one first message (blank lines
/// between), if one is not first.
pub(super) fn developer_as_system(mut messages: Vec<Flat>) -> Vec<Flat> {
    for m in &mut messages {
        if m.role == "developer" {
            m.role = "system".into();
            m.fields.retain(|(k, _)| *k != "tools");
        }
    }
    if !messages.iter().skip(1).any(|m| m.role == "system") {
        return messages;
    }
    let (system, rest): (Vec<Flat>, Vec<Flat>) =
        messages.into_iter().partition(|m| m.role == "system");
    let text: Vec<&str> = system
        .iter()
        .map(|m| m.content.as_str())
        .filter(|t| !t.is_empty())
        .collect();
    let merged = Flat {
        role: "system".into(),
        content: text.join("\n\n"),
        fields: Vec::new(),
    };
    std::iter::once(merged).chain(rest).collect()
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

/// The tool list borrowed: tens of KB of an agent's request, looked up
/// by its text in the lists kept (`tools.rs`), not copied.
#[derive(Deserialize)]
struct ChatBody<'a> {
    messages: Vec<Message>,
    #[serde(borrow)]
    tools: Option<&'a serde_json::value::RawValue>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    reasoning_effort: Option<String>,
    chat_template_kwargs: Option<Map<String, serde_json::Value>>,
    cache_salt: Option<IgnoredAny>,
    documents: Option<IgnoredAny>,
    chat_template: Option<IgnoredAny>,
}

/// A Chat Completions body as a conversation.
pub(super) fn conversation(body: &[u8], lists: &tools::Lists) -> Result<Conversation, Unrendered> {
    let body: ChatBody = serde_json::from_slice(body).map_err(|_| Unrendered::Failed)?;
    if body.cache_salt.is_some() {
        return Err(Unrendered::Salted);
    }
    if body.documents.is_some() || body.chat_template.is_some() {
        return Err(Unrendered::Unsupported);
    }
    let mut messages = body.messages;
    for m in &mut messages {
        if let Some(calls) = m.tool_calls.as_mut() {
            *calls = calls
                .iter()
                .map(tools::chat_call)
                .collect::<Result<_, _>>()?;
        }
    }
    let tools = match body.tools {
        // vLLM refuses an empty list.
        Some(raw) if tools::is_empty_list(raw) => return Err(Unrendered::Failed),
        Some(raw) => Some(lists.get(tools::Form::Chat, raw, |list| {
            list.iter().map(tools::chat_tool).collect()
        })),
        None => None,
    };
    Ok(Conversation {
        messages,
        tools,
        add_generation_prompt: body.add_generation_prompt.unwrap_or(true),
        continue_final_message: body.continue_final_message.unwrap_or(false),
        reasoning_effort: body.reasoning_effort,
        kwargs: body.chat_template_kwargs.unwrap_or_default(),
    })
}
