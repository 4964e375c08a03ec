//! `scheduler.load_feedback`: the gateway asks for vLLM's load report
//! (`endpoint-load-metrics`), admits fewer requests to a backend that
//! reports a long queue of other clients' requests, ignores a malformed
//! report, and with the option off neither asks nor listens.

use std::sync::Arc;
use std::time::Duration;

use crate::support::gateway::one_model;
use crate::support::{chat, header, FakeBackend, Gateway, Reply};

const LONG_QUEUE: &str =
    r#"JSON {"named_metrics": {"num_requests_waiting": 50.0, "kv_cache_usage_perc": 0.9}}"#;

/// What one run showed: the most requests the backend saw at once while 8
/// were sent together, the format header it received, the report header
/// the client received, and the slot limit the gateway exported after.
struct Run {
    peak: usize,
    asked: String,
    client_saw: String,
    limit: f64,
}

/// A backend that answers every request after 300 ms with `report`, behind
/// a gateway with `scheduler`; one request first, so the gateway has heard
/// a report, then 8 at once.
async fn run(scheduler: &str, report: &str) -> Run {
    let b = FakeBackend::start().await;
    b.set_delay(Duration::from_millis(300));
    b.set_reply(Reply::Json {
        body: r#"{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[]}"#.into(),
        headers: vec![("endpoint-load-metrics", report.to_string())],
    });
    let yaml = format!("  scheduler: {scheduler}\n{}", one_model("m", &[b.addr]));
    let gw = Arc::new(Gateway::start(&yaml).await);
    let first = chat(&gw, "m", Some("k")).await;
    assert_eq!(first.status(), 200);
    let client_saw = header(&first, "endpoint-load-metrics");
    b.reset_max_inflight();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let gw = gw.clone();
            tokio::spawn(async move { chat(&gw, "m", Some(&format!("k{i}"))).await.status() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let asked = b.seen()[0]
        .headers
        .get("endpoint-load-metrics-format")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let backend = b.addr.to_string();
    let labels = [("model", "m"), ("backend", backend.as_str())];
    Run {
        peak: b.max_inflight(),
        asked,
        client_saw,
        // Read while the last report is fresh (it expires after 2 s).
        limit: gw.metric("poimen_gateway_slot_limit", &labels).await,
    }
}

/// One replica, a backend of 4 slots (its share: all of them).
const ON: &str = "{max_num_seqs: 4, load_feedback: true}";

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_reporting_a_long_queue_gets_fewer_requests_than_its_share() {
    let r = run(ON, LONG_QUEUE).await;
    assert_eq!(r.asked, "json");
    // 4 slots, 50 waiting of other clients: this replica keeps 1 slot.
    assert_eq!(r.peak, 1);
    assert_eq!(r.limit, 1.0);
    assert_eq!(
        r.client_saw, "",
        "the report is the gateway's, not the client's"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn off_the_report_is_neither_asked_for_nor_used() {
    let r = run("{max_num_seqs: 4}", LONG_QUEUE).await;
    assert_eq!(r.asked, "");
    assert_eq!(r.peak, 4);
    assert_eq!(r.limit, 4.0);
    // Not the gateway's business: passed through as the backend sent it.
    assert_eq!(r.client_saw, LONG_QUEUE);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_report_changes_nothing() {
    for bad in [
        r#"JSON {"named_metrics": {"num_requests_waiting": -3}}"#,
        "JSON {not json",
        "TEXT named_metrics.num_requests_waiting=lots",
    ] {
        let r = run(ON, bad).await;
        assert_eq!(r.asked, "json");
        assert_eq!(r.peak, 4, "{bad}");
        assert_eq!(r.limit, 4.0, "{bad}");
        assert_eq!(r.client_saw, "", "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queue_the_replicas_own_borrowing_explains_leaves_a_replica_its_share() {
    // 3 replicas on a backend of 6: a share of 2 each; a queue of up to 2
    // (one slot borrowed by each other replica) is theirs to give back.
    let three = "{max_num_seqs: 6, replicas: 3, load_feedback: true}";
    let waiting =
        |n: usize| format!(r#"JSON {{"named_metrics": {{"num_requests_waiting": {n}.0}}}}"#);
    let r = run(three, &waiting(2)).await;
    assert_eq!((r.peak, r.limit), (2, 2.0));
    // A longer one is other clients': this replica takes its part,
    // 1 * 6 / (6 + 3) -> 1.
    let r = run(three, &waiting(3)).await;
    assert_eq!((r.peak, r.limit), (1, 1.0));
}
