//! `/v1/responses`: usage in the body and in `response.completed`; the id
//! in the body's first member and in `response.created`.

use super::*;

const API: Dialect = Dialect::Responses;
const ID: &str = "resp_9b1f2c";
const EXPECTED: Usage = Usage {
    prompt_tokens: Some(2714),
    cached_tokens: Some(2688),
    completion_tokens: Some(16),
};

/// A response object in vLLM's field order. The instructions mention an id
/// and usage inside a string; the output item has its own id.
fn response(status: &str, output: &str, usage: &str) -> String {
    format!(
        r#"{{"id":"{ID}","created_at":1764512345,"incomplete_details":null,"instructions":"Be brief. Reply \"id\":\"resp_fake\", \"usage\":{{}}","metadata":null,"model":"qwen2.5-7b-instruct","object":"response","output":[{output}],"parallel_tool_calls":true,"temperature":0.7,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":64,"max_tool_calls":null,"previous_response_id":"resp_prev","prompt":null,"reasoning":null,"service_tier":"auto","status":"{status}","text":null,"top_logprobs":null,"truncation":"disabled","usage":{usage},"user":null,"input_messages":null,"output_messages":null}}"#
    )
}

fn output_item(text: &str) -> String {
    format!(
        r#"{{"id":"msg_77aa","content":[{{"annotations":[],"text":"{text}","type":"output_text","logprobs":null}}],"role":"assistant","status":"completed","type":"message"}}"#
    )
}

const USAGE: &str = r#"{"input_tokens":2714,"input_tokens_details":{"cached_tokens":2688,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":16,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},"total_tokens":2730}"#;

/// An event as vLLM's router writes it: `event:` line, then the event with
/// its `type` last.
fn event(kind: &str, seq: usize, fields: &str) -> String {
    format!("event: {kind}\ndata: {{{fields},\"sequence_number\":{seq},\"type\":\"{kind}\"}}\n\n")
}

fn stream(completed_text: Option<&str>) -> String {
    let initial = response("in_progress", "", "null");
    let mut s = event("response.created", 0, &format!("\"response\":{initial}"));
    s += &event(
        "response.in_progress",
        1,
        &format!("\"response\":{initial}"),
    );
    s += &event(
        "response.output_item.added",
        2,
        r#""item":{"id":"msg_77aa","content":[],"role":"assistant","status":"in_progress","type":"message"},"output_index":0"#,
    );
    for (i, delta) in ["Hel", "lo \\\"usage\\\""].iter().enumerate() {
        s += &event(
            "response.output_text.delta",
            3 + i,
            &format!(
                r#""content_index":0,"delta":"{delta}","item_id":"msg_77aa","logprobs":[],"output_index":0"#
            ),
        );
    }
    if let Some(text) = completed_text {
        let done = response("completed", &output_item(text), USAGE);
        s += &event("response.completed", 5, &format!("\"response\":{done}"));
    }
    s
}

#[test]
fn json_usage_and_id_at_every_split_point() {
    let body = response("completed", &output_item("Hello"), USAGE);
    let id_end = body.find(ID).unwrap() + ID.len() + 1;
    for at in 0..=body.len() {
        let mut s = JsonScanner::new(API);
        s.feed(&body.as_bytes()[..at]);
        // Known as soon as its closing quote has passed.
        assert_eq!(s.response_id().is_some(), at >= id_end, "split at {at}");
        s.feed(&body.as_bytes()[at..]);
        assert_eq!(s.response_id(), Some(ID), "split at {at}");
        assert_eq!(s.finish(), Some(EXPECTED), "split at {at}");
    }
}

#[test]
fn only_the_leading_id_of_a_body_counts() {
    let id = |body: &str| {
        run_json(API, body.as_bytes(), 0)
            .response_id()
            .map(str::to_owned)
    };
    // Pretty-printed, and with escapes.
    assert_eq!(
        id("\n{\n  \"id\" : \"resp_1\",\n  \"output\": []}"),
        Some("resp_1".into())
    );
    assert_eq!(id(r#"{"id":"resp_\u0031"}"#), Some("resp_1".into()));
    // Ids of output items, in strings, or nested: not the response's.
    assert_eq!(
        id(r#"{"object":"response","output":[{"id":"msg_1"}],"id":"resp_2"}"#),
        None
    );
    assert_eq!(
        id(r#"{"instructions":"{\"id\":\"resp_3\"}","id":"resp_4"}"#),
        None
    );
    assert_eq!(id(r#"{"response":{"id":"resp_5"}}"#), None);
    assert_eq!(id(r#"[{"id":"resp_6"}]"#), None);
    assert_eq!(id(r#"{"idx":"resp_7"}"#), None);
    assert_eq!(id(r#"{"id":7}"#), None);
    // Bounded: an id over MAX_RESPONSE_ID_BYTES is ignored, however it is cut.
    let at_bound = "r".repeat(MAX_RESPONSE_ID_BYTES);
    assert_eq!(
        id(&format!(r#"{{"id":"{at_bound}"}}"#)),
        Some(at_bound.clone())
    );
    let long = format!(
        r#"{{"id":"{}","usage":null}}"#,
        "r".repeat(MAX_RESPONSE_ID_BYTES + 1)
    );
    let huge = format!(r#"{{"id":"{}","usage":null}}"#, "r".repeat(4 * HEAD_BYTES));
    for body in [long, huge] {
        for at in 0..=body.len() {
            let s = run_json(API, body.as_bytes(), at);
            assert_eq!(s.response_id(), None, "split at {at}");
            assert!(s.head.is_none(), "head released");
        }
    }
}

#[test]
fn stream_usage_and_id_at_every_split_point() {
    let body = stream(Some("Hello"));
    let created_end = body.find("\n\n").unwrap() + 2;
    for at in 0..=body.len() {
        for strip in [false, true] {
            let mut s = SseScanner::new(API, strip);
            let mut out = s
                .feed(Bytes::copy_from_slice(&body.as_bytes()[..at]))
                .to_vec();
            // Known as soon as `response.created` is complete.
            assert_eq!(
                s.response_id().is_some(),
                at >= created_end,
                "split at {at}"
            );
            out.extend_from_slice(&s.feed(Bytes::copy_from_slice(&body.as_bytes()[at..])));
            out.extend_from_slice(&s.finish());
            assert!(!s.strips(), "nothing to strip in a Responses stream");
            assert_eq!(out, body.as_bytes(), "bytes unchanged, split at {at}");
            assert_eq!(s.usage(), Some(EXPECTED), "split at {at}");
            assert_eq!(s.response_id(), Some(ID), "split at {at}");
        }
    }
}

#[test]
fn a_stream_cut_before_completion_has_an_id_but_no_usage() {
    let (_, s) = feed_sse(API, false, stream(None).as_bytes().chunks(1));
    assert_eq!(s.usage(), None);
    assert_eq!(s.response_id(), Some(ID));
}

#[test]
fn openai_order_without_event_lines() {
    let done = response("completed", &output_item("x"), USAGE);
    let body = format!(
        "data: {{\"type\":\"response.created\",\"sequence_number\":0,\"response\":{}}}\n\n\
         data: {{\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{done}}}\n\n",
        response("in_progress", "", "null")
    );
    let (_, s) = run_sse(API, body.as_bytes(), 0, false);
    assert_eq!(s.usage(), Some(EXPECTED));
    assert_eq!(s.response_id(), Some(ID));
}

#[test]
fn an_overlong_id_in_the_stream_is_ignored() {
    let long = "r".repeat(MAX_RESPONSE_ID_BYTES + 1);
    let body = stream(Some("x")).replace(ID, &long);
    let (_, s) = run_sse(API, body.as_bytes(), 100, false);
    assert_eq!(s.response_id(), None);
    assert_eq!(s.usage(), Some(EXPECTED));
}

#[test]
fn a_huge_completed_event_still_gives_its_usage() {
    // `response.completed` repeats the whole output: here more than an
    // event the scanner holds, fed in pieces and in one chunk.
    let text = "y".repeat(MAX_EVENT_BYTES + 10);
    let body = stream(Some(&text));
    for piece in [4096, body.len()] {
        let (out, s) = feed_sse(API, false, body.as_bytes().chunks(piece));
        assert!(out == body.as_bytes(), "piece {piece}");
        assert_eq!(s.usage(), Some(EXPECTED), "piece {piece}");
        assert_eq!(s.response_id(), Some(ID), "piece {piece}");
    }
}

#[test]
fn usage_missing_or_null() {
    let body = response("completed", &output_item("x"), "null");
    let s = run_json(API, body.as_bytes(), 9);
    assert_eq!(s.finish(), None);
    assert_eq!(s.response_id(), Some(ID));
    let error = br#"{"error":{"message":"boom","type":"BadRequestError","code":400}}"#;
    let s = run_json(API, error, 3);
    assert_eq!((s.finish(), s.response_id()), (None, None));
}
