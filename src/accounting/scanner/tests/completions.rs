//! `/v1/chat/completions` and `/v1/completions`.

use super::*;

const API: Dialect = Dialect::Completions;

/// A real vLLM 0.32 stream's last chunks, as sent with include_usage.
const FINAL_CHUNK: &str = r#"{"id":"chatcmpl-9f1c","object":"chat.completion.chunk","created":1764512345,"model":"qwen2.5-7b-instruct","choices":[],"usage":{"prompt_tokens":650,"total_tokens":666,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":512}}}"#;

fn token_chunk(i: usize) -> String {
    format!(
        r#"{{"id":"chatcmpl-9f1c","object":"chat.completion.chunk","created":1764512345,"model":"qwen2.5-7b-instruct","choices":[{{"index":0,"delta":{{"content":" tok{i} \"usage\": {{}}\n"}},"logprobs":null,"finish_reason":null}}]}}"#
    )
}

fn stream(with_usage: bool) -> String {
    let mut s = String::new();
    for i in 0..3 {
        s += &format!("data: {}\n\n", token_chunk(i));
    }
    if with_usage {
        s += &format!("data: {FINAL_CHUNK}\n\n");
    }
    s + "data: [DONE]\n\n"
}

const EXPECTED: Usage = Usage {
    prompt_tokens: Some(650),
    cached_tokens: Some(512),
    completion_tokens: Some(16),
};

#[test]
fn sse_usage_is_found_at_every_split_point() {
    let body = stream(true);
    for at in 0..=body.len() {
        let (out, s) = run_sse(API, body.as_bytes(), at, false);
        assert_eq!(s.usage(), Some(EXPECTED), "split at {at}");
        assert_eq!(out, body.as_bytes(), "passthrough changed bytes at {at}");
        assert_eq!(s.response_id(), None);
    }
}

#[test]
fn stripping_removes_only_the_usage_chunk_at_every_split_point() {
    let with = stream(true);
    let without = stream(false);
    for at in 0..=with.len() {
        let (out, s) = run_sse(API, with.as_bytes(), at, true);
        assert_eq!(s.usage(), Some(EXPECTED), "split at {at}");
        assert_eq!(String::from_utf8(out).unwrap(), without, "split at {at}");
    }
}

#[test]
fn stripping_a_stream_fed_byte_by_byte() {
    let with = stream(true);
    let (out, s) = feed_sse(API, true, with.as_bytes().chunks(1));
    assert_eq!(String::from_utf8(out).unwrap(), stream(false));
    assert_eq!(s.usage(), Some(EXPECTED));
}

#[test]
fn crlf_events_and_a_stream_without_usage() {
    let body = format!(
        "data: {}\r\n\r\ndata: {FINAL_CHUNK}\r\n\r\ndata: [DONE]\r\n\r\n",
        token_chunk(0)
    );
    for at in 0..=body.len() {
        let (out, s) = run_sse(API, body.as_bytes(), at, true);
        assert_eq!(s.usage(), Some(EXPECTED), "split at {at}");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("data: {}\r\n\r\ndata: [DONE]\r\n\r\n", token_chunk(0))
        );
    }
    let (out, s) = run_sse(API, stream(false).as_bytes(), 10, true);
    assert_eq!(s.usage(), None);
    assert_eq!(out, stream(false).as_bytes());
}

#[test]
fn continuous_usage_keeps_the_last_and_strips_nothing_with_choices() {
    // With continuous usage stats every chunk has usage; only the
    // `"choices": []` one is usage-only.
    let chunk = r#"{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":650,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}"#;
    let body = format!("data: {chunk}\n\ndata: {FINAL_CHUNK}\n\ndata: [DONE]\n\n");
    let (out, s) = run_sse(API, body.as_bytes(), 7, true);
    assert_eq!(s.usage(), Some(EXPECTED));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        format!("data: {chunk}\n\ndata: [DONE]\n\n")
    );
    // A stream cut after that first chunk: what it said so far.
    let (_, s) = run_sse(API, format!("data: {chunk}\n\n").as_bytes(), 3, false);
    assert_eq!(s.usage(), Some(usage(Some(650), Some(0), Some(1))));
}

#[test]
fn an_oversized_event_passes_through_unchanged() {
    let big = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "y".repeat(MAX_EVENT_BYTES + 10)
    );
    let body = big.clone() + &format!("data: {FINAL_CHUNK}\n\n");
    // Pieces of 4 KiB, and every cut around the big event's terminator.
    for cut in big.len() - 4..=big.len() + 1 {
        for strip in [true, false] {
            let (head, rest) = body.as_bytes().split_at(cut);
            let pieces = head.chunks(4096).chain([rest]);
            let (out, s) = feed_sse(API, strip, pieces);
            let want = if strip { big.clone() } else { body.clone() };
            assert!(out == want.as_bytes(), "strip={strip} cut={cut}");
            assert_eq!(s.usage(), Some(EXPECTED), "strip={strip} cut={cut}");
        }
    }
}

const JSON_BODY: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1764512345,"model":"qwen2.5-7b-instruct","choices":[{"index":0,"message":{"role":"assistant","content":"the \"usage\": {\"prompt_tokens\": 1} in text","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":651,"total_tokens":667,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":512}},"prompt_logprobs":null,"kv_transfer_params":null}"#;

#[test]
fn json_usage_is_found_at_every_split_point() {
    for at in 0..=JSON_BODY.len() {
        let s = run_json(API, JSON_BODY.as_bytes(), at);
        assert_eq!(
            s.finish(),
            Some(usage(Some(651), Some(512), Some(16))),
            "split at {at}"
        );
        assert_eq!(s.response_id(), None, "not read for completions");
    }
}

#[test]
fn json_usage_at_the_end_of_a_large_body() {
    let content = "z".repeat(3 * TAIL_BYTES);
    let body = JSON_BODY.replace(
        "the \\\"usage\\\": {\\\"prompt_tokens\\\": 1} in text",
        &content,
    );
    let mut s = JsonScanner::new(API);
    for piece in body.as_bytes().chunks(1000) {
        s.feed(piece);
    }
    assert!(s.tail.0.len() <= TAIL_BYTES);
    assert_eq!(s.finish().unwrap().cached_tokens, Some(512));
}

#[test]
fn json_without_usage_or_with_null_details() {
    let json = |body: &[u8]| run_json(API, body, 0).finish();
    assert_eq!(json(br#"{"object":"error","message":"boom"}"#), None);
    assert_eq!(
        json(br#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":null}}"#),
        Some(usage(Some(9), None, None))
    );
    assert_eq!(json(br#"{"usage": null}"#), None);
}
