//! JSON bodies in the shapes vLLM 0.32 sends. Structs (not `json!`) keep the
//! field order stable, since serde_json's map would sort the keys.

use serde::Serialize;

/// `null` in JSON; used for fields vLLM always sends but never fills here.
pub type Null = Option<()>;

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt: usize, completion: usize, cached: usize) -> Self {
        Usage {
            prompt_tokens: prompt,
            total_tokens: prompt + completion,
            completion_tokens: completion,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: cached,
            },
        }
    }
}

/// `{"error": {...}}` as vLLM's OpenAI server returns it.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorInfo,
}

#[derive(Debug, Serialize)]
pub struct ErrorInfo {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: u16,
}

/// Fields shared by every response and chunk of one request.
#[derive(Debug, Clone)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

// ---- non-streamed ----

#[derive(Debug, Serialize)]
pub struct ChatCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: [ChatChoice; 1],
    pub service_tier: Null,
    pub system_fingerprint: Null,
    pub usage: Usage,
    pub prompt_logprobs: Null,
    pub kv_transfer_params: Null,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatMessage,
    pub logprobs: Null,
    pub finish_reason: &'static str,
    pub stop_reason: Null,
}

#[derive(Debug, Serialize)]
pub struct ChatMessage {
    pub role: &'static str,
    pub content: String,
    pub refusal: Null,
    pub annotations: Null,
    pub audio: Null,
    pub function_call: Null,
    pub tool_calls: [(); 0],
    pub reasoning_content: Null,
}

#[derive(Debug, Serialize)]
pub struct TextCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: [TextChoice; 1],
    pub service_tier: Null,
    pub system_fingerprint: Null,
    pub usage: Usage,
    pub kv_transfer_params: Null,
}

#[derive(Debug, Serialize)]
pub struct TextChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Null,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Null,
    /// Present in non-streamed choices only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Null>,
}

pub fn chat_completion(meta: &Meta, content: String, usage: Usage) -> ChatCompletion<'_> {
    ChatCompletion {
        id: &meta.id,
        object: "chat.completion",
        created: meta.created,
        model: &meta.model,
        choices: [ChatChoice {
            index: 0,
            message: ChatMessage {
                role: "assistant",
                content,
                refusal: None,
                annotations: None,
                audio: None,
                function_call: None,
                tool_calls: [],
                reasoning_content: None,
            },
            logprobs: None,
            finish_reason: "length",
            stop_reason: None,
        }],
        service_tier: None,
        system_fingerprint: None,
        usage,
        prompt_logprobs: None,
        kv_transfer_params: None,
    }
}

pub fn text_completion(meta: &Meta, text: String, usage: Usage) -> TextCompletion<'_> {
    TextCompletion {
        id: &meta.id,
        object: "text_completion",
        created: meta.created,
        model: &meta.model,
        choices: [TextChoice {
            index: 0,
            text,
            logprobs: None,
            finish_reason: Some("length"),
            stop_reason: None,
            prompt_logprobs: Some(None),
        }],
        service_tier: None,
        system_fingerprint: None,
        usage,
        kv_transfer_params: None,
    }
}

// ---- streamed ----

/// One SSE chunk. `usage` is set only on the final usage chunk (vLLM
/// serializes chunks with `exclude_unset`, so normal chunks have no key).
#[derive(Debug, Serialize)]
pub struct Chunk<'a, C> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Null,
    pub finish_reason: Option<&'static str>,
    /// Only the final chunk carries `stop_reason` (null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Null>,
}

#[derive(Debug, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    pub content: String,
}

impl<'a, C> Chunk<'a, C> {
    pub fn new(
        meta: &'a Meta,
        object: &'static str,
        choices: Vec<C>,
        usage: Option<Usage>,
    ) -> Self {
        Chunk {
            id: &meta.id,
            object,
            created: meta.created,
            model: &meta.model,
            choices,
            usage,
        }
    }
}

// ---- models ----

#[derive(Debug, Serialize)]
pub struct ModelList<'a> {
    pub object: &'static str,
    pub data: Vec<ModelCard<'a>>,
}

/// A base model has its `max_model_len` and no parent; an adapter has the
/// base model as parent, its path as root and no `max_model_len`.
#[derive(Debug, Serialize)]
pub struct ModelCard<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: &'a str,
    pub parent: Option<&'a str>,
    pub max_model_len: Option<usize>,
    pub permission: [ModelPermission; 1],
}

/// vLLM's default `ModelPermission`, made anew (id, `created`) for every
/// card of every listing.
#[derive(Debug, Serialize)]
pub struct ModelPermission {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub allow_create_engine: bool,
    pub allow_sampling: bool,
    pub allow_logprobs: bool,
    pub allow_search_indices: bool,
    pub allow_view: bool,
    pub allow_fine_tuning: bool,
    pub organization: &'static str,
    pub group: Null,
    pub is_blocking: bool,
}

impl<'a> ModelCard<'a> {
    /// `created` is the time of the listing, as vLLM's default gives;
    /// `perm_id` the permission's 16 hex digits.
    pub fn new(
        id: &'a str,
        root: &'a str,
        parent: Option<&'a str>,
        max_model_len: Option<usize>,
        created: u64,
        perm_id: String,
    ) -> Self {
        ModelCard {
            id,
            object: "model",
            created,
            owned_by: "vllm",
            root,
            parent,
            max_model_len,
            permission: [ModelPermission {
                id: format!("modelperm-{perm_id}"),
                object: "model_permission",
                created,
                allow_create_engine: false,
                allow_sampling: true,
                allow_logprobs: true,
                allow_search_indices: false,
                allow_view: true,
                allow_fine_tuning: false,
                organization: "*",
                group: None,
                is_blocking: false,
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
        }
    }

    #[test]
    fn usage_keys_are_in_vllm_order() {
        let s = serde_json::to_string(&Usage::new(10, 3, 4)).unwrap();
        assert_eq!(
            s,
            r#"{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}"#
        );
    }

    #[test]
    fn chunk_usage_is_absent_or_set() {
        let m = meta();
        let absent: Chunk<'_, ()> = Chunk::new(&m, "chat.completion.chunk", vec![], None);
        assert!(!serde_json::to_string(&absent).unwrap().contains("usage"));
        let set: Chunk<'_, ()> = Chunk::new(
            &m,
            "chat.completion.chunk",
            vec![],
            Some(Usage::new(10, 3, 4)),
        );
        assert!(serde_json::to_string(&set)
            .unwrap()
            .contains(r#""choices":[],"usage":{"prompt_tokens":10"#));
    }

    #[test]
    fn chat_completion_shape() {
        let m = meta();
        let v =
            serde_json::to_value(chat_completion(&m, " tok".into(), Usage::new(1, 1, 0))).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], " tok");
        assert_eq!(
            v["choices"][0]["message"]["tool_calls"],
            serde_json::json!([])
        );
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn model_card_is_in_vllm_order_with_a_permission() {
        let card = ModelCard::new("a", "/p/a", Some("m"), None, 7, "00ff".into());
        assert_eq!(
            serde_json::to_string(&card).unwrap(),
            r#"{"id":"a","object":"model","created":7,"owned_by":"vllm","root":"/p/a","parent":"m","max_model_len":null,"permission":[{"id":"modelperm-00ff","object":"model_permission","created":7,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}"#
        );
    }
}
