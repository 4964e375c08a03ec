//! `/v1/messages` (Anthropic): prompt = input + cache read + cache
//! creation, hits = cache read; a stream's `message_start` has the whole
//! prompt, `message_delta` the split and the output.

use super::*;

const API: Dialect = Dialect::Messages;

/// The 2,714-token prompt of which 2,688 were cached, as vLLM 0.32 reported
/// it on its first and on a later turn.
const FIRST_TURN: &str = r#"{"input_tokens":26,"output_tokens":16,"cache_creation_input_tokens":2688,"cache_read_input_tokens":0}"#;
const CACHED_TURN: &str = r#"{"input_tokens":26,"output_tokens":16,"cache_creation_input_tokens":0,"cache_read_input_tokens":2688}"#;
/// Hits unknown to vLLM (or a vLLM that does not report the cache fields):
/// the whole prompt in `input_tokens`.
const NO_CACHE_FIELDS: &str = r#"{"input_tokens":2714,"output_tokens":16}"#;

/// A body in vLLM's field order; a tool input with its own "usage" key and
/// text mentioning one come before the real usage.
fn message(usage: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-4c1d","type":"message","role":"assistant","content":[{{"type":"text","text":"Hi \"usage\": {{}}"}},{{"type":"tool_use","id":"call_1","name":"f","input":{{"usage":{{"input_tokens":1}}}}}}],"model":"qwen2.5-7b-instruct","stop_reason":"end_turn","stop_sequence":null,"usage":{usage}}}"#
    )
}

/// An event as vLLM writes it; `fields` follow `type`, each after a comma.
fn event(kind: &str, fields: &str) -> String {
    format!("event: {kind}\ndata: {{\"type\":\"{kind}\"{fields}}}\n\n")
}

/// A stream as vLLM converts it from a chat stream; `delta_usage` is the
/// `message_delta` usage, `None` for a stream cut before it.
fn stream(delta_usage: Option<&str>) -> String {
    let mut s = event(
        "message_start",
        r#","message":{"id":"chatcmpl-4c1d","type":"message","role":"assistant","content":[],"model":"qwen2.5-7b-instruct","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2714,"output_tokens":0}}"#,
    );
    s += &event(
        "content_block_start",
        r#","index":0,"content_block":{"type":"text","text":""}"#,
    );
    for text in ["Hi", " \\\"usage\\\": {}"] {
        s += &event(
            "content_block_delta",
            &format!(r#","index":0,"delta":{{"type":"text_delta","text":"{text}"}}"#),
        );
    }
    s += &event("content_block_stop", r#","index":0"#);
    if let Some(u) = delta_usage {
        s += &event(
            "message_delta",
            &format!(r#","delta":{{"stop_reason":"end_turn"}},"usage":{u}"#),
        );
        s += &event("message_stop", "");
    }
    s
}

#[test]
fn json_first_and_cached_turns_count_the_whole_prompt() {
    for (u, want) in [
        (FIRST_TURN, usage(Some(2714), Some(0), Some(16))),
        (CACHED_TURN, usage(Some(2714), Some(2688), Some(16))),
        (NO_CACHE_FIELDS, usage(Some(2714), None, Some(16))),
    ] {
        let body = message(u);
        for at in 0..=body.len() {
            let s = run_json(API, body.as_bytes(), at);
            assert_eq!(s.finish(), Some(want), "{u} split at {at}");
            assert_eq!(s.response_id(), None);
        }
    }
}

#[test]
fn stream_split_comes_in_message_delta_at_every_split_point() {
    for (u, want) in [
        (CACHED_TURN, usage(Some(2714), Some(2688), Some(16))),
        (FIRST_TURN, usage(Some(2714), Some(0), Some(16))),
    ] {
        let body = stream(Some(u));
        for at in 0..=body.len() {
            let (out, s) = run_sse(API, body.as_bytes(), at, true);
            assert_eq!(s.usage(), Some(want), "{u} split at {at}");
            assert_eq!(out, body.as_bytes(), "nothing stripped, split at {at}");
        }
    }
}

#[test]
fn a_stream_cut_before_message_delta_knows_only_the_prompt() {
    let body = stream(None);
    for at in 0..=body.len() {
        let (_, s) = run_sse(API, body.as_bytes(), at, false);
        assert_eq!(
            s.usage(),
            Some(usage(Some(2714), None, None)),
            "split at {at}"
        );
    }
    // Cut inside `message_start`: nothing is known.
    let (_, s) = run_sse(API, &body.as_bytes()[..40], 20, false);
    assert_eq!(s.usage(), None);
}

#[test]
fn a_delta_with_only_output_keeps_the_prompt_of_message_start() {
    // Anthropic's own API sends only `output_tokens` in `message_delta`.
    let (_, s) = run_sse(
        API,
        stream(Some(r#"{"output_tokens":16}"#)).as_bytes(),
        0,
        false,
    );
    assert_eq!(s.usage(), Some(usage(Some(2714), None, Some(16))));
}

#[test]
fn a_huge_content_event_passes_and_the_usage_after_it_counts() {
    let big = "y".repeat(MAX_EVENT_BYTES + 10);
    let body = stream(Some(CACHED_TURN)).replacen("Hi", &big, 1);
    let (out, s) = feed_sse(API, false, body.as_bytes().chunks(4096));
    assert!(out == body.as_bytes());
    assert_eq!(s.usage(), Some(usage(Some(2714), Some(2688), Some(16))));
}

#[test]
fn usage_missing() {
    let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"boom"}}"#;
    assert_eq!(run_json(API, body, 5).finish(), None);
    let (_, s) = run_sse(API, event("ping", "").as_bytes(), 3, false);
    assert_eq!(s.usage(), None);
}
