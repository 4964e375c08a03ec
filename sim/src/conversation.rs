//! A conversation as the prompt sees it, whichever API carried it.
//!
//! vLLM turns chat messages, Responses items and Anthropic messages into one
//! list of chat messages and renders that with the model's chat template, so
//! the same conversation is the same prompt (and the same cached prefix)
//! whether it came as `/v1/chat/completions`, `/v1/responses` or
//! `/v1/messages`. The simulator keeps that property: each API builds its
//! `Turn`s (system first, then messages in order, as vLLM converts them)
//! and its `Tool`s, and `render` is the one template (conf/byte-model's
//! chat_template.jinja):
//!
//! ```text
//! tools\n<name>: <description>\n ...       (if there are tools)
//! <role>\n<text>\n                          (each turn)
//!   call <name>\n<key>: <value>\n ...       (each of its tool calls: its
//!                                           string arguments, keys sorted
//!                                           as Jinja's dictsort sorts them)
//! ```

use serde_json::Value;

use crate::tokenize::PromptError;

/// One chat message reduced to what reaches the tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub role: String,
    pub text: String,
    pub calls: Vec<Call>,
}

impl Turn {
    pub fn new(role: impl Into<String>, text: impl Into<String>) -> Self {
        Turn {
            role: role.into(),
            text: text.into(),
            calls: Vec::new(),
        }
    }
}

/// A tool call as the template shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    /// The string arguments, by key.
    pub args: Vec<(String, String)>,
}

impl Call {
    /// A call of `name` with `arguments`: an object, or (as chat and
    /// Responses send them) a JSON text of one; anything else is none, as
    /// vLLM makes it.
    pub fn new(name: &str, arguments: Option<&Value>) -> Call {
        let parsed;
        let object = match arguments {
            Some(Value::String(text)) => {
                parsed = serde_json::from_str::<Value>(text).ok();
                parsed.as_ref().and_then(Value::as_object)
            }
            Some(v) => v.as_object(),
            None => None,
        };
        let mut args: Vec<(String, String)> = object
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        args.sort_by_key(|(k, _)| k.to_lowercase());
        Call {
            name: name.to_string(),
            args,
        }
    }
}

/// A tool as the template shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
}

impl Tool {
    /// The tool whose name and description are `name` and `description`
    /// of `v`.
    pub fn of(v: &Value, name: &str) -> Tool {
        Tool {
            name: name.to_string(),
            description: v
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
        }
    }
}

/// The simulator's chat template.
pub fn render(tools: &[Tool], turns: &[Turn]) -> String {
    let mut out = String::new();
    if !tools.is_empty() {
        out.push_str("tools\n");
        for t in tools {
            out.push_str(&t.name);
            out.push_str(": ");
            // Python prints None.
            out.push_str(t.description.as_deref().unwrap_or("None"));
            out.push('\n');
        }
    }
    for t in turns {
        out.push_str(&t.role);
        out.push('\n');
        out.push_str(&t.text);
        out.push('\n');
        for c in &t.calls {
            out.push_str("call ");
            out.push_str(&c.name);
            out.push('\n');
            for (k, v) in &c.args {
                out.push_str(k);
                out.push_str(": ");
                out.push_str(v);
                out.push('\n');
            }
        }
    }
    out
}

/// Text of a message `content`: a string, or the `text` of each part of an
/// array joined with "\n", as vLLM joins them (images and other parts
/// have no text here); `None` for any other JSON type.
pub fn content_text(content: Option<&Value>) -> Option<String> {
    match content {
        None | Some(Value::Null) => Some(String::new()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Some(_) => None,
    }
}

/// The tools of a chat request, as vLLM hands them to the template.
pub fn chat_tools(body: &Value) -> Vec<Tool> {
    let tools = body.get("tools").and_then(Value::as_array);
    tools
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let f = t.get("function")?;
            Some(Tool::of(f, f.get("name")?.as_str()?))
        })
        .collect()
}

/// Turns of a chat request's `messages`.
pub fn chat_turns(body: &Value) -> Result<Vec<Turn>, PromptError> {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| PromptError("'messages' must be a non-empty array".into()))?;
    messages
        .iter()
        .map(|m| {
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| PromptError("each message needs a string 'role'".into()))?;
            let text = content_text(m.get("content")).ok_or_else(|| {
                PromptError("message 'content' must be a string or an array".into())
            })?;
            let mut turn = Turn::new(role, text);
            let calls = m.get("tool_calls").and_then(Value::as_array);
            for call in calls.into_iter().flatten() {
                let f = call.get("function").unwrap_or(&Value::Null);
                let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
                turn.calls.push(Call::new(name, f.get("arguments")));
            }
            Ok(turn)
        })
        .collect()
}

/// Prompt text of a chat request.
pub fn chat_prompt(body: &Value) -> Result<String, PromptError> {
    chat_turns(body).map(|t| render(&chat_tools(body), &t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_prompt_concatenates_role_and_content() {
        let body = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "image_url"}, {"type": "text", "text": "there"}]}
        ]});
        assert_eq!(
            chat_prompt(&body).unwrap(),
            "system\nbe brief\nuser\nhi \nthere\n"
        );
        assert!(chat_prompt(&json!({"messages": []})).is_err());
        assert!(chat_prompt(&json!({})).is_err());
        assert!(chat_prompt(&json!({"messages": [{"role": "user", "content": 3}]})).is_err());
    }

    #[test]
    fn tools_and_tool_calls_render_as_the_byte_models_template() {
        let body = json!({"tools": [{"type": "function", "function": {"name": "read", "parameters": {}}}],
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "read", "arguments": "{\"path\": \"a\", \"n\": 1, \"B\": \"x\"}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "r"}]});
        // As transformers renders conf/byte-model's template (make_model.py
        // checks the same).
        assert_eq!(
            chat_prompt(&body).unwrap(),
            "tools\nread: None\nuser\nq\nassistant\n\ncall read\nB: x\npath: a\ntool\nr\n"
        );
    }

    /// One conversation sent through each API in turn: every request after
    /// the first finds the whole prefix the previous ones cached.
    #[tokio::test]
    async fn a_conversation_is_cached_across_apis() {
        let sim = crate::testkit::start(&[]).await;
        let system = "r".repeat(250);
        let chat = json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "first question"}], "max_tokens": 2});
        let r = sim.post("/v1/chat/completions", &chat.to_string()).await;
        // "system\n" + 250 + "\nuser\nfirst question\n": 278 bytes, 70 tokens.
        assert_eq!(r.json()["usage"]["prompt_tokens"], 70);
        let responses =
            json!({"instructions": system, "input": "first question", "max_output_tokens": 2});
        let r = sim.post("/v1/responses", &responses.to_string()).await;
        assert_eq!(
            r.json()["usage"]["input_tokens_details"]["cached_tokens"],
            64
        );
        let messages = json!({"model": "sim-model", "system": system, "max_tokens": 2, "messages": [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": " tok tok"},
            {"role": "user", "content": "second question, please"}]});
        let r = sim.post("/v1/messages", &messages.to_string()).await;
        assert_eq!(r.json()["usage"]["cache_read_input_tokens"], 64);
        let count = sim
            .post("/v1/messages/count_tokens", &messages.to_string())
            .await
            .json()["input_tokens"]
            .clone();
        let r = sim.post("/v1/responses", &json!({"instructions": system, "input": [
            {"role": "user", "content": "first question"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": " tok tok"}]},
            {"role": "user", "content": "second question, please"}], "max_output_tokens": 2}).to_string()).await;
        let v = r.json();
        assert_eq!(v["usage"]["input_tokens"], count);
        // 278 + "assistant\n tok tok\nuser\nsecond question, please\n" (48)
        // = 326 bytes, 82 tokens: the 5 full blocks the Messages request
        // cached.
        assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 80);
    }
}
