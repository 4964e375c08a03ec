//! vLLM 0.32's Anthropic Messages API: `POST /v1/messages` (JSON or
//! stream) and `POST /v1/messages/count_tokens`. What vLLM sends is in
//! docs/vllm-apis.md.
//!
//! vLLM converts a Messages request to a chat completion and runs that, so
//! here too: the conversation (system first, then the messages) renders to
//! the same prompt as the equivalent chat request, and generation is the
//! chat machinery's. The id is the chat completion's (`chatcmpl-...`).
//!
//! Usage is reported as 0.32 does with `--enable-prompt-tokens-details`:
//! cache reads and cache writes are taken out of `input_tokens`, except in
//! a stream's `message_start`, built from the first chat chunk, which has
//! the whole prompt as input; the split comes in `message_delta`.
//!
//! Errors: a body that fails validation is answered in the OpenAI shape
//! (vLLM's request validation runs before the handler); errors from the
//! handler (model, context length, engine faults) in the Anthropic shape.

use std::sync::Arc;

use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::Value;

use crate::app::App;
use crate::common::{self, ApiError, Body};
use crate::completions::{self, add_cached_header, output_text, TOKEN_TEXT};
use crate::conversation::{render, Call, Tool, Turn};
use crate::engine::{self, Job};
use crate::lora::Served;
use crate::messages_shapes::{
    ContextManagement, CountTokens, Delta, ErrorBody, Event, Message, StartMessage, TextBlock,
    Usage,
};
use crate::sse::{self, Closed, SseSender};
use crate::tokenize::count_tokens as tokens_of;

/// Claude Code puts a per-request hash in a system block starting so; vLLM
/// drops such blocks because they would defeat prefix caching.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// `POST /v1/messages`.
pub async fn create(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let id = format!(
        "chatcmpl-{}",
        request_id(req.headers()).unwrap_or_else(|| app.random_hex())
    );
    if let Err(e) = completions::gate(app, req.headers()).await {
        return anthropic(e);
    }
    let v = match read(req, true).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let (served, prompt, output_tokens) = match prepare(app, &v).await {
        Ok(p) => p,
        Err(e) => return anthropic(e),
    };
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let job = engine::admit(app, &served, &prompt, output_tokens).await;
    let cached = job.cached_tokens;
    let mut resp = if stream {
        let (tx, body) = sse::channel();
        tokio::spawn(run_stream(job, tx, id, served.name));
        sse::response(body)
    } else {
        job.run_to_end().await;
        let text = output_text(job.output_tokens);
        let m = Message {
            id: &id,
            kind: "message",
            role: "assistant",
            content: vec![TextBlock::new(&text)],
            model: &served.name,
            stop_reason: STOP_REASON,
            usage: final_usage(&job),
        };
        let r = common::json(StatusCode::OK, &m);
        job.succeed();
        r
    };
    add_cached_header(app, &mut resp, cached);
    resp
}

/// `POST /v1/messages/count_tokens`: the prompt the same request would
/// have, counted; nothing runs.
pub async fn count_tokens(app: &App, req: Request<Incoming>) -> Response<Body> {
    if let Err(e) = common::fault_gate(app).await {
        return anthropic(e);
    }
    let v = match read(req, false).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let checked = completions::check_model(app, &v).await;
    let turns = match checked.and_then(|_| conversation(&v)) {
        Ok(t) => t,
        Err(e) => return anthropic(e),
    };
    let n = tokens_of(&render(&tools(&v), &turns));
    common::json(
        StatusCode::OK,
        &CountTokens {
            input_tokens: n,
            context_management: ContextManagement {
                original_input_tokens: n,
            },
        },
    )
}

/// The simulator always generates its whole budget (chat's finish reason
/// `length`), which vLLM maps to `max_tokens`.
const STOP_REASON: &str = "max_tokens";

fn request_id(h: &HeaderMap) -> Option<String> {
    h.get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn anthropic(e: ApiError) -> Response<Body> {
    common::json(e.status, &ErrorBody::from(e))
}

fn final_usage(job: &Job) -> Usage {
    Usage::split(
        job.prompt_tokens,
        job.cached_tokens,
        job.created_tokens(),
        job.output_tokens,
    )
}

async fn run_stream(job: Job, tx: SseSender, id: String, model: String) {
    let finished = sse::until_closed(&tx, produce(&job, &tx, &id, &model)).await;
    job.end_stream(finished, &id);
}

/// vLLM's `message_stream_converter` over one text block.
async fn produce(job: &Job, tx: &SseSender, id: &str, model: &str) -> Result<(), Closed> {
    job.prefill().await;
    let mut e = Event::new("message_start");
    e.message = Some(StartMessage {
        id,
        kind: "message",
        role: "assistant",
        content: [],
        model,
        stop_reason: None,
        stop_sequence: None,
        usage: Usage::whole_prompt(job.prompt_tokens),
    });
    tx.named(e.kind, &e).await?;
    for i in 0..job.output_tokens {
        job.decode_step().await;
        if i == 0 {
            let mut e = Event::new("content_block_start");
            e.content_block = Some(TextBlock::new(""));
            e.index = Some(0);
            tx.named(e.kind, &e).await?;
        }
        let mut e = Event::new("content_block_delta");
        e.delta = Some(Delta::Text {
            kind: "text_delta",
            text: TOKEN_TEXT,
        });
        e.index = Some(0);
        tx.named(e.kind, &e).await?;
    }
    let mut e = Event::new("content_block_stop");
    e.index = Some(0);
    tx.named(e.kind, &e).await?;
    let mut e = Event::new("message_delta");
    e.delta = Some(Delta::Stop {
        stop_reason: STOP_REASON,
        stop_sequence: None,
    });
    e.usage = Some(final_usage(job));
    tx.named(e.kind, &e).await?;
    tx.named("message_stop", &Event::new("message_stop")).await
}

/// Reads the body and checks what vLLM's request model requires (a
/// non-empty `model`, `messages`, and for `/v1/messages` a positive
/// `max_tokens`); failures are 400s in the OpenAI shape.
async fn read(req: Request<Incoming>, needs_max_tokens: bool) -> Result<Value, ApiError> {
    let v = completions::json_object(&common::read_body(req).await?)?;
    match v.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {}
        Some(Value::String(_)) => {
            return Err(ApiError::validation(
                "body.model",
                "Value error, Model is required",
            ))
        }
        _ => return Err(ApiError::validation("body.model", "Field required")),
    }
    if !v.get("messages").is_some_and(Value::is_array) {
        return Err(ApiError::validation(
            "body.messages",
            "Input should be a valid list",
        ));
    }
    if needs_max_tokens {
        match v.get("max_tokens").and_then(Value::as_i64) {
            Some(n) if n > 0 => {}
            Some(_) => {
                return Err(ApiError::validation(
                    "body.max_tokens",
                    "Value error, max_tokens must be positive",
                ))
            }
            None => return Err(ApiError::validation("body.max_tokens", "Field required")),
        }
        if !matches!(v.get("stream"), None | Some(Value::Null | Value::Bool(_))) {
            return Err(ApiError::validation(
                "body.stream",
                "Input should be a valid boolean",
            ));
        }
    }
    Ok(v)
}

/// The handler's checks, in vLLM's order: model, then (as a chat request)
/// the prompt and the output budget against the context.
async fn prepare(app: &App, v: &Value) -> Result<(Served, String, usize), ApiError> {
    let served = completions::check_model(app, v).await?;
    let prompt = prompt(v)?;
    let output_tokens =
        completions::output_budget(app, v, &["max_tokens"]).map_err(ApiError::bad_request)?;
    completions::check_context(app, tokens_of(&prompt), output_tokens)?;
    Ok((served, prompt, output_tokens))
}

/// The chat turns vLLM makes of a Messages request
/// (`to_chat_completion_request`): the top-level `system` as one system
/// turn, then each message in order. In a user message each `tool_result`
/// becomes a `tool` turn ahead of the message's own text, and a user
/// message with no text left is dropped; `tool_use` blocks are the
/// assistant's tool calls. Text blocks are joined with "\n".
fn conversation(v: &Value) -> Result<Vec<Turn>, ApiError> {
    let mut turns = Vec::new();
    let system = system_text(v.get("system"))?;
    if !system.is_empty() {
        turns.push(Turn::new("system", system));
    }
    for m in v["messages"].as_array().into_iter().flatten() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant" | "system")) => r,
            _ => {
                return Err(ApiError::bad_request(
                    "message 'role' must be user, assistant or system".into(),
                ))
            }
        };
        if role == "system" {
            let text = system_text(m.get("content"))?;
            if !text.is_empty() {
                turns.push(Turn::new("system", text));
            }
            continue;
        }
        let turn = match m.get("content") {
            Some(Value::String(s)) => Some(Turn::new(role, s.clone())),
            Some(Value::Array(blocks)) => blocks_turn(role, blocks, &mut turns),
            _ => {
                return Err(ApiError::bad_request(
                    "message 'content' must be a string or an array".into(),
                ))
            }
        };
        turns.extend(turn);
    }
    Ok(turns)
}

/// The tools of a Messages request.
fn tools(v: &Value) -> Vec<Tool> {
    let tools = v.get("tools").and_then(Value::as_array);
    tools
        .into_iter()
        .flatten()
        .filter_map(|t| Some(Tool::of(t, t.get("name")?.as_str()?)))
        .collect()
}

/// The prompt of a Messages request.
fn prompt(v: &Value) -> Result<String, ApiError> {
    Ok(render(&tools(v), &conversation(v)?))
}

/// A message of blocks as a turn (`None`: a user message left with no
/// text); `tool_result`s of a user message go to `turns` first.
fn blocks_turn(role: &str, blocks: &[Value], turns: &mut Vec<Turn>) -> Option<Turn> {
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(t) = b
                    .get("text")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                {
                    parts.push(t.to_string());
                }
            }
            Some("tool_use") => {
                let name = b.get("name").and_then(Value::as_str).unwrap_or_default();
                calls.push(Call::new(name, b.get("input")));
            }
            Some("tool_result") => {
                let result = tool_result_text(b.get("content"));
                if role == "user" {
                    turns.push(Turn::new("tool", result));
                } else {
                    parts.push(format!("Tool result: {result}"));
                }
            }
            _ => {}
        }
    }
    if parts.is_empty() && role == "user" {
        return None;
    }
    let mut turn = Turn::new(role, parts.join("\n"));
    turn.calls = calls;
    Some(turn)
}

/// A `tool_result`'s content: a string, or its text items joined by "\n".
fn tool_result_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => items
            .iter()
            .filter(|i| i.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|i| i.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A system prompt: a string, or its text blocks joined with nothing,
/// leaving out billing-header blocks.
fn system_text(system: Option<&Value>) -> Result<String, ApiError> {
    let keep = |t: &&str| !t.is_empty() && !t.starts_with(BILLING_HEADER);
    match system {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(Some(s.as_str()).filter(keep).unwrap_or_default().to_owned()),
        Some(Value::Array(blocks)) => Ok(blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .filter(keep)
            .collect()),
        Some(_) => Err(ApiError::bad_request(
            "'system' must be a string or an array of blocks".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::chat_prompt;
    use crate::testkit::start;
    use serde_json::json;

    #[test]
    fn the_same_conversation_is_the_same_prompt_as_chat() {
        let messages = json!({"model": "m", "max_tokens": 1,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: 1234"}, {"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]});
        let chat = json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]});
        assert_eq!(prompt(&messages).unwrap(), chat_prompt(&chat).unwrap());
    }

    #[test]
    fn tool_results_come_before_the_users_text() {
        let v = json!({"messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"b": "x", "a": 1, "A": "y"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}]}, {"type": "text", "text": "so?"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "only"}]}
        ]});
        assert_eq!(
            conversation(&v).unwrap(),
            vec![
                Turn {
                    calls: vec![Call {
                        name: "f".into(),
                        args: vec![("A".into(), "y".into()), ("b".into(), "x".into())],
                    }],
                    ..Turn::new("assistant", "")
                },
                Turn::new("tool", "4\n2"),
                Turn::new("user", "so?"),
                Turn::new("tool", "only"),
            ]
        );
    }

    const SYSTEM: &str = "You are a careful assistant. ";

    fn request(question: &str, stream: bool) -> String {
        json!({"model": "sim-model", "max_tokens": 3, "stream": stream,
            "system": SYSTEM.repeat(10),
            "messages": [{"role": "user", "content": question}]})
        .to_string()
    }

    #[tokio::test]
    async fn usage_splits_cache_reads_and_writes_out_of_the_input() {
        let sim = start(&[]).await;
        // "system\n" + 290 + "\nuser\n" + 20 + "\n": 324 bytes, 81 tokens,
        // 5 full blocks (80 tokens) written by the first request.
        let first = sim
            .post("/v1/messages", &request(&"a".repeat(20), false))
            .await;
        assert_eq!(first.status, 200);
        assert!(
            first.body.starts_with(r#"{"id":"chatcmpl-"#),
            "{}",
            first.body
        );
        let v = first.json();
        assert_eq!(
            first.body[first.body.find(r#","type""#).unwrap()..],
            *r#","type":"message","role":"assistant","content":[{"type":"text","text":" tok tok tok"}],"model":"sim-model","stop_reason":"max_tokens","usage":{"input_tokens":1,"output_tokens":3,"cache_creation_input_tokens":80,"cache_read_input_tokens":0}}"#
        );
        assert_eq!(v["id"].as_str().unwrap().len(), "chatcmpl-".len() + 16);
        // Another question after the same system prompt: 4 blocks are read
        // (the 5th holds the start of the question), 1 written.
        let second = sim
            .post("/v1/messages", &request(&"b".repeat(20), false))
            .await;
        assert_eq!(
            second.json()["usage"],
            json!({"input_tokens":1,"output_tokens":3,"cache_creation_input_tokens":16,"cache_read_input_tokens":64})
        );
        assert_eq!(sim.metric("vllm:prefix_cache_queries_total").await, 162);
        assert_eq!(sim.metric("vllm:prefix_cache_hits_total").await, 64);
        assert_eq!(sim.metric("vllm:prompt_tokens_total").await, 162);
    }

    #[tokio::test]
    async fn a_stream_gives_the_whole_prompt_first_and_the_split_last() {
        let sim = start(&[]).await;
        sim.post("/v1/messages", &request(&"a".repeat(20), false))
            .await;
        let r = sim
            .send_with(
                "POST",
                "/v1/messages",
                &request(&"a".repeat(20), true),
                "x-request-id: abc",
            )
            .await;
        assert!(r
            .headers
            .contains("content-type: text/event-stream; charset=utf-8"));
        assert_eq!(
            r.body,
            concat!(
                "event: message_start\n",
                r#"data: {"type":"message_start","message":{"id":"chatcmpl-abc","type":"message","role":"assistant","content":[],"model":"sim-model","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":81,"output_tokens":0}}}"#,
                "\n\n",
                "event: content_block_start\n",
                r#"data: {"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}"#,
                "\n\n",
                "event: content_block_delta\n",
                r#"data: {"type":"content_block_delta","delta":{"type":"text_delta","text":" tok"},"index":0}"#,
                "\n\n",
                "event: content_block_delta\n",
                r#"data: {"type":"content_block_delta","delta":{"type":"text_delta","text":" tok"},"index":0}"#,
                "\n\n",
                "event: content_block_delta\n",
                r#"data: {"type":"content_block_delta","delta":{"type":"text_delta","text":" tok"},"index":0}"#,
                "\n\n",
                "event: content_block_stop\n",
                r#"data: {"type":"content_block_stop","index":0}"#,
                "\n\n",
                "event: message_delta\n",
                r#"data: {"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":1,"output_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":80}}"#,
                "\n\n",
                "event: message_stop\n",
                r#"data: {"type":"message_stop"}"#,
                "\n\n",
            )
        );
    }

    #[tokio::test]
    async fn count_tokens_and_errors() {
        let sim = start(&[]).await;
        let r = sim
            .post("/v1/messages/count_tokens", r#"{"model":"sim-model","system":"be brief","messages":[{"role":"user","content":"hi"}]}"#)
            .await;
        // "system\nbe brief\nuser\nhi\n": 24 bytes, 6 tokens.
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                200,
                r#"{"input_tokens":6,"context_management":{"original_input_tokens":6}}"#
            )
        );
        let r = sim
            .post(
                "/v1/messages",
                r#"{"model":"claude","max_tokens":1,"messages":[]}"#,
            )
            .await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                404,
                r#"{"type":"error","error":{"type":"NotFoundError","message":"The model `claude` does not exist. Valid aliases: sim-model."}}"#
            )
        );
        let r = sim
            .post("/v1/messages", r#"{"model":"sim-model","messages":[]}"#)
            .await;
        assert_eq!(r.status, 400);
        assert_eq!(
            (
                r.json()["error"]["type"].as_str(),
                r.json()["error"]["param"].as_str()
            ),
            (Some("Bad Request"), Some("body.max_tokens"))
        );
        let r = sim.post("/sim/fault", r#"{"mode":"error"}"#).await;
        assert_eq!(r.status, 200);
        let r = sim.post("/v1/messages", &request("x", false)).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                500,
                r#"{"type":"error","error":{"type":"InternalServerError","message":"Simulated engine failure (fault mode 'error')."}}"#
            )
        );
    }
}
