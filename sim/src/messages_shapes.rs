//! JSON of vLLM 0.32's Anthropic Messages API (`entrypoints/anthropic/`):
//! the message, its usage, the stream's events, errors. Key order is the
//! pydantic classes'; keys vLLM leaves out (`exclude_none` /
//! `exclude_unset`) are skipped here. See docs/vllm-apis.md.

use serde::Serialize;

use crate::common::ApiError;

/// `AnthropicUsage`. The cache keys are absent where vLLM had no cache
/// details yet (the stream's `message_start`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<usize>,
}

impl Usage {
    /// vLLM's `_build_anthropic_usage` with prompt token details on:
    /// Anthropic's input excludes what was read from or written to the
    /// cache, so `input = prompt - cached - created`.
    pub fn split(prompt: usize, cached: usize, created: usize, output: usize) -> Self {
        Usage {
            input_tokens: prompt.saturating_sub(cached + created),
            output_tokens: output,
            cache_creation_input_tokens: Some(created),
            cache_read_input_tokens: Some(cached),
        }
    }

    /// The first chat chunk's usage, which has no details: the whole
    /// prompt as input, no cache keys.
    pub fn whole_prompt(prompt: usize) -> Self {
        Usage {
            input_tokens: prompt,
            output_tokens: 0,
            cache_creation_input_tokens: None,
            cache_read_input_tokens: None,
        }
    }
}

/// `AnthropicContentBlock` of type text.
#[derive(Debug, Clone, Serialize)]
pub struct TextBlock<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: &'a str,
}

impl<'a> TextBlock<'a> {
    pub fn new(text: &'a str) -> Self {
        TextBlock { kind: "text", text }
    }
}

/// `AnthropicMessagesResponse` as the non-streamed answer (nulls left out).
#[derive(Debug, Serialize)]
pub struct Message<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub content: Vec<TextBlock<'a>>,
    pub model: &'a str,
    pub stop_reason: &'static str,
    pub usage: Usage,
}

/// The message inside `message_start`: empty, with explicit nulls.
#[derive(Debug, Serialize)]
pub struct StartMessage<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub content: [(); 0],
    pub model: &'a str,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<&'static str>,
    pub usage: Usage,
}

/// `AnthropicStreamEvent`: `type` first, then only the fields set.
#[derive(Debug, Serialize)]
pub struct Event<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<StartMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<Delta<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_block: Option<TextBlock<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl<'a> Event<'a> {
    pub fn new(kind: &'static str) -> Self {
        Event {
            kind,
            message: None,
            delta: None,
            content_block: None,
            index: None,
            usage: None,
        }
    }
}

/// `AnthropicDelta`: a text delta, or the stop reason of `message_delta`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Delta<'a> {
    Text {
        #[serde(rename = "type")]
        kind: &'static str,
        text: &'a str,
    },
    Stop {
        stop_reason: &'static str,
        stop_sequence: Option<&'static str>,
    },
}

/// `/v1/messages/count_tokens`.
#[derive(Debug, Serialize)]
pub struct CountTokens {
    pub input_tokens: usize,
    pub context_management: ContextManagement,
}

#[derive(Debug, Serialize)]
pub struct ContextManagement {
    pub original_input_tokens: usize,
}

/// `AnthropicErrorResponse`: what vLLM's `translate_error_response` makes
/// of an error from the handler (model, context, engine); the status stays.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub error: ErrorInfo,
}

#[derive(Debug, Serialize)]
pub struct ErrorInfo {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
}

impl From<ApiError> for ErrorBody {
    fn from(e: ApiError) -> Self {
        ErrorBody {
            kind: "error",
            error: ErrorInfo {
                kind: e.kind,
                message: e.message,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_leaves_out_missing_cache_keys() {
        assert_eq!(
            serde_json::to_string(&Usage::whole_prompt(2714)).unwrap(),
            r#"{"input_tokens":2714,"output_tokens":0}"#
        );
        // The team's observation on a real 0.32 (block size 128).
        assert_eq!(
            serde_json::to_string(&Usage::split(2714, 2688, 0, 5)).unwrap(),
            r#"{"input_tokens":26,"output_tokens":5,"cache_creation_input_tokens":0,"cache_read_input_tokens":2688}"#
        );
        assert_eq!(Usage::split(2714, 0, 2688, 5).input_tokens, 26);
    }

    #[test]
    fn deltas_serialize_as_vllm_sends_them() {
        let mut e = Event::new("message_delta");
        e.delta = Some(Delta::Stop {
            stop_reason: "max_tokens",
            stop_sequence: None,
        });
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null}}"#
        );
        let mut e = Event::new("content_block_delta");
        e.delta = Some(Delta::Text {
            kind: "text_delta",
            text: " tok",
        });
        e.index = Some(0);
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":" tok"},"index":0}"#
        );
    }
}
