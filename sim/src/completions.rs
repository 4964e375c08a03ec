//! `POST /v1/chat/completions` and `POST /v1/completions`: request
//! validation, then a non-streamed JSON answer or an SSE stream.
//!
//! Output text is deterministic: one " tok" per output token, and every
//! request generates exactly its output-token budget (finish_reason
//! "length"). A streamed response's headers go out once the request is
//! admitted to the batch (so `vllm-num-cached-tokens` can be set); each
//! token chunk is sent when its decode step ends.

use std::sync::Arc;

use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;

use crate::api::{self, ApiError, Body};
use crate::app::{unix_now, App};
use crate::engine::{self, Job};
use crate::shapes::{self, ChatChunkChoice, Chunk, Delta, Meta, TextChoice};
use crate::sse::{self, Closed, SseSender};
use crate::tokenize::{chat_prompt, completion_prompt, count_tokens};

const TOKEN_TEXT: &str = " tok";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Text,
}

/// What the simulator needs from a validated request.
#[derive(Debug)]
struct Parsed {
    prompt: String,
    output_tokens: usize,
    stream: bool,
    include_usage: bool,
}

pub async fn handle(app: &Arc<App>, kind: Kind, req: Request<Incoming>) -> Response<Body> {
    app.metrics.record_request(req.headers());
    if let Some(r) = api::fault_gate(app).await {
        return r;
    }
    let p = match api::read_body(req).await.and_then(|b| parse(app, kind, &b)) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let meta = Meta {
        id: match kind {
            Kind::Chat => format!("chatcmpl-{}", app.next_id()),
            Kind::Text => format!("cmpl-{}", app.next_id()),
        },
        created: unix_now(),
        model: app.model.clone(),
    };
    // Waiting here (queued) ends if the client disconnects: hyper drops us.
    let job = engine::admit(app, &p.prompt, p.output_tokens).await;
    let cached = job.cached_tokens;
    let mut resp = if p.stream {
        let (tx, body) = sse::channel();
        tokio::spawn(stream(job, tx, meta, kind, p.include_usage));
        let mut r = Response::new(body.boxed());
        let h = r.headers_mut();
        // Starlette (vLLM's server) adds the charset to text/* types.
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    } else {
        complete(job, &meta, kind).await
    };
    // Known at admission, so streamed responses carry it too.
    if app.cached_tokens_header {
        resp.headers_mut()
            .insert("vllm-num-cached-tokens", HeaderValue::from(cached));
    }
    resp
}

/// Runs the job to the end and answers with one JSON body.
async fn complete(job: Job, meta: &Meta, kind: Kind) -> Response<Body> {
    job.prefill().await;
    for _ in 0..job.output_tokens {
        job.decode_step().await;
    }
    let text = TOKEN_TEXT.repeat(job.output_tokens);
    let usage = job.usage();
    job.succeed();
    match kind {
        Kind::Chat => api::json(StatusCode::OK, &shapes::chat_completion(meta, text, usage)),
        Kind::Text => api::json(StatusCode::OK, &shapes::text_completion(meta, text, usage)),
    }
}

/// Generation task behind a streamed response. Stops as soon as the client
/// goes away, and dropping `job` then frees the batch slot.
async fn stream(job: Job, tx: SseSender, meta: Meta, kind: Kind, include_usage: bool) {
    let finished = {
        let run = produce(&job, &tx, &meta, kind, include_usage);
        tokio::select! {
            r = run => r.is_ok(),
            _ = tx.closed() => false,
        }
    };
    if finished {
        job.succeed();
    } else {
        log::debug!("{}: client went away mid-stream", meta.id);
    }
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
fn parse(app: &App, kind: Kind, body: &[u8]) -> Result<Parsed, ApiError> {
    let bad = ApiError::bad_request;
    let v: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("Invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(bad("Request body must be a JSON object".into()));
    }
    match v.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if *m == app.model => {}
        Some(other) => {
            let name = other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_owned);
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                kind: "NotFoundError",
                message: format!("The model `{name}` does not exist."),
            });
        }
    }
    let prompt = match kind {
        Kind::Chat => chat_prompt(&v),
        Kind::Text => completion_prompt(&v),
    }
    .map_err(|e| bad(e.0))?;
    let output_tokens = output_budget(app, &v).map_err(bad)?;
    let prompt_tokens = count_tokens(&prompt);
    if prompt_tokens + output_tokens > app.max_model_len {
        return Err(bad(format!(
            "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
            app.max_model_len,
            prompt_tokens + output_tokens,
            prompt_tokens,
            output_tokens
        )));
    }
    let flag = |v: Option<&Value>, name: &str| match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(format!("'{name}' must be a boolean"))),
    };
    let stream = flag(v.get("stream"), "stream")?;
    let include_usage = stream
        && flag(
            v.get("stream_options").and_then(|o| o.get("include_usage")),
            "stream_options.include_usage",
        )?;
    Ok(Parsed {
        prompt,
        output_tokens,
        stream,
        include_usage,
    })
}

/// Output tokens: `max_completion_tokens`, else `max_tokens`, else the
/// default; at least 1, capped by `--max-output-tokens`.
fn output_budget(app: &App, v: &Value) -> Result<usize, String> {
    let field = ["max_completion_tokens", "max_tokens"]
        .into_iter()
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

    fn parse_err(app: &App, body: &str) -> StatusCode {
        parse(app, Kind::Chat, body.as_bytes()).unwrap_err().status
    }

    #[test]
    fn rejects_bad_json_and_unknown_model() {
        let a = app();
        assert_eq!(parse_err(&a, "{not json"), StatusCode::BAD_REQUEST);
        assert_eq!(
            parse_err(
                &a,
                r#"{"model":"other","messages":[{"role":"user","content":"x"}]}"#
            ),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            parse_err(
                &a,
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#
            ),
            StatusCode::BAD_REQUEST
        );
        // 100-token context: 2 prompt tokens + 99 output tokens is too long.
        assert_eq!(
            parse_err(
                &a,
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":99}"#
            ),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn budget_prefers_max_completion_tokens_and_caps() {
        let a = app();
        let p = parse(&a, Kind::Chat, br#"{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":3,"stream":true,"stream_options":{"include_usage":true}}"#).unwrap();
        assert_eq!(
            (p.output_tokens, p.stream, p.include_usage),
            (3, true, true)
        );
        assert_eq!(p.prompt, "user\nx\n");
        let p = parse(&a, Kind::Text, br#"{"prompt":"x","max_tokens":null}"#).unwrap();
        assert_eq!(p.output_tokens, 16);
        let a = App::new(&Args::parse_from(["vllm-sim", "--max-output-tokens", "4"]));
        let p = parse(&a, Kind::Text, br#"{"prompt":"x","max_tokens":50}"#).unwrap();
        assert_eq!(p.output_tokens, 4);
    }
}
