//! Every metric the gateway exports, defined once, in the `prometheus`
//! default registry that Pingora's Prometheus service serves.
//!
//! Label values come only from the configuration (model names, backend
//! addresses) and fixed words (route, reason, status class): never from keys,
//! paths or anything else a client sends, so series stay bounded.

use std::sync::LazyLock;

use prometheus::{
    register_histogram, register_int_counter, register_int_counter_vec, register_int_gauge_vec,
    Histogram, IntCounter, IntCounterVec, IntGaugeVec,
};

use crate::admission::Gauges;

fn counter(name: &str, help: &str) -> IntCounter {
    register_int_counter!(name, help).expect("metric names are unique and valid")
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register_int_counter_vec!(name, help, labels).expect("metric names are unique and valid")
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register_int_gauge_vec!(name, help, labels).expect("metric names are unique and valid")
}

const BACKEND: &[&str] = &["model", "backend"];

/// CAG-2 AC5.
pub static WARMUP_DELAYED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "warmup_requests_delayed_total",
        "Warmup requests delayed before competing for a slot",
    )
});

pub static QUEUE_REJECTED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_queue_rejected_total",
        "Requests refused with 503 by admission, by reason (queue_full, queue_timeout)",
        &["model", "backend", "reason"],
    )
});

pub static INFLIGHT: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    gauge_vec(
        "poimen_gateway_inflight",
        "Requests holding a slot on the backend",
        BACKEND,
    )
});

pub static QUEUE_DEPTH: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    gauge_vec(
        "poimen_gateway_queue_depth",
        "Requests waiting for a slot on the backend",
        BACKEND,
    )
});

/// Waits from a few ms (a slot frees quickly) to the queue timeout (60 s by
/// default): log-spaced buckets up to a minute.
pub static QUEUE_WAIT: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "poimen_gateway_queue_wait_seconds",
        "Time a request waited for a slot (0 when one was free)",
        vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
    )
    .expect("metric names are unique and valid")
});

pub static BACKEND_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_backend_failures_total",
        "Connect failures and resets before a response, per backend",
        BACKEND,
    )
});

/// The gauges one backend's admission keeps current.
pub fn admission_gauges(model: &str, backend: &str) -> Gauges {
    Gauges {
        inflight: INFLIGHT.with_label_values(&[model, backend]),
        queued: QUEUE_DEPTH.with_label_values(&[model, backend]),
    }
}

/// Create every labelled series at zero, so dashboards and alerts see a
/// backend before its first event.
pub fn init_backend(model: &str, backend: &str) {
    for reason in ["queue_full", "queue_timeout"] {
        QUEUE_REJECTED.with_label_values(&[model, backend, reason]);
    }
    BACKEND_FAILURES.with_label_values(&[model, backend]);
    LazyLock::force(&WARMUP_DELAYED);
    LazyLock::force(&QUEUE_WAIT);
}
