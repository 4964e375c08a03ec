//! A Responses request as the chat vLLM 0.32 builds for it
//! (`entrypoints/openai/responses/utils.py`, `construct_input_messages`):
//!
//! ```text
//! instructions -> the first message, a system one
//! input: a string -> a user message; a list of items ->
//!     an assistant message item -> its first part's text (merged into an
//!       assistant message just before it that has no content yet)
//!     any other item with a role -> a chat message as it is
//!     a reasoning item -> its text (else its summary's) as the reasoning of
//!       the assistant message just before it, or of one of its own
//! the last item a message still in progress -> continue_final_message
//! reasoning.effort -> reasoning_effort
//! ```
//!
//! Not rendered: a request that continues a stored response or
//! conversation (the prompt holds what the gateway never saw), tools,
//! function calls and their outputs, encrypted reasoning, a stored prompt.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::chat::{Content, Conversation, Message};
use super::Unrendered;

#[derive(Deserialize)]
struct Body {
    input: Input,
    instructions: Option<String>,
    previous_response_id: Option<IgnoredAny>,
    conversation: Option<IgnoredAny>,
    prompt: Option<IgnoredAny>,
    tools: Option<Vec<IgnoredAny>>,
    reasoning: Option<Reasoning>,
    chat_template_kwargs: Option<Map<String, Value>>,
    cache_salt: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<Map<String, Value>>),
}

#[derive(Deserialize)]
struct Reasoning {
    effort: Option<String>,
}

/// A Responses body as a conversation.
pub(super) fn conversation(body: &[u8]) -> Result<Conversation, Unrendered> {
    let body: Body = serde_json::from_slice(body).map_err(|_| Unrendered::Failed)?;
    if body.cache_salt.is_some() {
        return Err(Unrendered::Salted);
    }
    if body.previous_response_id.is_some() || body.conversation.is_some() {
        return Err(Unrendered::Stored);
    }
    if body.prompt.is_some() {
        return Err(Unrendered::Unsupported);
    }
    if body.tools.is_some_and(|t| !t.is_empty()) {
        return Err(Unrendered::Tools);
    }
    let mut messages = Vec::new();
    if let Some(text) = body.instructions.filter(|t| !t.is_empty()) {
        messages.push(Message::text("system", text));
    }
    let mut continued = false;
    match body.input {
        Input::Text(text) => messages.push(Message::text("user", text)),
        Input::Items(items) => {
            continued = items.last().is_some_and(in_progress);
            for item in items {
                add(&mut messages, item)?;
            }
        }
    }
    Ok(Conversation {
        messages,
        add_generation_prompt: !continued,
        continue_final_message: continued,
        reasoning_effort: body.reasoning.and_then(|r| r.effort),
        kwargs: body.chat_template_kwargs.unwrap_or_default(),
    })
}

/// A message (or reasoning) the client left unfinished, for the model to
/// continue.
fn in_progress(item: &Map<String, Value>) -> bool {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    let status = item.get("status").and_then(Value::as_str);
    matches!(kind, "message" | "reasoning") && matches!(status, Some("in_progress" | "incomplete"))
}

fn add(messages: &mut Vec<Message>, item: Map<String, Value>) -> Result<(), Unrendered> {
    match item.get("type").and_then(Value::as_str) {
        Some(
            "function_call"
            | "custom_tool_call"
            | "function_call_output"
            | "custom_tool_call_output",
        ) => return Err(Unrendered::Tools),
        Some("reasoning") => return reasoning(messages, &item),
        _ => {}
    }
    if item.get("role").and_then(Value::as_str) == Some("assistant") {
        let text = match item.get("content") {
            Some(Value::String(t)) => Some(t.clone()),
            Some(Value::Array(parts)) => parts
                .first()
                .and_then(|p| p.get("text"))
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        };
        if let Some(text) = text {
            match messages.last_mut() {
                Some(prev) if prev.role == "assistant" && prev.content.is_none() => {
                    prev.content = Some(Content::Text(text));
                }
                _ => messages.push(Message::text("assistant", text)),
            }
            return Ok(());
        }
    }
    if !item.contains_key("role") {
        return Err(Unrendered::Failed);
    }
    let m = serde_json::from_value(Value::Object(item)).map_err(|_| Unrendered::Failed)?;
    messages.push(m);
    Ok(())
}

fn reasoning(messages: &mut Vec<Message>, item: &Map<String, Value>) -> Result<(), Unrendered> {
    if item.get("encrypted_content").is_some_and(|c| !c.is_null()) {
        return Err(Unrendered::Unsupported);
    }
    let first_text = |field: &str| {
        item.get(field)
            .and_then(Value::as_array)
            .and_then(|parts| parts.first())
            .and_then(|p| p.get("text"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let text = first_text("content")
        .or_else(|| first_text("summary"))
        .unwrap_or_default();
    match messages.last_mut() {
        Some(prev) if prev.role == "assistant" && prev.reasoning.is_none() => {
            prev.reasoning = Some(text);
        }
        _ => messages.push(Message {
            role: "assistant".into(),
            reasoning: Some(text),
            ..Message::default()
        }),
    }
    Ok(())
}
