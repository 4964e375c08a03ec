//! An Anthropic Messages request as the chat vLLM 0.32 converts it to
//! (`entrypoints/anthropic/serving.py`, `to_chat_completion_request`):
//!
//! ```text
//! system (a string, or its text blocks joined with "") -> the first message
//!     (a block that is Claude Code's billing header is left out)
//! a system message among the messages -> a system message where it stands,
//!     or merged into the first one when the template rejects a system
//!     message after the first (vLLM probes the template: Renderer::load)
//! content blocks: text -> parts (one part -> a string), thinking -> the
//!     message's reasoning; a user message left without text is dropped
//! thinking {type: disabled} -> reasoning_effort as vLLM probes it;
//!     output_config.effort -> reasoning_effort
//! tool_use -> a tool call of the assistant message
//! tool_result in a user turn -> a tool message (its text blocks joined with
//!     "\n") before the user message of the turn's other blocks
//! tools -> tools (`tools.rs`)
//! tool_reference in a tool result -> the tools' names, in a tool message
//!     after the result's
//! tool_addition, tool_removal blocks -> the tools in effect at the end
//! ```
//!
//! Not rendered: images, a tool result in an assistant turn of a list
//! (vLLM writes Python's repr of it), a tool use without an id (vLLM makes
//! one of the clock).

use minijinja::Value;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Map;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::chat::{Content, Conversation, Message, Part, BILLING_HEADER};
use super::{tools, Unrendered};

/// The tool list borrowed: tens of KB of an agent's request, looked up
/// by its text in the lists kept (`tools.rs`), not copied.
#[derive(Deserialize)]
struct Body<'a> {
    system: Option<Blocks>,
    messages: Vec<Turn>,
    #[serde(borrow)]
    tools: Option<&'a serde_json::value::RawValue>,
    thinking: Option<Thinking>,
    output_config: Option<OutputConfig>,
    chat_template_kwargs: Option<Map<String, serde_json::Value>>,
    cache_salt: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Turn {
    role: String,
    content: Blocks,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Blocks {
    Text(String),
    List(Vec<Block>),
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    thinking: Option<String>,
    source: Option<IgnoredAny>,
    id: Option<String>,
    name: Option<String>,
    input: Option<Value>,
    tool_use_id: Option<String>,
    content: Option<ResultContent>,
    /// A tool added or removed.
    tool: Option<Value>,
}

/// A tool result's content.
#[derive(Deserialize)]
#[serde(untagged)]
enum ResultContent {
    Text(String),
    List(Vec<ResultItem>),
}

#[derive(Deserialize)]
struct ResultItem {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    tool_name: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct OutputConfig {
    effort: Option<String>,
}

/// How the template and vLLM's probes of it shape a conversion.
pub(super) struct Probed {
    /// The template rejects a system message after the first.
    pub merge_inline_system: bool,
    /// The reasoning effort `thinking: {type: disabled}` stands for.
    pub disabled_effort: &'static str,
}

/// A Messages body as a conversation.
pub(super) fn conversation(
    body: &[u8],
    probed: &Probed,
    lists: &tools::Lists,
) -> Result<Conversation, Unrendered> {
    let body: Body = serde_json::from_slice(body).map_err(|_| Unrendered::Failed)?;
    if body.cache_salt.is_some() {
        return Err(Unrendered::Salted);
    }
    let convert: tools::Convert = |list| list.iter().map(tools::messages_tool).collect();
    let tools = match body.tools {
        // Tools added or removed by the messages: the list they make, kept
        // by the list and the changes.
        Some(raw) if changes(&body.messages).next().is_some() => {
            let changes = changes(&body.messages).collect::<Result<Vec<_>, _>>()?;
            let mut key = tools::key(tools::Form::Messages, raw);
            for c in &changes {
                let text = serde_json::to_vec(&c.tool).map_err(|_| Unrendered::Failed)?;
                key = xxh3_64_with_seed(&text, key ^ u64::from(c.added));
            }
            Some(lists.find(key, raw, move |list| convert(with_changes(list, changes)?)))
        }
        Some(raw) => Some(lists.get(tools::Form::Messages, raw, convert)),
        None => None,
    };
    let mut system: Vec<String> = match body.system {
        None => Vec::new(),
        Some(Blocks::Text(t)) => vec![t],
        Some(Blocks::List(blocks)) => system_texts(blocks),
    };
    if probed.merge_inline_system {
        for turn in body.messages.iter().filter(|t| t.role == "system") {
            system.extend(inline_system(&turn.content));
        }
    }
    let mut messages = Vec::new();
    let system = system.concat();
    if !system.is_empty() {
        messages.push(Message::text("system", system));
    }
    for turn in body.messages {
        if turn.role == "system" {
            if !probed.merge_inline_system {
                if let Some(text) = inline_system(&turn.content) {
                    messages.push(Message::text("system", text));
                }
            }
            continue;
        }
        add(&mut messages, turn)?;
    }
    let mut effort = body.output_config.and_then(|c| c.effort);
    if body.thinking.is_some_and(|t| t.kind == "disabled") {
        effort = Some(probed.disabled_effort.to_string());
    }
    Ok(Conversation {
        messages,
        add_generation_prompt: true,
        continue_final_message: false,
        reasoning_effort: effort,
        kwargs: body.chat_template_kwargs.unwrap_or_default(),
        tools,
    })
}

/// The text of system blocks, without the billing header.
fn system_texts(blocks: Vec<Block>) -> Vec<String> {
    blocks
        .into_iter()
        .filter(|b| b.kind == "text")
        .filter_map(|b| b.text)
        .filter(|t| !t.is_empty() && !t.starts_with(BILLING_HEADER))
        .collect()
}

/// The text of a system message among the messages, if any.
fn inline_system(content: &Blocks) -> Option<String> {
    let text = match content {
        Blocks::Text(t) if t.starts_with(BILLING_HEADER) => return None,
        Blocks::Text(t) => t.clone(),
        Blocks::List(blocks) => blocks
            .iter()
            .filter(|b| b.kind == "text")
            .filter_map(|b| b.text.as_deref())
            .filter(|t| !t.is_empty() && !t.starts_with(BILLING_HEADER))
            .collect(),
    };
    (!text.is_empty()).then_some(text)
}

/// A user or assistant turn as chat messages: its tool results as tool
/// messages, then the turn's own message (a user turn left with nothing
/// is dropped).
fn add(messages: &mut Vec<Message>, turn: Turn) -> Result<(), Unrendered> {
    let blocks = match turn.content {
        Blocks::Text(t) => {
            messages.push(Message::text(&turn.role, t));
            return Ok(());
        }
        Blocks::List(blocks) => blocks,
    };
    let mut parts = Vec::new();
    let mut reasoning: Option<String> = None;
    let mut calls = Vec::new();
    for b in blocks {
        match b.kind.as_str() {
            "text" => {
                if let Some(text) = b.text.filter(|t| !t.is_empty()) {
                    parts.push(text);
                }
            }
            "image" if b.source.is_some() => return Err(Unrendered::NotText),
            "thinking" => {
                if let Some(t) = b.thinking {
                    reasoning.get_or_insert_with(String::new).push_str(&t);
                }
            }
            "tool_use" => {
                let id =
                    b.id.filter(|id| !id.is_empty())
                        .ok_or(Unrendered::Unsupported)?;
                let name = Value::from(b.name.unwrap_or_default());
                let input = b.input.filter(|i| !i.is_none());
                let arguments = tools::arguments(Some(input.unwrap_or(Value::from(()))))?;
                calls.push(tools::call(Value::from(id), name, arguments, false));
            }
            "tool_result" if turn.role == "user" => {
                let (text, references) = result_text(b.content)?;
                let id = b.tool_use_id.unwrap_or_default();
                // The tools it references, in a tool message of their own.
                let references = (!references.is_empty()).then(|| references.join("\n"));
                for content in std::iter::once(text).chain(references) {
                    let mut m = Message::text("tool", content);
                    m.tool_call_id = Some(id.clone());
                    messages.push(m);
                }
            }
            "tool_result" => match b.content {
                Some(ResultContent::Text(t)) => parts.push(format!("Tool result: {t}")),
                None => parts.push("Tool result: ".into()),
                // vLLM writes Python's repr of the list.
                Some(ResultContent::List(_)) => return Err(Unrendered::Unsupported),
            },
            // vLLM skips what else a client echoes (redacted thinking,
            // tool references, unknown blocks).
            _ => {}
        }
    }
    if parts.is_empty() && turn.role == "user" {
        return Ok(());
    }
    let content = match parts.len() {
        0 => None,
        1 => parts.pop().map(Content::Text),
        _ => Some(Content::Parts(parts.into_iter().map(Part::Text).collect())),
    };
    messages.push(Message {
        role: turn.role,
        content,
        reasoning,
        tool_calls: (!calls.is_empty()).then_some(calls),
        ..Message::default()
    });
    Ok(())
}

/// A tool result's text (a string, or its text items joined with "\n"),
/// and the tools it references.
fn result_text(content: Option<ResultContent>) -> Result<(String, Vec<String>), Unrendered> {
    let items = match content {
        None => return Ok(Default::default()),
        Some(ResultContent::Text(t)) => return Ok((t, Vec::new())),
        Some(ResultContent::List(items)) => items,
    };
    let mut texts = Vec::new();
    let mut references = Vec::new();
    for item in items {
        match item.kind.as_deref() {
            Some("text") => texts.push(item.text.unwrap_or_default()),
            Some("image") => return Err(Unrendered::NotText),
            Some("tool_reference") => references.extend(item.tool_name.or(item.name)),
            _ => {}
        }
    }
    Ok((texts.join("\n"), references))
}

/// A tool added or removed by a block of the messages.
struct Change {
    added: bool,
    tool: Value,
}

/// The blocks that add or remove a tool, in the messages' order.
fn changes(turns: &[Turn]) -> impl Iterator<Item = Result<Change, Unrendered>> + '_ {
    let blocks = turns.iter().flat_map(|t| match &t.content {
        Blocks::List(blocks) => blocks.as_slice(),
        Blocks::Text(_) => &[],
    });
    blocks
        .filter(|b| matches!(b.kind.as_str(), "tool_addition" | "tool_removal"))
        .map(|b| {
            Ok(Change {
                added: b.kind == "tool_addition",
                tool: b.tool.clone().ok_or(Unrendered::Failed)?,
            })
        })
}

/// The tools in effect at the conversation's end, as vLLM resolves them
/// (`_resolve_tools`): blocks `tool_addition` (of a tool defined by value,
/// or of one of `tools`, then no longer deferred) and `tool_removal`, in
/// the messages' order.
fn with_changes(tools: Vec<Value>, changes: Vec<Change>) -> Result<Vec<Value>, Unrendered> {
    let name = |tool: &Value| {
        let name = tools::field(tool, "name").ok_or(Unrendered::Failed)?;
        name.as_str().map(str::to_string).ok_or(Unrendered::Failed)
    };
    // A dict of Python's: a name given again keeps its place.
    let mut by_name = indexmap::IndexMap::new();
    for t in tools {
        by_name.insert(name(&t)?, t);
    }
    let mut removed = Vec::new();
    for Change {
        added,
        tool: change,
    } in changes
    {
        let kind = tools::field(&change, "type");
        let n = match kind.as_ref().and_then(Value::as_str) {
            Some("tool_definition") => {
                let definition = tools::field(&change, "definition").ok_or(Unrendered::Failed)?;
                let n = name(&definition)?;
                by_name.insert(n.clone(), definition);
                n
            }
            Some("tool_reference") => {
                let n = name(&change)?;
                // vLLM refuses a reference to a tool not declared.
                let tool = by_name.get_mut(&n).ok_or(Unrendered::Failed)?;
                if added {
                    *tool = tools::without(tool, "defer_loading")?;
                }
                n
            }
            _ => return Err(Unrendered::Failed),
        };
        removed.retain(|r| *r != n);
        if !added {
            removed.push(n);
        }
    }
    Ok(by_name
        .into_iter()
        .filter(|(n, _)| !removed.contains(n))
        .map(|(_, t)| t)
        .collect())
}
