//! The agent APIs vLLM serves, and how each reports one request's tokens:
//! which usage fields make the prompt vLLM processed (its counter
//! `vllm:prompt_tokens_total`), the part of it served from the prefix cache
//! (`vllm:prefix_cache_hits_total`), and the output; where a stream carries
//! them; and, for the Responses API, where the response's id is.
//!
//! - [`Dialect::Completions`] reads `usage.prompt_tokens`,
//!   `usage.prompt_tokens_details.cached_tokens` (only with
//!   `--enable-prompt-tokens-details`), `usage.completion_tokens`, in the
//!   body or in the stream chunks that carry `usage` (the last one with
//!   `"choices": []`).
//! - [`Dialect::Responses`] reads `usage.input_tokens`, the whole prompt,
//!   `usage.input_tokens_details.cached_tokens` the hits, `usage.output_tokens`
//!   the output; over a tool loop vLLM sums every engine call, as its counters
//!   do. A stream reports usage only in `response.completed`
//!   (`data.response.usage`; `response.created` and `response.in_progress`
//!   send `null`). The id is the body's `id` and the stream's
//!   `data.response.id`, first sent in `response.created`.
//!   Checked in `vllm/entrypoints/openai/responses/serving.py`
//!   (`responses_full_generator` builds `ResponseUsage` from
//!   `num_prompt_tokens` and `num_cached_tokens`, cached tokens reported with
//!   or without `--enable-prompt-tokens-details`; `responses_stream_generator`
//!   opens with `response.created`, `usage=None`, and closes with
//!   `response.completed` whatever the status), `.../responses/protocol.py`
//!   (`ResponsesResponse`: `id` first, `usage` after `output`) and
//!   `.../responses/api_router.py` (`event: <type>` then `data: <json>`).
//! - [`Dialect::Messages`] (Anthropic) reads `input_tokens` as Anthropic means
//!   it: the prompt tokens neither read from nor written to the cache. The
//!   prompt is `input_tokens + cache_read_input_tokens +
//!   cache_creation_input_tokens` (an absent cache field adds 0), the hits
//!   `cache_read_input_tokens` (absent: unknown), the output `output_tokens`.
//!   vLLM serves Messages by converting to a chat completion and back
//!   (`vllm/entrypoints/anthropic/serving.py`: `messages_full_converter`,
//!   `message_stream_converter`; `.../anthropic/protocol.py`:
//!   `AnthropicUsage`, both cache fields optional). Older vLLM writes
//!   `input_tokens` = `prompt_tokens` and no cache fields; 0.32 writes the
//!   split (a 2,714-token prompt: 26 + 2,688 read, or 26 + 2,688 created on
//!   its first turn) and leaves the cache fields out when it does not know
//!   the hits. The sum is the whole prompt either way. A stream's
//!   `message_start` (`data.message.usage`) comes before any output, from
//!   the first chat chunk: `input_tokens` is the whole prompt and
//!   `output_tokens` a placeholder 0, so only its prompt counts; the split
//!   and the output come in `message_delta` (`data.usage`). A stream cut
//!   before `message_delta` leaves the prompt known, hits and output unknown.
//!
//! In a stream, each report overrides only the fields it carries.

use serde::de::IgnoredAny;
use serde::Deserialize;

pub use crate::api::Dialect;

/// What vLLM reported about one request's tokens; `None` is unknown, never
/// zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens vLLM processed (what `vllm:prompt_tokens_total` counts).
    pub prompt_tokens: Option<u64>,
    /// Of those, the ones served from its prefix cache
    /// (`vllm:prefix_cache_hits_total`).
    pub cached_tokens: Option<u64>,
    /// Tokens generated.
    pub completion_tokens: Option<u64>,
}

impl Usage {
    /// This report, completed by an earlier one where it is silent.
    pub(crate) fn or(self, earlier: Usage) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens.or(earlier.prompt_tokens),
            cached_tokens: self.cached_tokens.or(earlier.cached_tokens),
            completion_tokens: self.completion_tokens.or(earlier.completion_tokens),
        }
    }
}

/// A usage object as any of the APIs writes it; [`Dialect::usage`] reads the
/// fields of one.
#[derive(Deserialize)]
pub(crate) struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<Details>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

/// What one stream event tells accounting.
#[derive(Default)]
pub(crate) struct EventFacts {
    pub usage: Option<Usage>,
    pub response_id: Option<Box<str>>,
    /// A completions chunk with usage and no choices: the one the gateway
    /// asked for and may strip.
    pub usage_only: bool,
}

/// An object holding the usage (and id) one level down: Messages'
/// `message_start`, every Responses `response.*` event.
#[derive(Deserialize)]
struct Inner {
    id: Option<Box<str>>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct CompletionsEvent {
    choices: Option<Vec<IgnoredAny>>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct ResponsesEvent {
    response: Option<Inner>,
}

#[derive(Deserialize)]
struct MessagesEvent {
    /// `message_delta`.
    usage: Option<WireUsage>,
    /// `message_start`.
    message: Option<Inner>,
}

impl Dialect {
    /// One usage object, read as this API means it.
    pub(crate) fn usage(self, u: WireUsage) -> Usage {
        let cached = |d: Option<Details>| d.and_then(|d| d.cached_tokens);
        match self {
            Dialect::Completions => Usage {
                prompt_tokens: u.prompt_tokens,
                cached_tokens: cached(u.prompt_tokens_details),
                completion_tokens: u.completion_tokens,
            },
            Dialect::Responses => Usage {
                prompt_tokens: u.input_tokens,
                cached_tokens: cached(u.input_tokens_details),
                completion_tokens: u.output_tokens,
            },
            Dialect::Messages => Usage {
                // Saturating: the numbers come from the wire.
                prompt_tokens: u.input_tokens.map(|input| {
                    input
                        .saturating_add(u.cache_read_input_tokens.unwrap_or(0))
                        .saturating_add(u.cache_creation_input_tokens.unwrap_or(0))
                }),
                cached_tokens: u.cache_read_input_tokens,
                completion_tokens: u.output_tokens,
            },
        }
    }

    /// Read one stream event's JSON payload; nothing if it is not JSON of
    /// the expected shape.
    pub(crate) fn read_event(self, data: &[u8]) -> EventFacts {
        let usage = |u: Option<WireUsage>| u.map(|u| self.usage(u));
        match self {
            Dialect::Completions => match serde_json::from_slice::<CompletionsEvent>(data) {
                Ok(e) => EventFacts {
                    usage_only: e.usage.is_some() && e.choices.is_some_and(|c| c.is_empty()),
                    usage: usage(e.usage),
                    response_id: None,
                },
                Err(_) => EventFacts::default(),
            },
            Dialect::Responses => match serde_json::from_slice::<ResponsesEvent>(data) {
                Ok(ResponsesEvent { response: Some(r) }) => EventFacts {
                    usage: usage(r.usage),
                    response_id: r.id,
                    usage_only: false,
                },
                _ => EventFacts::default(),
            },
            Dialect::Messages => match serde_json::from_slice::<MessagesEvent>(data) {
                Ok(e) => EventFacts {
                    usage: match (e.usage, e.message.and_then(|m| m.usage)) {
                        (Some(delta), _) => usage(Some(delta)),
                        // `message_start`: its output count is a placeholder.
                        (None, start) => usage(start).map(|u| Usage {
                            completion_tokens: None,
                            ..u
                        }),
                    },
                    ..EventFacts::default()
                },
                Err(_) => EventFacts::default(),
            },
        }
    }
}
