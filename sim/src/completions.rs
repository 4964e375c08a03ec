//! `POST /v1/chat/completions` and `POST /v1/completions`: request
//! validation, then a non-streamed JSON answer or an SSE stream.
//!
//! Output text is deterministic: one " tok" per output token, and every
//! request generates exactly its output-token budget (finish_reason
//! "length"). A streamed response's headers go out once the request is
//! admitted to the batch (so `vllm-num-cached-tokens` can be set); each
//! token chunk is sent when its decode step ends.

use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::Value;

use crate::app::{unix_now, App};
use crate::common::{self, ApiError, Body};
use crate::conversation::chat_prompt;
use crate::engine::{self, Job};
use crate::lora::Served;
use crate::shapes::{self, ChatChunkChoice, Chunk, Delta, Meta, TextChoice};
use crate::sse::{self, Closed, SseSender};
use crate::tokenize::{completion_prompt, count_tokens};

/// The text of every output token.
pub const TOKEN_TEXT: &str = " tok";

/// The whole output of `tokens` tokens.
pub fn output_text(tokens: usize) -> String {
    TOKEN_TEXT.repeat(tokens)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Text,
}

/// What the simulator needs from a validated request.
#[derive(Debug)]
struct Parsed {
    served: Served,
    prompt: String,
    output_tokens: usize,
    stream: bool,
    include_usage: bool,
}

pub async fn handle(app: &Arc<App>, kind: Kind, req: Request<Incoming>) -> Response<Body> {
    let parsed = match begin(app, req).await {
        Ok(b) => parse(app, kind, &b).await,
        Err(e) => Err(e),
    };
    let p = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let meta = Meta {
        id: match kind {
            Kind::Chat => format!("chatcmpl-{}", app.next_id()),
            Kind::Text => format!("cmpl-{}", app.next_id()),
        },
        created: unix_now(),
        model: p.served.name.clone(),
    };
    // Waiting here (queued) ends if the client disconnects: hyper drops us.
    let job = engine::admit(app, &p.served, &p.prompt, p.output_tokens).await;
    let cached = job.cached_tokens;
    let mut resp = if p.stream {
        let (tx, body) = sse::channel();
        tokio::spawn(stream(job, tx, meta, kind, p.include_usage));
        sse::response(body)
    } else {
        complete(job, &meta, kind).await
    };
    add_cached_header(app, &mut resp, cached);
    resp
}

/// What every generation endpoint does before parsing: `gate`, then read
/// the body.
pub async fn begin(app: &App, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    gate(app, req.headers()).await?;
    common::read_body(req).await
}

/// Counts a generation request (keeping its headers for tests) and applies
/// the faults.
pub async fn gate(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    app.metrics.record_request(headers);
    common::fault_gate(app).await
}

/// `vllm-num-cached-tokens` (with `--cached-tokens-header`): known at
/// admission, so streamed responses carry it too.
pub fn add_cached_header(app: &App, resp: &mut Response<Body>, cached: usize) {
    if app.cached_tokens_header {
        resp.headers_mut()
            .insert("vllm-num-cached-tokens", HeaderValue::from(cached));
    }
}

/// Runs the job to the end and answers with one JSON body.
async fn complete(job: Job, meta: &Meta, kind: Kind) -> Response<Body> {
    job.run_to_end().await;
    let text = output_text(job.output_tokens);
    let usage = job.usage();
    job.succeed();
    match kind {
        Kind::Chat => common::json(StatusCode::OK, &shapes::chat_completion(meta, text, usage)),
        Kind::Text => common::json(StatusCode::OK, &shapes::text_completion(meta, text, usage)),
    }
}

/// Generation task behind a streamed response. Stops as soon as the client
/// goes away, and dropping `job` then frees the batch slot.
async fn stream(job: Job, tx: SseSender, meta: Meta, kind: Kind, include_usage: bool) {
    let finished = sse::until_closed(&tx, produce(&job, &tx, &meta, kind, include_usage)).await;
    job.end_stream(finished, &meta.id);
}

async fn produce(
    job: &Job,
    tx: &SseSender,
    meta: &Meta,
    kind: Kind,
    include_usage: bool,
) -> Result<(), Closed> {
    // vLLM serializes chunks with `exclude_unset`: normal chunks carry no
    // `usage` key, even when usage was asked for.
    let usage_field: Option<shapes::Usage> = None;
    let n = job.output_tokens;
    job.prefill().await;
    if kind == Kind::Chat {
        let first = ChatChunkChoice {
            index: 0,
            delta: Delta {
                role: Some("assistant"),
                content: String::new(),
            },
            logprobs: None,
            finish_reason: None,
            stop_reason: None,
        };
        tx.event(&Chunk::new(
            meta,
            "chat.completion.chunk",
            vec![first],
            usage_field,
        ))
        .await?;
    }
    for i in 0..n {
        job.decode_step().await;
        let finish = (i + 1 == n).then_some("length");
        match kind {
            Kind::Chat => {
                let c = ChatChunkChoice {
                    index: 0,
                    delta: Delta {
                        role: None,
                        content: TOKEN_TEXT.into(),
                    },
                    logprobs: None,
                    finish_reason: finish,
                    stop_reason: finish.map(|_| None),
                };
                tx.event(&Chunk::new(
                    meta,
                    "chat.completion.chunk",
                    vec![c],
                    usage_field,
                ))
                .await?;
            }
            Kind::Text => {
                let c = TextChoice {
                    index: 0,
                    text: TOKEN_TEXT.into(),
                    logprobs: None,
                    finish_reason: finish,
                    stop_reason: None,
                    prompt_logprobs: None,
                };
                tx.event(&Chunk::new(meta, "text_completion", vec![c], usage_field))
                    .await?;
            }
        }
    }
    if include_usage {
        let object = match kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        };
        let last: Chunk<'_, ()> = Chunk::new(meta, object, Vec::new(), Some(job.usage()));
        tx.event(&last).await?;
    }
    tx.done().await
}

/// Validates the body the way vLLM would, returning an error response
/// (400 / 404) on the first problem.
async fn parse(app: &App, kind: Kind, body: &[u8]) -> Result<Parsed, ApiError> {
    let bad = ApiError::bad_request;
    let v = json_object(body)?;
    let served = check_model(app, &v).await?;
    let prompt = match kind {
        Kind::Chat => chat_prompt(&v),
        Kind::Text => completion_prompt(&v),
    }
    .map_err(|e| bad(e.0))?;
    let output_tokens =
        output_budget(app, &v, &["max_completion_tokens", "max_tokens"]).map_err(bad)?;
    check_context(app, count_tokens(&prompt), output_tokens)?;
    let stream = flag(&v, "stream")?;
    let include_usage = stream
        && flag(
            v.get("stream_options").unwrap_or(&Value::Null),
            "include_usage",
        )?;
    Ok(Parsed {
        served,
        prompt,
        output_tokens,
        stream,
        include_usage,
    })
}

/// The request body as a JSON object, else 400.
pub fn json_object(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "Request body must be a JSON object".into(),
        ));
    }
    Ok(v)
}

/// vLLM's model check (`_check_model`): a missing, null or empty `model`
/// means the base model, a loaded adapter's name that adapter (waiting for
/// its load if one is under way, see `lora::Adapters::find`); any other
/// name is 404, whose message lists the base model only, as vLLM's does.
pub async fn check_model(app: &App, v: &Value) -> Result<Served, ApiError> {
    let name = match v.get("model") {
        None | Some(Value::Null) => return Ok(app.base()),
        Some(Value::String(m)) if m.is_empty() || *m == app.model => return Ok(app.base()),
        Some(Value::String(m)) => match app.adapters.find(m).await {
            Some(adapter) => return Ok(adapter),
            None => m.clone(),
        },
        Some(other) => other.to_string(),
    };
    Err(ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "NotFoundError",
        param: Some("model"),
        message: format!(
            "The model `{name}` does not exist. Valid aliases: {}.",
            app.model
        ),
    })
}

/// A boolean field of `v` (absent or null is false).
pub fn flag(v: &Value, name: &str) -> Result<bool, ApiError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(format!("'{name}' must be a boolean"))),
    }
}

/// Chat and completions (and Messages, which vLLM runs as chat): prompt
/// plus output must fit the context.
pub fn check_context(
    app: &App,
    prompt_tokens: usize,
    output_tokens: usize,
) -> Result<(), ApiError> {
    if prompt_tokens + output_tokens > app.max_model_len {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
            app.max_model_len,
            prompt_tokens + output_tokens,
            prompt_tokens,
            output_tokens
        )));
    }
    Ok(())
}

/// Output tokens: the first of `fields` that is set, else the default; at
/// least 1, capped by `--max-output-tokens`.
pub fn output_budget(app: &App, v: &Value, fields: &[&str]) -> Result<usize, String> {
    let field = fields
        .iter()
        .find_map(|k| v.get(k).filter(|x| !x.is_null()).map(|x| (k, x)));
    let Some((name, raw)) = field else {
        return Ok(app
            .default_max_tokens
            .clamp(1, app.max_output_tokens.max(1)));
    };
    match raw.as_u64() {
        Some(n) if n >= 1 => Ok((n as usize).min(app.max_output_tokens.max(1))),
        _ => Err(format!("{name} must be at least 1, got {raw}.")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Args;
    use clap::Parser;

    fn app() -> Arc<App> {
        App::new(&Args::parse_from(["vllm-sim", "--max-model-len", "100"]))
    }

    async fn parse_err(app: &App, body: &str) -> StatusCode {
        parse(app, Kind::Chat, body.as_bytes())
            .await
            .unwrap_err()
            .status
    }

    #[tokio::test]
    async fn rejects_bad_json_and_unknown_model() {
        let a = app();
        assert_eq!(parse_err(&a, "{not json").await, StatusCode::BAD_REQUEST);
        assert_eq!(
            parse_err(
                &a,
                r#"{"model":"other","messages":[{"role":"user","content":"x"}]}"#
            )
            .await,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            parse_err(
                &a,
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#
            )
            .await,
            StatusCode::BAD_REQUEST
        );
        // 100-token context: 2 prompt tokens + 99 output tokens is too long.
        assert_eq!(
            parse_err(
                &a,
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":99}"#
            )
            .await,
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn budget_prefers_max_completion_tokens_and_caps() {
        let a = app();
        let p = parse(&a, Kind::Chat, br#"{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":3,"stream":true,"stream_options":{"include_usage":true}}"#).await.unwrap();
        assert_eq!(
            (p.output_tokens, p.stream, p.include_usage),
            (3, true, true)
        );
        assert_eq!(p.prompt, "user\nx\n");
        let p = parse(&a, Kind::Text, br#"{"prompt":"x","max_tokens":null}"#)
            .await
            .unwrap();
        assert_eq!(p.output_tokens, 16);
        let a = App::new(&Args::parse_from(["vllm-sim", "--max-output-tokens", "4"]));
        let p = parse(&a, Kind::Text, br#"{"prompt":"x","max_tokens":50}"#)
            .await
            .unwrap();
        assert_eq!(p.output_tokens, 4);
    }

    #[tokio::test]
    async fn an_adapter_is_served_under_its_own_name() {
        let a = App::new(&Args::parse_from([
            "vllm-sim",
            "--lora-modules",
            "ad=/p/ad",
        ]));
        let p = parse(&a, Kind::Text, br#"{"model":"ad","prompt":"x"}"#)
            .await
            .unwrap();
        assert_eq!(p.served.name, "ad");
        assert_ne!(p.served, a.base());
        let p = parse(&a, Kind::Text, br#"{"model":"","prompt":"x"}"#)
            .await
            .unwrap();
        assert_eq!(p.served, a.base());
        let e = parse(&a, Kind::Text, br#"{"model":"ad2","prompt":"x"}"#)
            .await
            .unwrap_err();
        // The aliases named are the base model's only, as in vLLM.
        assert_eq!(
            (e.status, e.kind, e.param, e.message.as_str()),
            (
                StatusCode::NOT_FOUND,
                "NotFoundError",
                Some("model"),
                "The model `ad2` does not exist. Valid aliases: sim-model."
            )
        );
    }
}
