//! Property-based fuzzing of everything that parses client or backend bytes:
//! the config parser, the body inspection, the usage scanners. No input may
//! panic; scanners must not change what passes through.
//!
//! CI runs the default budget; run longer by hand with e.g.
//! `PROPTEST_CASES=200000 cargo test --release --test integration fuzz`.

use bytes::Bytes;
use poimen_gateway::accounting::scanner::{JsonScanner, SseScanner};
use poimen_gateway::accounting::{Dialect, Usage};
use poimen_gateway::body::{inspect, with_stream_usage};
use poimen_gateway::config::GatewayConfig;
use proptest::prelude::*;

const VALID: &str = "gateway:\n  listen: \"127.0.0.1:8080\"\n  scheduler: {max_num_seqs: 4}\n  models:\n    - name: m\n      addresses: [\"127.0.0.1:1\", {address: \"127.0.0.1:2\", weight: 2}]\n";

/// Cut `bytes` into pieces at the given (sorted, deduplicated) points.
fn pieces(bytes: &[u8], mut cuts: Vec<usize>) -> Vec<Bytes> {
    cuts.iter_mut().for_each(|c| *c %= bytes.len() + 1);
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    let mut last = 0;
    for c in cuts.into_iter().chain([bytes.len()]) {
        out.push(Bytes::copy_from_slice(&bytes[last..c]));
        last = c;
    }
    out
}

fn event() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z \"{}:,\\[\\]]{0,40}".prop_map(|t| format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
            t.replace('"', "\\\"")
        )),
        Just(": keep-alive\n\n".to_string()),
        Just("data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n".to_string()),
        "[ -~]{0,30}".prop_map(|t| format!("event: x\ndata: {t}\n\n")),
    ]
}

const USAGE_EVENT: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":70,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n";

proptest! {
    #[test]
    fn config_parser_never_panics(text in "\\PC{0,300}") {
        let _ = GatewayConfig::from_yaml(&text);
    }

    #[test]
    fn config_parser_survives_mutations(at in 0usize..VALID.len(), len in 0usize..8, insert in "[ -~\n]{0,6}") {
        let mut text = VALID.to_string();
        let at = (0..=at).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        let end = (at + len).min(text.len());
        let end = (end..=text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
        text.replace_range(at..end, &insert);
        let _ = GatewayConfig::from_yaml(&text);
    }

    #[test]
    fn body_inspection_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = inspect(&bytes);
    }

    #[test]
    fn the_model_is_found_wherever_it_stands(
        before in proptest::collection::vec(("[a-z]{1,8}", "[ -~]{0,20}"), 0..5),
        after in proptest::collection::vec(("[a-z]{1,8}", "[ -~]{0,20}"), 0..5),
        model in "[a-zA-Z0-9./:-]{1,30}",
        stream in any::<bool>(),
    ) {
        let member = |(k, v): &(String, String)| format!("\"x{k}\":{}", serde_json::Value::String(v.clone()));
        let mut members: Vec<String> = before.iter().map(member).collect();
        members.push(format!("\"model\":\"{model}\""));
        members.push(format!("\"stream\":{stream}"));
        members.extend(after.iter().map(member));
        let body = format!("{{{}}}", members.join(","));
        let facts = inspect(body.as_bytes()).unwrap();
        prop_assert_eq!(facts.model.as_ref(), model.as_str());
        prop_assert_eq!(facts.stream, stream);
        let rewritten = with_stream_usage(body.as_bytes());
        let v: serde_json::Value = serde_json::from_slice(&rewritten).unwrap();
        prop_assert_eq!(&v["stream_options"]["include_usage"], &serde_json::Value::Bool(true));
        let again = inspect(&rewritten).unwrap();
        prop_assert_eq!(again.model.as_ref(), model.as_str());
    }

    #[test]
    fn scanners_never_panic_and_pass_bytes_through(
        bytes in proptest::collection::vec(any::<u8>(), 0..2000),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        for api in [Dialect::Completions, Dialect::Responses, Dialect::Messages] {
            let mut sse = SseScanner::new(api, false);
            let mut json = JsonScanner::new(api);
            let mut out = Vec::new();
            for piece in pieces(&bytes, cuts.clone()) {
                json.feed(&piece);
                out.extend_from_slice(&sse.feed(piece));
            }
            out.extend_from_slice(&sse.finish());
            prop_assert_eq!(out, bytes.clone());
            let _ = json.finish();
        }
        // Stripping may drop a usage-only event, never add or reorder bytes.
        let mut strip = SseScanner::new(Dialect::Completions, true);
        let mut out = Vec::new();
        for piece in pieces(&bytes, cuts) {
            out.extend_from_slice(&strip.feed(piece));
        }
        out.extend_from_slice(&strip.finish());
        prop_assert!(out.len() <= bytes.len());
    }

    #[test]
    fn stripping_removes_exactly_the_usage_event_at_any_chunking(
        events in proptest::collection::vec(event(), 0..8),
        at in any::<prop::sample::Index>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
    ) {
        let plain: String = events.concat() + "data: [DONE]\n\n";
        let mut with_usage = events.clone();
        with_usage.insert(at.index(events.len() + 1), USAGE_EVENT.to_string());
        let stream = with_usage.concat() + "data: [DONE]\n\n";
        let mut s = SseScanner::new(Dialect::Completions, true);
        let mut out = Vec::new();
        for piece in pieces(stream.as_bytes(), cuts) {
            out.extend_from_slice(&s.feed(piece));
        }
        out.extend_from_slice(&s.finish());
        prop_assert_eq!(String::from_utf8(out).unwrap(), plain);
        prop_assert_eq!(s.usage(), Some(Usage { prompt_tokens: Some(70), cached_tokens: Some(32), completion_tokens: None }));
    }
}
