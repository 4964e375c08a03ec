//! JSON of vLLM 0.32's Responses API: the response object, its output
//! message, usage, and the stream's events. Field order is pydantic's (class
//! order of `ResponsesResponse` and of the `openai` package's types); see
//! docs/vllm-apis.md.

use serde::Serialize;
use serde_json::Value;

use crate::shapes::Null;

/// An empty JSON array (`[]`), for lists vLLM sends but never fills here.
pub type Empty = [(); 0];

/// Request fields the response object echoes, with vLLM's defaults.
#[derive(Debug, Clone)]
pub struct Echo {
    pub instructions: Option<String>,
    pub metadata: Value,
    pub parallel_tool_calls: bool,
    pub temperature: f64,
    pub tool_choice: Value,
    pub tools: Value,
    pub top_p: f64,
    pub max_tool_calls: Value,
    pub previous_response_id: Option<String>,
    pub prompt: Value,
    pub reasoning: Value,
    pub service_tier: Value,
    pub text: Value,
    pub truncation: Value,
    pub user: Value,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
}

impl Echo {
    /// Reads the echoed fields of a request body (already validated as an
    /// object); absent or null fields take vLLM's defaults.
    pub fn from_request(v: &Value) -> Self {
        let raw = |k: &str, default: Value| match v.get(k) {
            None | Some(Value::Null) => default,
            Some(x) => x.clone(),
        };
        // pydantic turns an integer into a float for these (1 -> 1.0).
        let float = |k: &str, default: f64| v.get(k).and_then(Value::as_f64).unwrap_or(default);
        Echo {
            instructions: v
                .get("instructions")
                .and_then(Value::as_str)
                .map(str::to_owned),
            metadata: raw("metadata", Value::Null),
            parallel_tool_calls: v
                .get("parallel_tool_calls")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            temperature: float("temperature", 1.0),
            tool_choice: raw("tool_choice", Value::from("auto")),
            tools: raw("tools", Value::Array(Vec::new())),
            top_p: float("top_p", 1.0),
            max_tool_calls: raw("max_tool_calls", Value::Null),
            previous_response_id: v
                .get("previous_response_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
            prompt: raw("prompt", Value::Null),
            reasoning: raw("reasoning", Value::Null),
            service_tier: raw("service_tier", Value::from("auto")),
            text: raw("text", Value::Null),
            truncation: raw("truncation", Value::from("disabled")),
            user: raw("user", Value::Null),
            presence_penalty: float("presence_penalty", 0.0),
            frequency_penalty: float("frequency_penalty", 0.0),
        }
    }
}

/// `ResponsesResponse`.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub created_at: u64,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub metadata: Value,
    pub model: String,
    pub object: &'static str,
    pub output: Vec<OutputMessage>,
    pub parallel_tool_calls: bool,
    pub temperature: f64,
    pub tool_choice: Value,
    pub tools: Value,
    pub top_p: f64,
    pub background: bool,
    pub max_output_tokens: usize,
    pub max_tool_calls: Value,
    pub previous_response_id: Option<String>,
    pub prompt: Value,
    pub reasoning: Value,
    pub service_tier: Value,
    pub status: &'static str,
    pub text: Value,
    pub top_logprobs: Null,
    pub truncation: Value,
    pub usage: Option<ResponseUsage>,
    pub user: Value,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
    pub kv_transfer_params: Null,
    pub ec_transfer_params: Null,
    pub input_messages: Null,
    pub output_messages: Null,
}

impl ResponseObject {
    /// The object as `response.created` shows it: in progress, no output,
    /// no usage.
    pub fn in_progress(
        id: String,
        created_at: u64,
        model: String,
        max_output_tokens: usize,
        e: Echo,
    ) -> Self {
        ResponseObject {
            id,
            created_at,
            incomplete_details: None,
            instructions: e.instructions,
            metadata: e.metadata,
            model,
            object: "response",
            output: Vec::new(),
            parallel_tool_calls: e.parallel_tool_calls,
            temperature: e.temperature,
            tool_choice: e.tool_choice,
            tools: e.tools,
            top_p: e.top_p,
            background: false,
            max_output_tokens,
            max_tool_calls: e.max_tool_calls,
            previous_response_id: e.previous_response_id,
            prompt: e.prompt,
            reasoning: e.reasoning,
            service_tier: e.service_tier,
            status: "in_progress",
            text: e.text,
            top_logprobs: None,
            truncation: e.truncation,
            usage: None,
            user: e.user,
            presence_penalty: e.presence_penalty,
            frequency_penalty: e.frequency_penalty,
            kv_transfer_params: None,
            ec_transfer_params: None,
            input_messages: None,
            output_messages: None,
        }
    }

    /// The finished object. The simulator always generates its whole
    /// budget (finish reason `length`), which vLLM reports as `incomplete`
    /// with reason `max_output_tokens`.
    pub fn finish(&mut self, output: OutputMessage, usage: ResponseUsage) {
        self.status = "incomplete";
        self.incomplete_details = Some(IncompleteDetails {
            reason: "max_output_tokens",
        });
        self.output = vec![output];
        self.usage = Some(usage);
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

/// `ResponseOutputMessage` (openai package).
#[derive(Debug, Clone, Serialize)]
pub struct OutputMessage {
    pub id: String,
    pub content: Vec<OutputText>,
    pub role: &'static str,
    pub status: &'static str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub phase: Null,
}

impl OutputMessage {
    pub fn new(id: &str, content: Vec<OutputText>, status: &'static str) -> Self {
        OutputMessage {
            id: id.to_owned(),
            content,
            role: "assistant",
            status,
            kind: "message",
            phase: None,
        }
    }
}

/// `ResponseOutputText`; `logprobs` is `[]` in `content_part.added` and
/// null everywhere else.
#[derive(Debug, Clone, Serialize)]
pub struct OutputText {
    pub annotations: Empty,
    pub text: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub logprobs: Option<Empty>,
}

impl OutputText {
    pub fn new(text: String, logprobs: Option<Empty>) -> Self {
        OutputText {
            annotations: [],
            text,
            kind: "output_text",
            logprobs,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct InputTokensDetails {
    pub cached_tokens: usize,
    pub cache_write_tokens: usize,
    pub input_tokens_per_turn: Empty,
    pub cached_tokens_per_turn: Empty,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
    pub tool_output_tokens: usize,
    pub output_tokens_per_turn: Empty,
    pub tool_output_tokens_per_turn: Empty,
}

impl ResponseUsage {
    pub fn new(input: usize, cached: usize, written: usize, output: usize) -> Self {
        ResponseUsage {
            input_tokens: input,
            input_tokens_details: InputTokensDetails {
                cached_tokens: cached,
                cache_write_tokens: written,
                input_tokens_per_turn: [],
                cached_tokens_per_turn: [],
            },
            output_tokens: output,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
                tool_output_tokens: 0,
                output_tokens_per_turn: [],
                tool_output_tokens_per_turn: [],
            },
            total_tokens: input + output,
        }
    }
}

// ---- stream events (each with `sequence_number` and `type` last) ----

/// `response.created`, `response.in_progress`, `response.completed`.
#[derive(Debug, Serialize)]
pub struct ResponseEvent<'a> {
    pub response: &'a ResponseObject,
    pub sequence_number: u64,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `response.output_item.added` / `.done`.
#[derive(Debug, Serialize)]
pub struct ItemEvent<'a> {
    pub item: &'a OutputMessage,
    pub output_index: u32,
    pub sequence_number: u64,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `response.content_part.added` / `.done`.
#[derive(Debug, Serialize)]
pub struct PartEvent<'a> {
    pub content_index: u32,
    pub item_id: &'a str,
    pub output_index: u32,
    pub part: &'a OutputText,
    pub sequence_number: u64,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `response.output_text.delta`.
#[derive(Debug, Serialize)]
pub struct TextDeltaEvent<'a> {
    pub content_index: u32,
    pub delta: &'a str,
    pub item_id: &'a str,
    pub logprobs: Empty,
    pub output_index: u32,
    pub sequence_number: u64,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `response.output_text.done`.
#[derive(Debug, Serialize)]
pub struct TextDoneEvent<'a> {
    pub content_index: u32,
    pub item_id: &'a str,
    pub logprobs: Empty,
    pub output_index: u32,
    pub sequence_number: u64,
    pub text: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_keys_are_in_vllm_order() {
        let s = serde_json::to_string(&ResponseUsage::new(40, 32, 0, 3)).unwrap();
        assert_eq!(
            s,
            r#"{"input_tokens":40,"input_tokens_details":{"cached_tokens":32,"cache_write_tokens":0,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},"total_tokens":43}"#
        );
    }

    #[test]
    fn echo_takes_vllm_defaults_and_floats() {
        let e = Echo::from_request(&json!({"temperature": 1, "instructions": "be brief"}));
        let r = ResponseObject::in_progress("resp_1".into(), 7, "m".into(), 16, e);
        let s = serde_json::to_string(&r).unwrap();
        assert!(s.starts_with(r#"{"id":"resp_1","created_at":7,"incomplete_details":null,"instructions":"be brief","metadata":null,"model":"m","object":"response","output":[],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":16,"#), "{s}");
        assert!(s.ends_with(r#""status":"in_progress","text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,"presence_penalty":0.0,"frequency_penalty":0.0,"kv_transfer_params":null,"ec_transfer_params":null,"input_messages":null,"output_messages":null}"#), "{s}");
    }

    #[test]
    fn output_message_shape() {
        let m = OutputMessage::new(
            "msg_1",
            vec![OutputText::new(" tok".into(), None)],
            "completed",
        );
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"id":"msg_1","content":[{"annotations":[],"text":" tok","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null}"#
        );
    }
}
