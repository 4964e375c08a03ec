//! A conversation as the prompt sees it, whichever API carried it.
//!
//! vLLM turns chat messages, Responses items and Anthropic messages into one
//! list of chat messages and renders that with the model's chat template, so
//! the same conversation is the same prompt (and the same cached prefix)
//! whether it came as `/v1/chat/completions`, `/v1/responses` or
//! `/v1/messages`. The simulator keeps that property: each API builds its
//! `Turn`s (system first, then messages in order) and `render` is the one
//! template, `<role>\n<text>\n` per turn.

use serde_json::Value;

use crate::tokenize::PromptError;

/// One chat message reduced to what reaches the tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub role: String,
    pub text: String,
}

impl Turn {
    pub fn new(role: impl Into<String>, text: impl Into<String>) -> Self {
        Turn {
            role: role.into(),
            text: text.into(),
        }
    }
}

/// The simulator's chat template: `<role>\n<text>\n` for each turn.
pub fn render(turns: &[Turn]) -> String {
    let mut out =
        String::with_capacity(turns.iter().map(|t| t.role.len() + t.text.len() + 2).sum());
    for t in turns {
        out.push_str(&t.role);
        out.push('\n');
        out.push_str(&t.text);
        out.push('\n');
    }
    out
}

/// Text of a message `content`: a string, or the `text` of each part of an
/// array joined with nothing (images and other parts have no text here);
/// `None` for any other JSON type.
pub fn content_text(content: Option<&Value>) -> Option<String> {
    match content {
        None | Some(Value::Null) => Some(String::new()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        ),
        Some(_) => None,
    }
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
            Ok(Turn::new(role, text))
        })
        .collect()
}

/// Prompt text of a chat request.
pub fn chat_prompt(body: &Value) -> Result<String, PromptError> {
    chat_turns(body).map(|t| render(&t))
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
            "system\nbe brief\nuser\nhi there\n"
        );
        assert!(chat_prompt(&json!({"messages": []})).is_err());
        assert!(chat_prompt(&json!({})).is_err());
        assert!(chat_prompt(&json!({"messages": [{"role": "user", "content": 3}]})).is_err());
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
