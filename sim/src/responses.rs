//! vLLM 0.32's Responses API: `POST /v1/responses` (JSON or stream),
//! `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`. 0.32 serves
//! no DELETE and no `input_items`. What vLLM sends is in docs/vllm-apis.md.
//!
//! Each response is stored (unless `store: false` or
//! `--disable-responses-store`) so that `previous_response_id` can prepend
//! the stored conversation, as vLLM does: the previous request's turns
//! without its system turns, its output as an assistant turn, then the new
//! input, after the new instructions. The next turn's prompt therefore
//! starts with the previous one and hits the prefix cache, on this server
//! only: another server answers 404 for an id it never stored.
//!
//! Generation runs on the same machinery as chat completions (admission,
//! prefix cache, timing, one " tok" per token, always the whole budget).
//! As there, a stream's head goes out once the request is admitted.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::Value;

use crate::app::{unix_now, App};
use crate::common::{self, ApiError, Body};
use crate::completions::{self, add_cached_header, output_text, TOKEN_TEXT};
use crate::conversation::{content_text, render, Call, Tool, Turn};
use crate::engine::{self, Job};
use crate::lora::Served;
use crate::responses_shapes::{
    Echo, ItemEvent, OutputMessage, OutputText, PartEvent, ResponseEvent, ResponseObject,
    ResponseUsage, TextDeltaEvent, TextDoneEvent,
};
use crate::responses_store::Stored;
use crate::sse::{self, Closed, SseSender};
use crate::tokenize::count_tokens;

/// A validated create request.
#[derive(Debug)]
struct Parsed {
    served: Served,
    turns: Vec<Turn>,
    prompt: String,
    output_tokens: usize,
    stream: bool,
    store: bool,
    echo: Echo,
}

/// `POST /v1/responses`.
pub async fn create(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let parsed = match completions::begin(app, req).await {
        Ok(b) => parse(app, &b).await,
        Err(e) => Err(e),
    };
    let p = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let id = format!("resp_{}", app.random_hex());
    let job = engine::admit(app, &p.served, &p.prompt, p.output_tokens).await;
    let cached = job.cached_tokens;
    let object =
        ResponseObject::in_progress(id, unix_now(), p.served.name, p.output_tokens, p.echo);
    let mut pending = Pending {
        app: Arc::clone(app),
        turns: p.turns,
        store: p.store,
        object,
        item_id: format!("msg_{}", app.random_hex()),
    };
    let mut resp = if p.stream {
        let (tx, body) = sse::channel();
        tokio::spawn(stream(job, tx, pending));
        sse::response(body)
    } else {
        job.run_to_end().await;
        let body = pending.finish(&job);
        job.succeed();
        common::json_bytes(StatusCode::OK, body)
    };
    add_cached_header(app, &mut resp, cached);
    resp
}

/// `GET /v1/responses/{id}`: the stored object, as first sent.
pub async fn retrieve(app: &App, id: &str) -> Response<Body> {
    if let Err(e) = common::fault_gate(app).await {
        return e.into_response();
    }
    let found = app
        .responses
        .lock()
        .expect("store lock")
        .get(id)
        .map(|s| s.body.clone());
    match found {
        Some(body) => common::json_bytes(StatusCode::OK, body),
        None => not_found(id).into_response(),
    }
}

/// `POST /v1/responses/{id}/cancel`: only background responses can be
/// cancelled, and the simulator has none, so a stored one is refused.
pub async fn cancel(app: &App, id: &str) -> Response<Body> {
    if let Err(e) = common::fault_gate(app).await {
        return e.into_response();
    }
    let known = app.responses.lock().expect("store lock").get(id).is_some();
    if known {
        ApiError::invalid_request(
            "response_id",
            "Cannot cancel a synchronous response.".into(),
        )
        .into_response()
    } else {
        not_found(id).into_response()
    }
}

/// vLLM's answer for an id it has not stored (`_make_not_found_error`).
fn not_found(id: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::invalid_request("response_id", format!("Response with id '{id}' not found."))
    }
}

/// One response in the making: what is needed to finish and store it.
struct Pending {
    app: Arc<App>,
    turns: Vec<Turn>,
    store: bool,
    object: ResponseObject,
    item_id: String,
}

impl Pending {
    fn output(&self, n: usize) -> OutputMessage {
        OutputMessage::new(
            &self.item_id,
            vec![OutputText::new(output_text(n), None)],
            "completed",
        )
    }

    /// Fills in output and usage, stores the object (before anyone is told
    /// it is done, so a client can chain its next turn at once) and returns
    /// its bytes.
    fn finish(&mut self, job: &Job) -> bytes::Bytes {
        let usage = ResponseUsage::new(
            job.prompt_tokens,
            job.cached_tokens,
            job.created_tokens(),
            job.output_tokens,
        );
        let output = self.output(job.output_tokens);
        self.object.finish(output, usage);
        let body =
            bytes::Bytes::from(serde_json::to_vec(&self.object).expect("response serializes"));
        if self.store {
            let entry = Stored {
                body: body.clone(),
                // Called once: the turns are not needed any more.
                turns: std::mem::take(&mut self.turns),
                output: output_text(job.output_tokens),
            };
            self.app
                .responses
                .lock()
                .expect("store lock")
                .insert(self.object.id.clone(), entry);
        }
        body
    }
}

/// `response.output_item.added` or `.done` (`kind`) for `item`.
async fn item_event(
    tx: &SseSender,
    kind: &'static str,
    item: &OutputMessage,
    sequence_number: u64,
) -> Result<(), Closed> {
    let event = ItemEvent {
        item,
        output_index: 0,
        sequence_number,
        kind,
    };
    tx.named(kind, &event).await
}

/// `response.content_part.added` or `.done` (`kind`) for `part`.
async fn part_event(
    tx: &SseSender,
    kind: &'static str,
    item_id: &str,
    part: &OutputText,
    sequence_number: u64,
) -> Result<(), Closed> {
    let event = PartEvent {
        content_index: 0,
        item_id,
        output_index: 0,
        part,
        sequence_number,
        kind,
    };
    tx.named(kind, &event).await
}

async fn stream(job: Job, tx: SseSender, pending: Pending) {
    let id = pending.object.id.clone();
    let finished = sse::until_closed(&tx, produce(&job, &tx, pending)).await;
    job.end_stream(finished, &id);
}

/// The event sequence of vLLM's `responses_stream_generator` for one text
/// output message; `sequence_number` counts every event from 0.
async fn produce(job: &Job, tx: &SseSender, mut pending: Pending) -> Result<(), Closed> {
    let mut seq = 0u64;
    let mut next = || {
        seq += 1;
        seq - 1
    };
    for kind in ["response.created", "response.in_progress"] {
        let e = ResponseEvent {
            response: &pending.object,
            sequence_number: next(),
            kind,
        };
        tx.named(kind, &e).await?;
    }
    job.prefill().await;
    let item_id = pending.item_id.clone();
    for i in 0..job.output_tokens {
        job.decode_step().await;
        if i == 0 {
            let item = OutputMessage::new(&item_id, Vec::new(), "in_progress");
            item_event(tx, "response.output_item.added", &item, next()).await?;
            let part = OutputText::new(String::new(), Some([]));
            part_event(tx, "response.content_part.added", &item_id, &part, next()).await?;
        }
        let kind = "response.output_text.delta";
        let e = TextDeltaEvent {
            content_index: 0,
            delta: TOKEN_TEXT,
            item_id: &item_id,
            logprobs: [],
            output_index: 0,
            sequence_number: next(),
            kind,
        };
        tx.named(kind, &e).await?;
    }
    let item = pending.output(job.output_tokens);
    let part = &item.content[0];
    let kind = "response.output_text.done";
    tx.named(
        kind,
        &TextDoneEvent {
            content_index: 0,
            item_id: &item_id,
            logprobs: [],
            output_index: 0,
            sequence_number: next(),
            text: &part.text,
            kind,
        },
    )
    .await?;
    part_event(tx, "response.content_part.done", &item_id, part, next()).await?;
    item_event(tx, "response.output_item.done", &item, next()).await?;
    let sequence_number = next();
    pending.finish(job);
    let kind = "response.completed";
    let e = ResponseEvent {
        response: &pending.object,
        sequence_number,
        kind,
    };
    tx.named(kind, &e).await
}

/// Validates a create request the way vLLM 0.32 does, in its order: model,
/// background/store, `previous_response_id`, then the prompt length.
async fn parse(app: &App, body: &[u8]) -> Result<Parsed, ApiError> {
    let v = completions::json_object(body)?;
    let served = completions::check_model(app, &v).await?;
    let store_asked = match v.get("store") {
        None | Some(Value::Null) => true, // vLLM's default
        _ => completions::flag(&v, "store")?,
    };
    if completions::flag(&v, "background")? {
        return Err(if store_asked && !app.responses_store_enabled {
            ApiError::invalid_request("background", BACKGROUND_NEEDS_STORE.into())
        } else {
            ApiError::invalid_request(
                "background",
                "vllm-sim does not simulate background responses.".into(),
            )
        });
    }
    // Without the store vLLM silently ignores `store: true`.
    let store = store_asked && app.responses_store_enabled;
    let previous = match v.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => {
            let found = app.responses.lock().expect("store lock").get(id).cloned();
            Some(found.ok_or_else(|| not_found(id))?)
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "'previous_response_id' must be a string".into(),
            ))
        }
    };
    let turns = conversation(&v, previous.as_ref())?;
    let prompt = render(&tools(&v), &turns);
    let prompt_tokens = count_tokens(&prompt);
    if prompt_tokens >= app.max_model_len {
        return Err(ApiError::invalid_request(
            "input",
            format!(
                "The engine prompt length {prompt_tokens} exceeds the max_model_len {}. Please reduce prompt.",
                app.max_model_len
            ),
        ));
    }
    // vLLM clamps the budget to the room left instead of refusing.
    let output_tokens = completions::output_budget(app, &v, &["max_output_tokens"])
        .map_err(ApiError::bad_request)?
        .min(app.max_model_len - prompt_tokens);
    Ok(Parsed {
        served,
        turns,
        prompt,
        output_tokens,
        stream: completions::flag(&v, "stream")?,
        store,
        echo: Echo::from_request(&v),
    })
}

const BACKGROUND_NEEDS_STORE: &str = "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.";

/// The turns vLLM renders (`construct_input_messages`): the instructions as
/// a system turn, the previous conversation without its system turns (its
/// instructions do not carry over), the previous output, then the input.
fn conversation(v: &Value, previous: Option<&Stored>) -> Result<Vec<Turn>, ApiError> {
    let mut turns = Vec::new();
    if let Some(i) = v.get("instructions").and_then(Value::as_str) {
        if !i.is_empty() {
            turns.push(Turn::new("system", i));
        }
    }
    if let Some(p) = previous {
        turns.extend(p.turns.iter().filter(|t| t.role != "system").cloned());
        if !p.output.is_empty() {
            turns.push(Turn::new("assistant", p.output.clone()));
        }
    }
    match v.get("input") {
        Some(Value::String(s)) => turns.push(Turn::new("user", s.clone())),
        Some(Value::Array(items)) => {
            let mut open = Open::default();
            for item in items {
                add_item(&mut turns, &mut open, item)?;
            }
        }
        _ => {
            return Err(ApiError::bad_request(
                "'input' must be a string or an array of items".into(),
            ))
        }
    }
    Ok(turns)
}

/// What the last turn, an assistant one made of items, has not been given
/// yet: later items fill it in before a new turn is made (vLLM's
/// `_construct_message_from_response_item`).
#[derive(Default)]
struct Open {
    assistant: bool,
    content: bool,
    reasoning: bool,
}

/// One input item as vLLM adds it to the chat: a function call as a tool
/// call of the assistant turn before it (or of one of its own), its output
/// as a `tool` turn, a reasoning item as the reasoning of the assistant
/// turn before it (or an empty turn of its own), an assistant message as
/// that turn's text if it has none, other messages by role.
fn add_item(turns: &mut Vec<Turn>, open: &mut Open, item: &Value) -> Result<(), ApiError> {
    let kind = item.get("type").and_then(Value::as_str);
    let text = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or_default();
    let assistant = |turns: &mut Vec<Turn>, open: &mut Open, fill: fn(&mut Open) -> bool| {
        if !(open.assistant && fill(open)) {
            turns.push(Turn::new("assistant", ""));
            *open = Open {
                assistant: true,
                ..Open::default()
            };
            fill(open);
        }
    };
    match kind {
        Some("function_call" | "custom_tool_call") => {
            let name = match item.get("namespace").and_then(Value::as_str) {
                Some(space) if kind == Some("function_call") => {
                    format!("{space}__{}", text("name"))
                }
                _ => text("name").to_string(),
            };
            let call = match kind {
                Some("custom_tool_call") => {
                    Call::new(&name, Some(&serde_json::json!({"input": text("input")})))
                }
                _ => Call::new(&name, item.get("arguments")),
            };
            assistant(turns, open, |_| true);
            turns
                .last_mut()
                .expect("an assistant turn")
                .calls
                .push(call);
        }
        Some("function_call_output" | "custom_tool_call_output") => {
            let output = content_text(item.get("output")).unwrap_or_default();
            turns.push(Turn::new("tool", output));
            *open = Open::default();
        }
        Some("reasoning") => assistant(turns, open, |o| !std::mem::replace(&mut o.reasoning, true)),
        None | Some("message") => {
            let role = item.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::bad_request("each input message needs a string 'role'".into())
            })?;
            let content = match (role, item.get("content")) {
                // vLLM keeps an assistant message's first part only.
                ("assistant", Some(Value::Array(parts))) => {
                    content_text(parts.first().map(|p| &p["text"]))
                }
                (_, content) => content_text(content),
            };
            let content = content.ok_or_else(|| {
                ApiError::bad_request("input message 'content' must be a string or an array".into())
            })?;
            if role == "assistant" {
                assistant(turns, open, |o| !std::mem::replace(&mut o.content, true));
                turns.last_mut().expect("an assistant turn").text = content;
            } else {
                turns.push(Turn::new(role, content));
                *open = Open::default();
            }
        }
        Some(_) => {}
    }
    Ok(())
}

/// The tools of a Responses request as vLLM shows them: function tools, a
/// namespace's functions as `<namespace>__<name>`, custom tools; no other.
fn tools(v: &Value) -> Vec<Tool> {
    let mut out = Vec::new();
    for t in v
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
        match t.get("type").and_then(Value::as_str) {
            Some("function" | "custom") => out.push(Tool::of(t, name)),
            Some("namespace") => {
                let inner = t.get("tools").and_then(Value::as_array);
                for f in inner.into_iter().flatten() {
                    if f.get("type").and_then(Value::as_str) == Some("function") {
                        let own = f.get("name").and_then(Value::as_str).unwrap_or_default();
                        out.push(Tool::of(f, &format!("{name}__{own}")));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(turns: Vec<Turn>, output: &str) -> Stored {
        Stored {
            body: bytes::Bytes::new(),
            turns,
            output: output.into(),
        }
    }

    #[test]
    fn a_string_input_is_one_user_turn_after_the_instructions() {
        let t = conversation(&json!({"instructions": "be brief", "input": "hi"}), None).unwrap();
        assert_eq!(
            t,
            vec![Turn::new("system", "be brief"), Turn::new("user", "hi")]
        );
    }

    #[test]
    fn the_previous_turn_comes_first_without_its_instructions() {
        let prev = stored(
            vec![Turn::new("system", "old rules"), Turn::new("user", "q1")],
            " tok tok",
        );
        let v = json!({"instructions": "new rules", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "q2"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "42"},
            {"type": "reasoning", "summary": []}
        ]});
        let t = conversation(&v, Some(&prev)).unwrap();
        assert_eq!(
            t,
            vec![
                Turn::new("system", "new rules"),
                Turn::new("user", "q1"),
                Turn::new("assistant", " tok tok"),
                Turn::new("user", "q2"),
                Turn {
                    calls: vec![Call::new("f", None)],
                    ..Turn::new("assistant", "")
                },
                Turn::new("tool", "42"),
                // vLLM's message of its own for reasoning after a tool's
                // output.
                Turn::new("assistant", ""),
            ]
        );
        assert!(conversation(&json!({"input": 3}), None).is_err());
        assert!(conversation(&json!({"input": [{"content": "x"}]}), None).is_err());
    }

    // ---- over HTTP ----

    use crate::testkit::{start, Sim};

    const HEX16: fn(&str) -> bool = |s| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());

    async fn create(sim: &Sim, body: Value) -> Value {
        let r = sim.post("/v1/responses", &body.to_string()).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    }

    #[tokio::test]
    async fn a_response_is_vllm_shaped_stored_and_served_again() {
        let sim = start(&[]).await;
        let r = sim
            .post(
                "/v1/responses",
                r#"{"model":"sim-model","input":"hello","max_output_tokens":3}"#,
            )
            .await;
        assert_eq!(r.status, 200);
        assert!(r.headers.contains("content-type: application/json"));
        assert!(r.body.starts_with(r#"{"id":"resp_"#), "{}", r.body);
        let v = r.json();
        let id = v["id"].as_str().unwrap();
        assert!(HEX16(&id[5..]), "{id}");
        assert_eq!(v["object"], "response");
        assert_eq!(v["status"], "incomplete");
        assert_eq!(
            v["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(v["max_output_tokens"], 3);
        let item = &v["output"][0];
        assert!(HEX16(&item["id"].as_str().unwrap()[4..]));
        assert_eq!(item["content"][0]["text"], " tok tok tok");
        // "user\nhello\n": 11 bytes, 3 tokens; no full block to cache.
        assert_eq!(
            v["usage"],
            json!({"input_tokens":3,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},"total_tokens":6})
        );

        let got = sim.get(&format!("/v1/responses/{id}")).await;
        assert_eq!((got.status, got.body.as_str()), (200, r.body.as_str()));
        let c = sim.post(&format!("/v1/responses/{id}/cancel"), "").await;
        assert_eq!(
            (c.status, c.body.as_str()),
            (
                400,
                r#"{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":"response_id","code":400}}"#
            )
        );
        for r in [
            sim.get("/v1/responses/resp_nope").await,
            sim.post("/v1/responses/resp_nope/cancel", "").await,
            sim.post(
                "/v1/responses",
                r#"{"input":"x","previous_response_id":"resp_nope"}"#,
            )
            .await,
        ] {
            assert_eq!(
                (r.status, r.body.as_str()),
                (
                    404,
                    r#"{"error":{"message":"Response with id 'resp_nope' not found.","type":"invalid_request_error","param":"response_id","code":404}}"#
                )
            );
        }
        // 0.32 serves neither DELETE nor input_items.
        assert_eq!(
            sim.send("DELETE", &format!("/v1/responses/{id}"), None)
                .await
                .status,
            405
        );
        assert_eq!(
            sim.get(&format!("/v1/responses/{id}/input_items"))
                .await
                .status,
            404
        );
    }

    #[tokio::test]
    async fn a_second_turn_hits_the_cache_on_its_server_only() {
        let sim = start(&[]).await;
        let other = start(&[]).await;
        let instructions = "s".repeat(300);
        let input = "q".repeat(200);
        let one = create(
            &sim,
            json!({"instructions": instructions, "input": input, "max_output_tokens": 4}),
        )
        .await;
        // "system\n" + 300 + "\nuser\n" + 200 + "\n": 514 bytes, 129 tokens.
        assert_eq!(one["usage"]["input_tokens"], 129);
        assert_eq!(one["usage"]["input_tokens_details"]["cached_tokens"], 0);
        assert_eq!(
            one["usage"]["input_tokens_details"]["cache_write_tokens"],
            128
        );
        let next = json!({"instructions": instructions, "input": "more", "previous_response_id": one["id"], "max_output_tokens": 2});
        let two = create(&sim, next.clone()).await;
        assert_eq!(two["previous_response_id"], one["id"]);
        // + "assistant\n tok tok tok tok\nuser\nmore\n": 514 + 37 = 551 bytes.
        assert_eq!(two["usage"]["input_tokens"], 138);
        assert_eq!(two["usage"]["input_tokens_details"]["cached_tokens"], 128);
        assert_eq!(
            two["usage"]["input_tokens_details"]["cache_write_tokens"],
            0
        );
        assert_eq!(
            sim.metric("vllm:prefix_cache_queries_total").await,
            129 + 138
        );
        assert_eq!(sim.metric("vllm:prefix_cache_hits_total").await, 128);
        assert_eq!(sim.metric("vllm:prompt_tokens_total").await, 129 + 138);
        assert_eq!(sim.metric("vllm:prompt_tokens_cached_total").await, 128);

        // The other server never stored it.
        let r = other.post("/v1/responses", &next.to_string()).await;
        assert_eq!(r.status, 404);
        assert_eq!(r.json()["error"]["param"], "response_id");

        // `store: false` is not stored, so it cannot be continued.
        let unstored = create(&sim, json!({"input": "x", "store": false})).await;
        let r = sim
            .post(
                "/v1/responses",
                &json!({"input": "y", "previous_response_id": unstored["id"]}).to_string(),
            )
            .await;
        assert_eq!(r.status, 404);
    }

    #[tokio::test]
    async fn a_stream_sends_vllm_events_in_order() {
        let sim = start(&[]).await;
        let r = sim
            .post(
                "/v1/responses",
                r#"{"input":"hello","max_output_tokens":3,"stream":true}"#,
            )
            .await;
        assert_eq!(r.status, 200);
        assert!(r
            .headers
            .contains("content-type: text/event-stream; charset=utf-8"));
        assert!(r
            .body
            .starts_with("event: response.created\ndata: {\"response\":{\"id\":\"resp_"));
        assert!(!r.body.contains("[DONE]"));
        let events = r.events();
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (name, data)) in events.iter().enumerate() {
            assert_eq!(
                (&data["type"], &data["sequence_number"]),
                (&json!(name), &json!(i))
            );
        }
        let created = &events[0].1["response"];
        let done = &events[10].1["response"];
        assert_eq!(created["id"], done["id"]);
        assert_eq!(
            (created["status"].as_str(), &created["usage"]),
            (Some("in_progress"), &Value::Null)
        );
        assert_eq!(created["output"], json!([]));
        assert_eq!(done["status"], "incomplete");
        assert_eq!(
            (
                done["usage"]["input_tokens"].as_u64(),
                done["usage"]["output_tokens"].as_u64()
            ),
            (Some(3), Some(3))
        );
        assert_eq!(events[2].1["item"]["status"], "in_progress");
        assert_eq!(
            events[3].1["part"],
            json!({"annotations":[],"text":"","type":"output_text","logprobs":[]})
        );
        assert_eq!(events[4].1["delta"], " tok");
        assert_eq!(events[7].1["text"], " tok tok tok");
        assert_eq!(events[9].1["item"], done["output"][0]);
        assert_eq!(done["output"][0]["id"], events[2].1["item"]["id"]);
        // Stored as completed.
        let got = sim
            .get(&format!("/v1/responses/{}", done["id"].as_str().unwrap()))
            .await;
        assert_eq!(&got.json(), done);
    }

    #[tokio::test]
    async fn errors_follow_vllm() {
        let sim = start(&["--max-model-len", "10"]).await;
        let r = sim
            .post("/v1/responses", r#"{"model":"gpt","input":"x"}"#)
            .await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                404,
                r#"{"error":{"message":"The model `gpt` does not exist. Valid aliases: sim-model.","type":"NotFoundError","param":"model","code":404}}"#
            )
        );
        // 10 tokens of prompt do not fit a 10-token context.
        let r = sim
            .post(
                "/v1/responses",
                &json!({"input": "x".repeat(34)}).to_string(),
            )
            .await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                400,
                r#"{"error":{"message":"The engine prompt length 10 exceeds the max_model_len 10. Please reduce prompt.","type":"invalid_request_error","param":"input","code":400}}"#
            )
        );
        // A budget that does not fit is clamped, not refused.
        let v = create(&sim, json!({"input": "hello", "max_output_tokens": 50})).await;
        assert_eq!(
            (
                v["max_output_tokens"].as_u64(),
                v["usage"]["output_tokens"].as_u64()
            ),
            (Some(7), Some(7))
        );
    }

    #[tokio::test]
    async fn without_the_store_nothing_is_kept() {
        let sim = start(&["--disable-responses-store"]).await;
        let v = create(&sim, json!({"input": "x"})).await;
        assert_eq!(
            sim.get(&format!("/v1/responses/{}", v["id"].as_str().unwrap()))
                .await
                .status,
            404
        );
        let r = sim
            .post("/v1/responses", r#"{"input":"x","background":true}"#)
            .await;
        assert_eq!(r.status, 400);
        assert!(r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("VLLM_ENABLE_RESPONSES_API_STORE=1"));
    }
}
