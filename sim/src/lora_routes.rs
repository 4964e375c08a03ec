//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`, routed
//! only with runtime LoRA updating on (vLLM registers them only with
//! VLLM_ALLOW_RUNTIME_LORA_UPDATING; without it they are 404). Success is
//! vLLM's plain text, sent as Starlette's bare `Response` sends it, with no
//! content type; errors are OpenAI-shaped.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use serde_json::Value;

use crate::app::App;
use crate::common::{self, full, ApiError, Body};
use crate::completions::json_object;

/// Body: `lora_name`, `lora_path` (strings, required), `load_inplace`
/// (default false), `is_3d_lora_weight` (accepted, no effect here).
pub async fn load(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    let r = async {
        let v = read(app, req).await?;
        let name = string(&v, "body.lora_name")?;
        let path = string(&v, "body.lora_path")?;
        let load_inplace = boolean(&v, "body.load_inplace")?;
        boolean(&v, "body.is_3d_lora_weight")?;
        // vLLM finishes a load whose client went away (the handler is not
        // cancelled), so a client that retries finds the adapter loaded.
        let app = Arc::clone(app);
        tokio::spawn(async move {
            let delay = app.timing.lora_load(app.faults.delay_factor());
            let fails = app.lora_load_fails;
            let done = app
                .adapters
                .load(&name, &path, load_inplace, delay, fails)
                .await;
            let counter = match &done {
                Ok(_) => &app.metrics.lora_loads,
                Err(e) if e.status.is_server_error() => &app.metrics.lora_load_failures,
                Err(_) => return done,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            done
        })
        .await
        .expect("adapter load does not panic")
    };
    answer(r.await)
}

/// Body: `lora_name` (required); `lora_int_id` is accepted and ignored, as
/// vLLM does.
pub async fn unload(app: &App, req: Request<Incoming>) -> Response<Body> {
    let r = async {
        let v = read(app, req).await?;
        let name = string(&v, "body.lora_name")?;
        match v.get("lora_int_id") {
            None | Some(Value::Null) => {}
            Some(id) if id.is_i64() => {}
            Some(_) => {
                let e = ApiError::validation("body.lora_int_id", "Input should be a valid integer");
                return Err(e);
            }
        }
        let done = app.adapters.unload(&name).await;
        if done.is_ok() {
            app.metrics.lora_unloads.fetch_add(1, Ordering::Relaxed);
        }
        done
    };
    answer(r.await)
}

async fn read(app: &App, req: Request<Incoming>) -> Result<Value, ApiError> {
    common::fault_gate(app).await?;
    json_object(&common::read_body(req).await?)
}

fn answer(r: Result<String, ApiError>) -> Response<Body> {
    match r {
        Ok(text) => Response::new(full(text)),
        Err(e) => e.into_response(),
    }
}

/// The body field at pydantic location `loc` (`body.<field>`).
fn field<'v>(v: &'v Value, loc: &str) -> Option<&'v Value> {
    v.get(loc.strip_prefix("body.").unwrap_or(loc))
}

/// A required string field (pydantic `str`).
fn string(v: &Value, loc: &'static str) -> Result<String, ApiError> {
    match field(v, loc) {
        Some(Value::String(s)) => Ok(s.clone()),
        None => Err(ApiError::validation(loc, "Field required")),
        Some(_) => Err(ApiError::validation(loc, "Input should be a valid string")),
    }
}

/// A boolean field defaulting to false (pydantic `bool = False`: null is
/// not false).
fn boolean(v: &Value, loc: &'static str) -> Result<bool, ApiError> {
    match field(v, loc) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::validation(loc, "Input should be a valid boolean")),
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::start;

    const LOAD: &str = "/v1/load_lora_adapter";
    const UNLOAD: &str = "/v1/unload_lora_adapter";

    #[tokio::test]
    async fn routes_are_404_unless_runtime_updating_is_allowed() {
        let sim = start(&[]).await;
        for path in [LOAD, UNLOAD] {
            let r = sim
                .post(path, r#"{"lora_name":"a","lora_path":"/a"}"#)
                .await;
            assert_eq!(
                (r.status, r.body.as_str()),
                (404, r#"{"detail":"Not Found"}"#)
            );
        }
        let sim = start(&["--allow-runtime-lora-updating"]).await;
        let r = sim.get(LOAD).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (405, r#"{"detail":"Method Not Allowed"}"#)
        );
    }

    #[tokio::test]
    async fn load_then_list_serve_and_unload() {
        let sim = start(&["--allow-runtime-lora-updating"]).await;
        let r = sim
            .post(LOAD, r#"{"lora_name":"ad","lora_path":"/p/ad"}"#)
            .await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "Success: LoRA adapter 'ad' added successfully.")
        );
        assert!(!r.headers.contains("content-type"), "{}", r.headers);
        assert_eq!(sim.metric("sim_lora_loads_total").await, 1);
        let list = sim.get("/v1/models").await.json();
        let ids: Vec<&str> = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["sim-model", "ad"]);
        let chat = r#"{"model":"ad","messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#;
        let r = sim.post("/v1/chat/completions", chat).await;
        assert_eq!((r.status, r.json()["model"].as_str()), (200, Some("ad")));

        let r = sim
            .post(UNLOAD, r#"{"lora_name":"ad","lora_int_id":1}"#)
            .await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "Success: LoRA adapter 'ad' removed successfully.")
        );
        assert_eq!(sim.metric("sim_lora_unloads_total").await, 1);
        assert_eq!(
            sim.get("/v1/models").await.json()["data"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        let r = sim.post("/v1/chat/completions", chat).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (
                404,
                r#"{"error":{"message":"The model `ad` does not exist. Valid aliases: sim-model.","type":"NotFoundError","param":"model","code":404}}"#
            )
        );
    }

    #[tokio::test]
    async fn errors_are_vllms() {
        let sim = start(&[
            "--allow-runtime-lora-updating",
            "--lora-modules",
            "ad=/p/ad",
        ])
        .await;
        let cases = [
            (
                LOAD,
                r#"{"lora_name":"ad","lora_path":"/p/other"}"#,
                400,
                r#"{"error":{"message":"The lora adapter 'ad' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.","type":"InvalidUserInput","param":null,"code":400}}"#,
            ),
            (
                LOAD,
                r#"{"lora_name":"sim-model","lora_path":"/p"}"#,
                400,
                r#"{"error":{"message":"The lora adapter 'sim-model' conflicts with a served base model.","type":"InvalidUserInput","param":null,"code":400}}"#,
            ),
            (
                LOAD,
                r#"{"lora_name":"x","lora_path":""}"#,
                400,
                r#"{"error":{"message":"Both 'lora_name' and 'lora_path' must be provided.","type":"InvalidUserInput","param":null,"code":400}}"#,
            ),
            (
                LOAD,
                r#"{"lora_name":"x"}"#,
                400,
                r#"{"error":{"message":"1 validation error:\n  body.lora_path: Field required","type":"Bad Request","param":"body.lora_path","code":400}}"#,
            ),
            (
                UNLOAD,
                r#"{"lora_name":"nope"}"#,
                404,
                r#"{"error":{"message":"The lora adapter 'nope' cannot be found.","type":"NotFoundError","param":null,"code":404}}"#,
            ),
            (
                UNLOAD,
                r#"{"lora_int_id":1}"#,
                400,
                r#"{"error":{"message":"1 validation error:\n  body.lora_name: Field required","type":"Bad Request","param":"body.lora_name","code":400}}"#,
            ),
        ];
        for (path, body, status, answer) in cases {
            let r = sim.post(path, body).await;
            assert_eq!((r.status, r.body.as_str()), (status, answer), "{body}");
        }
        assert_eq!(sim.metric("sim_lora_loads_total").await, 0);
        // In place: loaded again from the new path, listed where it was.
        let r = sim
            .post(
                LOAD,
                r#"{"lora_name":"ad","lora_path":"/p/new","load_inplace":true}"#,
            )
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            sim.get("/v1/models").await.json()["data"][1]["root"],
            "/p/new"
        );
    }

    #[tokio::test]
    async fn every_api_answers_with_the_adapters_name() {
        let sim = start(&["--lora-modules", "ad=/p/ad"]).await;
        let msgs = r#"[{"role":"user","content":"hi"}]"#;
        for (path, body) in [
            (
                "/v1/chat/completions",
                format!(r#"{{"model":"ad","messages":{msgs}}}"#),
            ),
            (
                "/v1/completions",
                r#"{"model":"ad","prompt":"hi"}"#.to_owned(),
            ),
            ("/v1/responses", r#"{"model":"ad","input":"hi"}"#.to_owned()),
            (
                "/v1/messages",
                format!(r#"{{"model":"ad","max_tokens":1,"messages":{msgs}}}"#),
            ),
        ] {
            let r = sim.post(path, &body).await;
            assert_eq!(
                (r.status, r.json()["model"].as_str()),
                (200, Some("ad")),
                "{path}"
            );
        }
    }

    #[tokio::test]
    async fn model_list_has_vllms_cards() {
        let sim = start(&[
            "--max-model-len",
            "100",
            "--lora-modules",
            r#"{"name":"ad","path":"/p/ad","base_model_name":"sim-model"}"#,
        ])
        .await;
        let mut list = sim.get("/v1/models").await.json();
        assert_eq!(list["object"], "list");
        for card in list["data"].as_array_mut().unwrap() {
            let card = card.as_object_mut().unwrap();
            let created = card.remove("created").unwrap();
            assert!(created.is_u64());
            let perm = card.remove("permission").unwrap()[0].take();
            assert!(perm["id"].as_str().unwrap().starts_with("modelperm-"));
            assert_eq!(
                (&perm["object"], &perm["created"]),
                (&"model_permission".into(), &created)
            );
            assert_eq!(perm["allow_sampling"], true);
        }
        assert_eq!(
            list["data"],
            serde_json::json!([
                {"id":"sim-model","object":"model","owned_by":"vllm","root":"sim-model","parent":null,"max_model_len":100},
                {"id":"ad","object":"model","owned_by":"vllm","root":"/p/ad","parent":"sim-model","max_model_len":null},
            ])
        );
    }
}
