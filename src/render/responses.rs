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
//!     a function call (a custom tool's call) -> a tool call of the
//!       assistant message just before it, or of one of its own
//!     a function call's output -> a tool message
//! the last item a message still in progress -> continue_final_message
//! reasoning.effort -> reasoning_effort
//! tools -> tools (`tools.rs`)
//! ```
//!
//! Not rendered: a request that continues a stored response or
//! conversation (the prompt holds what the gateway never saw), encrypted
//! reasoning, a stored prompt.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::chat::{Content, Conversation, Message};
use super::{tools, Unrendered};

/// The tool list borrowed: tens of KB of an agent's request, looked up
/// by its text in the lists kept (`tools.rs`), not copied.
#[derive(Deserialize)]
struct Body<'a> {
    input: Input,
    instructions: Option<String>,
    previous_response_id: Option<IgnoredAny>,
    conversation: Option<IgnoredAny>,
    prompt: Option<IgnoredAny>,
    #[serde(borrow)]
    tools: Option<&'a serde_json::value::RawValue>,
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
pub(super) fn conversation(body: &[u8], lists: &tools::Lists) -> Result<Conversation, Unrendered> {
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
    let tools = body.tools.filter(|t| !tools::is_empty_list(t)).map(|raw| {
        lists.get(tools::Form::Responses, raw, |list| {
            let each = list.iter().map(tools::responses_tools);
            Ok(each.collect::<Result<Vec<_>, _>>()?.concat())
        })
    });
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
        tools,
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
        Some(kind @ ("function_call" | "custom_tool_call")) => {
            return tool_call(messages, &item, kind == "custom_tool_call")
        }
        Some("function_call_output" | "custom_tool_call_output") => {
            return tool_output(messages, item)
        }
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

/// A function call (or a custom tool's) as a tool call of the assistant
/// message before it, or of one of its own.
fn tool_call(
    messages: &mut Vec<Message>,
    item: &Map<String, Value>,
    custom: bool,
) -> Result<(), Unrendered> {
    let text = |key: &str| {
        item.get(key)
            .and_then(Value::as_str)
            .ok_or(Unrendered::Failed)
    };
    let name = match item.get("namespace").and_then(Value::as_str) {
        Some(space) if !custom => tools::namespaced(&space.into(), &text("name")?.into())?.into(),
        _ => minijinja::Value::from(text("name")?),
    };
    let arguments = match custom {
        true => tools::custom_arguments(item.get("input").and_then(Value::as_str).unwrap_or("")),
        false => tools::arguments(Some(text("arguments")?.into()))?,
    };
    let call = tools::call(text("call_id")?.into(), name, arguments, true);
    match messages.last_mut() {
        Some(prev) if prev.role == "assistant" => {
            prev.tool_calls.get_or_insert_with(Vec::new).push(call);
        }
        _ => messages.push(Message {
            role: "assistant".into(),
            tool_calls: Some(vec![call]),
            ..Message::default()
        }),
    }
    Ok(())
}

/// A function call's output as a tool message.
fn tool_output(messages: &mut Vec<Message>, item: Map<String, Value>) -> Result<(), Unrendered> {
    let content = match item.get("output") {
        Some(output) => {
            Some(serde_json::from_value(output.clone()).map_err(|_| Unrendered::Failed)?)
        }
        None => None,
    };
    messages.push(Message {
        role: "tool".into(),
        content,
        tool_call_id: item
            .get("call_id")
            .and_then(Value::as_str)
            .map(str::to_string),
        ..Message::default()
    });
    Ok(())
}
