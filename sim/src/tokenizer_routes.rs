//! `POST /tokenize` and `POST /detokenize`, at the root (not under `/v1`)
//! as in vLLM 0.32. `/tokenize` takes a completion `prompt` or chat
//! `messages` and counts them as the generation endpoints do, so its
//! `count` is their `prompt_tokens`; ids are the simulator's own (4 bytes a
//! token), which `/detokenize` turns back into the text.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Serialize;
use serde_json::Value;

use crate::app::App;
use crate::common::{self, ApiError, Body};
use crate::completions::{check_model, json_object};
use crate::conversation::chat_prompt;
use crate::tokenize::{detokenize as text_of, token_ids};

/// `TokenizeResponse`.
#[derive(Debug, Serialize)]
struct Tokens {
    count: usize,
    max_model_len: usize,
    tokens: Vec<u32>,
    token_strs: crate::shapes::Null,
}

pub async fn tokenize(app: &App, req: Request<Incoming>) -> Response<Body> {
    match read(app, req).await.and_then(|v| prompt_of(&v)) {
        Ok(prompt) => {
            let tokens = token_ids(&prompt);
            common::json(
                StatusCode::OK,
                &Tokens {
                    count: tokens.len(),
                    max_model_len: app.max_model_len,
                    tokens,
                    token_strs: None,
                },
            )
        }
        Err(e) => e.into_response(),
    }
}

pub async fn detokenize(app: &App, req: Request<Incoming>) -> Response<Body> {
    let ids = read(app, req).await.and_then(|v| {
        v.get("tokens")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok()))
                    .collect::<Option<Vec<u32>>>()
            })
            .ok_or_else(|| ApiError::bad_request("'tokens' must be an array of token ids".into()))
    });
    match ids {
        Ok(ids) => common::json(
            StatusCode::OK,
            &serde_json::json!({ "prompt": text_of(&ids) }),
        ),
        Err(e) => e.into_response(),
    }
}

async fn read(app: &App, req: Request<Incoming>) -> Result<Value, ApiError> {
    common::fault_gate(app).await?;
    let v = json_object(&common::read_body(req).await?)?;
    check_model(app, &v).await?;
    Ok(v)
}

/// Chat `messages` if present (`TokenizeChatRequest`), else the `prompt`
/// string (`TokenizeCompletionRequest`).
fn prompt_of(v: &Value) -> Result<String, ApiError> {
    if v.get("messages").is_some() {
        return chat_prompt(v).map_err(|e| ApiError::bad_request(e.0));
    }
    v.get("prompt")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ApiError::bad_request("'prompt' must be a string".into()))
}

#[cfg(test)]
mod tests {
    use crate::testkit::start;

    #[tokio::test]
    async fn tokenize_counts_as_chat_does_and_detokenize_reverses_it() {
        let sim = start(&["--max-model-len", "100"]).await;
        let r = sim
            .post(
                "/tokenize",
                r#"{"model":"sim-model","messages":[{"role":"user","content":"hello"}]}"#,
            )
            .await;
        // "user\nhello\n": 11 bytes, 3 tokens.
        assert_eq!(r.status, 200);
        let v = r.json();
        assert_eq!(
            (v["count"].as_u64(), v["max_model_len"].as_u64()),
            (Some(3), Some(100))
        );
        assert!(r.body.ends_with(r#"],"token_strs":null}"#));
        let back = sim
            .post(
                "/detokenize",
                &serde_json::json!({"tokens": v["tokens"]}).to_string(),
            )
            .await;
        assert_eq!(
            (back.status, back.body.as_str()),
            (200, r#"{"prompt":"user\nhello\n"}"#)
        );
        let r = sim.post("/tokenize", r#"{"prompt":"abcde"}"#).await;
        assert_eq!(r.json()["count"], 2);
        assert_eq!(
            sim.post("/v1/tokenize", r#"{"prompt":"x"}"#).await.status,
            404
        );
        assert_eq!(
            sim.post("/tokenize", r#"{"model":"x","prompt":"x"}"#)
                .await
                .status,
            404
        );
    }
}
