//! Every metric the gateway exports, defined once, in the `prometheus`
//! default registry that Pingora's Prometheus service serves.
//!
//! Label values come only from the configuration (model names, backend
//! addresses) and fixed words (route, reason, status class): never from keys,
//! paths or anything else a client sends, so series stay bounded.

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Instant;

use http::HeaderValue;
use prometheus::core::{Collector, Desc, MetricVec, MetricVecBuilder};
use prometheus::proto::MetricFamily;
use prometheus::{
    register_histogram, register_histogram_vec, register_int_counter, register_int_counter_vec,
    register_int_gauge_vec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts,
};

fn counter(name: &str, help: &str) -> IntCounter {
    register_int_counter!(name, help).expect("metric names are unique and valid")
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let vec =
        register_int_counter_vec!(name, help, labels).expect("metric names are unique and valid");
    per_backend(&vec, labels);
    vec
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let vec =
        register_int_gauge_vec!(name, help, labels).expect("metric names are unique and valid");
    per_backend(&vec, labels);
    vec
}

/// Removes one backend's series (model, backend) from a metric.
type Remover = Box<dyn Fn(&str, &str) + Send + Sync>;

/// Every metric labelled by backend, as it is created: [`remove_backend`]
/// reads this list, so no metric of a backend can be left out of it.
static BY_BACKEND: Mutex<Vec<Remover>> = Mutex::new(Vec::new());

fn per_backend<T: MetricVecBuilder + 'static>(vec: &MetricVec<T>, labels: &[&str]) {
    if labels.contains(&"backend") {
        let vec = vec.clone();
        let remover: Remover =
            Box::new(move |model, backend| remove_matching(&vec, model, backend));
        BY_BACKEND
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(remover);
    }
}

const BACKEND: &[&str] = &["model", "backend"];

/// Warmups held back by the warmup delay (named as in the gateway this one
/// replaces, hence no `poimen_gateway_` prefix).
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

/// How the backend of a stored response was found, by result: `known` (the
/// gateway remembered it), `found` (a backend said it has it),
/// `not_found` (every backend said it has not), `no_answer` (none has it
/// among those that answered), `unavailable` (its backend is excluded,
/// failed the request or left).
pub static RESPONSE_OWNER_LOOKUPS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_response_owner_lookups_total",
        "Requests about a stored response, by how its backend was found \
         (known, found, not_found, no_answer, unavailable)",
        &["result"],
    )
});

/// Per tenant: label values are the listed tenants' names, then up to
/// `tenants.max_tracked` other names, then `other` (`crate::tenants`).
pub static TENANT_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_tenant_requests_total",
        "Requests for a configured model, by tenant, model and status code",
        &["tenant", "model", "code"],
    )
});

/// Label values: the configured alias (a glob stays a glob) and the model
/// it names.
pub static ALIAS_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_alias_requests_total",
        "Requests that named a model by an alias, by alias and served model",
        &["alias", "model"],
    )
});

pub static TENANT_TOKENS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_tenant_tokens_total",
        "Tokens as the backends reported them, by tenant, model and kind \
         (prompt, cached, completion)",
        &["tenant", "model", "kind"],
    )
});

pub static TENANT_REJECTED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_tenant_rejected_total",
        "Requests refused, by tenant and reason (queue_full, max_in_flight, \
         requests_per_minute, tokens_per_minute)",
        &["tenant", "reason"],
    )
});

/// In the unit `tenants.fairness` counts: requests, or weighted tokens
/// (uncached prompt tokens plus output tokens times their learnt or set
/// cost), rounded per request.
pub static TENANT_SERVICE: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_tenant_service_total",
        "Service the backends gave the tenant, in the unit fair admission \
         counts it in (tenants.fairness: requests, or weighted tokens)",
        &["tenant"],
    )
});

pub static TENANT_IN_FLIGHT: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    gauge_vec(
        "poimen_gateway_tenant_in_flight",
        "Requests of the tenant holding a slot or a queue place, or waiting for one",
        &["tenant"],
    )
});

pub static IN_FLIGHT: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    gauge_vec(
        "poimen_gateway_in_flight",
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

/// Per backend of a learned pool (`model` is the pool's label).
pub static LEARNED_MODELS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    gauge_vec(
        "poimen_gateway_learned_models",
        "Models and adapters the backend listed in its last answer to GET /v1/models",
        BACKEND,
    )
});

pub static LEARN_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_learn_failures_total",
        "GET /v1/models of a learned pool's backend that failed, timed out or was not a model list",
        BACKEND,
    )
});

pub static REFUSED_NAMES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_learned_names_refused_total",
        "Names in a learned pool's backend's model list that are no model name (blank, or with control characters), each time it lists them",
        BACKEND,
    )
});

pub static ADAPTER_LOADS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_adapter_loads_total",
        "LoRA adapters loaded on demand on a learned pool's backend, by result (loaded, failed)",
        &["model", "backend", "result"],
    )
});

/// Prompts of a model with KV-cache events, by whether they were
/// tokenized as vLLM does (`crate::render`).
pub static PROMPTS_RENDERED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_prompts_rendered_total",
        "Prompts of a model with kv_events, by result: rendered (tokenized as vLLM does), or why not (api, not_text, tools, salted, stored, unsupported, failed: routed by the estimate)",
        &["model", "result"],
    )
});

/// vLLM's KV-cache events (`crate::kv_events`), per backend.
pub static KV_EVENT_MESSAGES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_kv_event_messages_total",
        "KV-cache event messages from a backend, by result (applied, malformed)",
        &["model", "backend", "result"],
    )
});

pub static KV_EVENT_BLOCKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_kv_event_blocks_total",
        "KV blocks a backend's events stored, removed or that could not be placed (skipped), by kind",
        &["model", "backend", "kind"],
    )
});

pub static KV_EVENT_GAPS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_kv_event_gaps_total",
        "Breaks in a backend's event sequence, by result: replayed, lost (its blocks forgotten), restart",
        &["model", "backend", "result"],
    )
});

pub static KV_EVENTS_CONNECTED: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    gauge_vec(
        "poimen_gateway_kv_events_connected",
        "1 while the gateway is subscribed to the backend's KV-cache events; 0: the prefix index estimates it",
        BACKEND,
    )
});

/// Log lines lost to a full log queue: stderr was not read fast enough
/// (see `logging`).
/// Trace spans that were not exported, by reason: `queue_full` (the
/// collector is slower than the requests), `export_failed` (it refused or
/// could not be reached).
pub static TRACE_SPANS_DROPPED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_trace_spans_dropped_total",
        "Trace spans dropped, by reason (queue_full, export_failed)",
        &["reason"],
    )
});

/// The dropped-span series at zero, when tracing is on.
pub fn init_trace_drops() {
    for reason in ["queue_full", "export_failed"] {
        TRACE_SPANS_DROPPED.with_label_values(&[reason]);
    }
}

pub static LOG_LINES_DROPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "poimen_gateway_log_lines_dropped_total",
        "Log lines dropped because the queue to the stderr writer was full",
    )
});

/// Requests refused with 401, by reason (`auth::Reason`, a fixed set of
/// labels).
pub static AUTH_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_auth_failures_total",
        "Requests refused with 401, by reason (missing, malformed, bad_signature, expired, \
         not_yet_valid, issuer, audience, unknown_key, algorithm)",
        &["reason"],
    )
});

pub static JWKS_REFRESH_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "poimen_gateway_jwks_refresh_failures_total",
        "JWKS fetches (periodic or for an unknown key) that failed; the last good keys stay in force",
    )
});

/// Create the authentication series (one per refusal `reason`) at zero,
/// so an alert on a rate sees the first failure.
pub fn init_auth(reasons: impl IntoIterator<Item = &'static str>, jwks_url: bool) {
    for reason in reasons {
        AUTH_FAILURES.with_label_values(&[reason]);
    }
    if jwks_url {
        LazyLock::force(&JWKS_REFRESH_FAILURES);
    }
}

/// Prompt tokens vLLM served from its prefix cache.
pub static PREFIX_CACHE_HIT_TOKENS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "vllm_prefix_cache_hit_tokens_total",
        "Prompt tokens served from the backend's prefix cache (when reported)",
        BACKEND,
    )
});

/// What the prefix index expected cached, beside what vLLM reported.
pub static PREFIX_INDEX_EXPECTED_TOKENS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_prefix_index_expected_tokens_total",
        "Prompt tokens the prefix index expected the backend to hold, of responses whose usage was read (routing.prefix_index)",
        BACKEND,
    )
});

/// The denominator of the hit rate: hit / prompt is one PromQL division.
pub static PROMPT_TOKENS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_prompt_tokens_total",
        "Prompt tokens of completions whose usage was reported",
        BACKEND,
    )
});

pub static USAGE_MISSING: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_usage_missing_total",
        "Successful completions whose cached tokens are unknown (no header, no usage)",
        BACKEND,
    )
});

pub static REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_requests_total",
        "Requests for a configured model, by backend, route and status code",
        &["model", "backend", "route", "code"],
    )
});

/// Whole requests run from milliseconds (a 503, a short completion) to
/// minutes (long generations): buckets from 50 ms to 10 min.
pub static REQUEST_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "poimen_gateway_request_duration_seconds",
        "Time from the request to the end of its response",
        &["model"],
        vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0]
    )
    .expect("metric names are unique and valid")
});

/// Time to the first body byte: for a stream, the first token. Prefill of a
/// cached prompt takes tens of ms, a cold long prompt seconds, a queued one
/// longer: buckets from 10 ms to 2 min.
pub static TIME_TO_FIRST_BYTE: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "poimen_gateway_time_to_first_byte_seconds",
        "Time from the request to the first response body byte from the backend",
        &["model"],
        vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0]
    )
    .expect("metric names are unique and valid")
});

/// Failed lookups of a model's backend names (see `discovery`).
pub static DISCOVERY_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "poimen_gateway_discovery_errors_total",
        "Failed or empty DNS lookups of the model's backend names (the last good addresses are kept)",
        &["model"],
    )
});

/// One model's current backends and a value for each, read at scrape time.
pub type Reading = Arc<dyn Fn(Instant) -> Vec<(SocketAddr, i64)> + Send + Sync>;

/// A gauge read from each model's current backend set at scrape time: never
/// stale (an exclusion window ends, a load report expires), and a backend
/// that left the set leaves the metric.
struct ScrapeGauge {
    models: Vec<(String, Reading)>,
    gauge: IntGaugeVec,
}

impl Collector for ScrapeGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = Instant::now();
        self.gauge.reset();
        for (model, read) in &self.models {
            for (addr, value) in read(now) {
                let g: IntGauge = self.gauge.with_label_values(&[model, &addr.to_string()]);
                g.set(value);
            }
        }
        self.gauge.collect()
    }
}

fn register_scrape_gauge(name: &str, help: &str, models: Vec<(String, Reading)>) {
    let gauge = IntGaugeVec::new(Opts::new(name, help), BACKEND).expect("valid metric");
    if let Err(e) = prometheus::register(Box::new(ScrapeGauge { models, gauge })) {
        log::warn!("{name} not registered: {e}");
    }
}

/// `poimen_gateway_backend_excluded{model,backend}`: 0/1.
pub fn register_exclusions(models: Vec<(String, Reading)>) {
    register_scrape_gauge(
        "poimen_gateway_backend_excluded",
        "1 while the backend is excluded after a failure, else 0",
        models,
    );
}

/// `poimen_gateway_slot_limit{model,backend}`: the slots this gateway may
/// hold on the backend now.
pub fn register_slot_limits(models: Vec<(String, Reading)>) {
    register_scrape_gauge(
        "poimen_gateway_slot_limit",
        "Slots this gateway may use on the backend now: its share of max_num_seqs, or as load feedback moved it",
        models,
    );
}

/// `poimen_gateway_prefix_index_tokens{model,backend}`: the prompt tokens
/// the prefix index takes the backend to hold (`routing::index`).
pub fn register_prefix_index(models: Vec<(String, Reading)>) {
    register_scrape_gauge(
        "poimen_gateway_prefix_index_tokens",
        "Prompt tokens the prefix index takes the backend to hold in its KV cache (routing.prefix_index)",
        models,
    );
}

/// A backend's per-request series and labels, resolved once when it joins
/// the set: a request then neither formats the address nor hashes label
/// values to count (see `pool::Members`).
pub struct BackendSeries {
    /// The address as the `backend` label shows it.
    pub label: String,
    /// The same, as the `X-Poimen-Backend` response header.
    pub header: HeaderValue,
    pub failures: IntCounter,
    pub hit_tokens: IntCounter,
    pub prompt_tokens: IntCounter,
    pub usage_missing: IntCounter,
    /// With a prefix index only.
    pub expected_tokens: Option<IntCounter>,
    /// `poimen_gateway_requests_total` of this model and backend with code
    /// 200, by route (`routing::Route` as a number), each found when first
    /// counted.
    answered: [OnceLock<IntCounter>; ROUTES],
    model: String,
}

/// How many routes `routing::Route` has.
pub const ROUTES: usize = 8;

impl BackendSeries {
    /// The series of backend `addr` of `model`; `indexed`: the model keeps
    /// a prefix index.
    pub fn new(model: &str, addr: &SocketAddr, indexed: bool) -> Self {
        let label = addr.to_string();
        let labels = [model, label.as_str()];
        BackendSeries {
            expected_tokens: indexed
                .then(|| PREFIX_INDEX_EXPECTED_TOKENS.with_label_values(&labels)),
            header: HeaderValue::from_str(&label).expect("an address is a valid header value"),
            failures: BACKEND_FAILURES.with_label_values(&labels),
            hit_tokens: PREFIX_CACHE_HIT_TOKENS.with_label_values(&labels),
            prompt_tokens: PROMPT_TOKENS.with_label_values(&labels),
            usage_missing: USAGE_MISSING.with_label_values(&labels),
            answered: Default::default(),
            model: model.to_string(),
            label,
        }
    }

    /// Count a request of `model` that this backend answered, chosen by
    /// `route` (its number and name); a 200 of the backend's own model is
    /// counted without a lookup.
    pub fn count_request(&self, model: &str, route: (usize, &str), code: &str) {
        let labels = [model, self.label.as_str(), route.1, code];
        let kept = (code == "200" && model == self.model).then(|| self.answered.get(route.0));
        count_on(kept.flatten(), &REQUESTS, &labels, IntCounter::inc);
    }
}

/// Count on the series of `labels` in `vec`: the one `kept` (found at its
/// first use), or looked up now when nothing keeps it.
fn count_on(
    kept: Option<&OnceLock<IntCounter>>,
    vec: &IntCounterVec,
    labels: &[&str],
    count: impl FnOnce(&IntCounter),
) {
    match kept {
        Some(kept) => count(kept.get_or_init(|| vec.with_label_values(labels))),
        None => count(&vec.with_label_values(labels)),
    }
}

/// A tenant's per-request series, each found in its metric when first
/// used and kept: a request then counts without hashing label values or
/// taking the metric's lock. Kept for up to [`MAX_KEPT_MODELS`] models (a
/// learned pool may serve thousands of adapter names); the rest are looked
/// up as they come.
#[derive(Debug)]
pub struct TenantSeries {
    label: Arc<str>,
    in_flight: OnceLock<IntGauge>,
    service: OnceLock<IntCounter>,
    models: Mutex<Vec<(Box<str>, Arc<KeptModel>)>>,
}

/// The models a tenant's series are kept for.
const MAX_KEPT_MODELS: usize = 16;

#[derive(Debug, Default)]
struct KeptModel {
    answered: OnceLock<IntCounter>,
    /// prompt, cached, completion.
    tokens: [OnceLock<IntCounter>; 3],
}

/// A kind of token `poimen_gateway_tenant_tokens_total` counts.
#[derive(Debug, Clone, Copy)]
pub enum TokenKind {
    Prompt,
    Cached,
    Completion,
}

impl TokenKind {
    fn as_str(self) -> &'static str {
        match self {
            TokenKind::Prompt => "prompt",
            TokenKind::Cached => "cached",
            TokenKind::Completion => "completion",
        }
    }
}

impl TenantSeries {
    pub fn new(label: Arc<str>) -> Self {
        TenantSeries {
            label,
            in_flight: OnceLock::new(),
            service: OnceLock::new(),
            models: Mutex::default(),
        }
    }

    /// `poimen_gateway_tenant_in_flight` of the tenant.
    pub fn in_flight(&self) -> &IntGauge {
        (self.in_flight).get_or_init(|| TENANT_IN_FLIGHT.with_label_values(&[&*self.label]))
    }

    /// `poimen_gateway_tenant_service_total` of the tenant.
    pub fn service(&self) -> &IntCounter {
        (self.service).get_or_init(|| TENANT_SERVICE.with_label_values(&[&*self.label]))
    }

    /// The tenant's series of `model`.
    pub fn of_model<'a>(&'a self, model: &'a str) -> OfModel<'a> {
        let mut models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        let kept = match models.iter().find(|(m, _)| &**m == model) {
            Some((_, kept)) => Some(kept.clone()),
            None if models.len() < MAX_KEPT_MODELS => {
                let kept = Arc::new(KeptModel::default());
                models.push((model.into(), kept.clone()));
                Some(kept)
            }
            None => None,
        };
        OfModel {
            tenant: &self.label,
            model,
            kept,
        }
    }
}

/// One tenant's series of one model (see [`TenantSeries::of_model`]); for
/// a request without a tenant, [`OfModel::untracked`].
pub struct OfModel<'a> {
    tenant: &'a str,
    model: &'a str,
    kept: Option<Arc<KeptModel>>,
}

impl<'a> OfModel<'a> {
    /// The series of `tenant` (its label) and `model`, looked up per count.
    pub fn untracked(tenant: &'a str, model: &'a str) -> Self {
        OfModel {
            tenant,
            model,
            kept: None,
        }
    }

    /// Count a request answered with `code`; a 200 without a lookup.
    pub fn count_request(&self, code: &str) {
        let labels = [self.tenant, self.model, code];
        let kept = self.kept.as_ref().filter(|_| code == "200");
        count_on(
            kept.map(|k| &k.answered),
            &TENANT_REQUESTS,
            &labels,
            IntCounter::inc,
        );
    }

    /// Count `n` tokens of `kind`.
    pub fn count_tokens(&self, kind: TokenKind, n: u64) {
        let labels = [self.tenant, self.model, kind.as_str()];
        let kept = self.kept.as_ref().map(|k| &k.tokens[kind as usize]);
        count_on(kept, &TENANT_TOKENS, &labels, |c| c.inc_by(n));
    }
}

/// A model's per-request histograms, resolved once.
pub struct ModelSeries {
    pub duration: Histogram,
    pub time_to_first_byte: Histogram,
}

impl ModelSeries {
    pub fn new(model: &str) -> Self {
        ModelSeries {
            duration: REQUEST_DURATION.with_label_values(&[model]),
            time_to_first_byte: TIME_TO_FIRST_BYTE.with_label_values(&[model]),
        }
    }
}

/// Create every labelled series at zero, so dashboards and alerts see a
/// backend before its first event.
pub fn init_backend(model: &str, backend: &str) {
    // The per-request counters and histograms are created (at zero) by
    // `BackendSeries::new` and `ModelSeries::new`.
    for reason in ["queue_full", "queue_timeout"] {
        QUEUE_REJECTED.with_label_values(&[model, backend, reason]);
    }
    LazyLock::force(&WARMUP_DELAYED);
    LazyLock::force(&QUEUE_WAIT);
}

/// Create a model's discovery error count at zero.
pub fn init_discovery(model: &str) {
    DISCOVERY_ERRORS.with_label_values(&[model]);
}

/// Remove every series of a backend that left the set and is idle, so
/// that backends coming and going do not add series without end.
pub fn remove_backend(model: &str, backend: &str) {
    for remove in BY_BACKEND.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        remove(model, backend);
    }
}

/// Remove the series of `vec` labelled with this model and backend,
/// whatever their other labels (route, code, reason).
fn remove_matching<T: MetricVecBuilder>(vec: &MetricVec<T>, model: &str, backend: &str) {
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: std::collections::HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("model") == Some(&model) && labels.get("backend") == Some(&backend) {
                let _ = vec.remove(&labels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The metric names this file registers: its string literals that
    /// start as a metric name does.
    fn registered() -> BTreeSet<String> {
        let source = include_str!("metrics.rs");
        let code = &source[..source.find("#[cfg(test)]").expect("this module")];
        let mut names = BTreeSet::new();
        for literal in code.split('"').skip(1).step_by(2) {
            let is_name = ["poimen_gateway_", "vllm_", "warmup_"]
                .iter()
                .any(|p| literal.starts_with(p))
                && literal.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
            if is_name {
                names.insert(literal.to_string());
            }
        }
        names
    }

    /// The metric names `docs/accounting-and-metrics.md` documents: the
    /// first column of its Metrics section's table.
    fn documented() -> BTreeSet<String> {
        let page = include_str!("../docs/accounting-and-metrics.md");
        let section = page
            .split("\n## Metrics")
            .nth(1)
            .expect("a Metrics section");
        let section = section.split("\n## ").next().unwrap_or(section);
        section
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn every_metric_is_documented_and_every_documented_one_exists() {
        let (code, page) = (registered(), documented());
        assert!(code.len() > 20, "{code:?}");
        let undocumented: Vec<_> = code.difference(&page).collect();
        let unregistered: Vec<_> = page.difference(&code).collect();
        assert!(
            undocumented.is_empty() && unregistered.is_empty(),
            "not in docs/accounting-and-metrics.md: {undocumented:?}; documented but not registered: {unregistered:?}"
        );
    }

    /// The kept series count what a lookup would: the same series, for
    /// kept and not-kept models, codes and routes alike.
    #[test]
    fn kept_series_are_the_metrics_own() {
        use super::*;
        let tenant = TenantSeries::new("kept-t".into());
        let models: Vec<String> = (0..MAX_KEPT_MODELS + 2)
            .map(|i| format!("kept-m{i}"))
            .collect();
        for _ in 0..2 {
            for model in &models {
                let series = tenant.of_model(model);
                series.count_request("200");
                series.count_request("503");
                series.count_tokens(TokenKind::Cached, 5);
            }
        }
        tenant.in_flight().inc();
        for model in [&models[0], &models[MAX_KEPT_MODELS + 1]] {
            let value = |code| {
                TENANT_REQUESTS
                    .with_label_values(&["kept-t", model, code])
                    .get()
            };
            assert_eq!((value("200"), value("503")), (2, 2), "{model}");
            let tokens = TENANT_TOKENS.with_label_values(&["kept-t", model, "cached"]);
            assert_eq!(tokens.get(), 10);
        }
        assert_eq!(TENANT_IN_FLIGHT.with_label_values(&["kept-t"]).get(), 1);

        let backend = BackendSeries::new("kept-model", &"127.0.0.9:1".parse().unwrap(), false);
        for (model, code) in [
            ("kept-model", "200"),
            ("kept-model", "404"),
            ("kept-adapter", "200"),
        ] {
            backend.count_request(model, (2, "fallback"), code);
            backend.count_request(model, (ROUTES, "past"), code);
        }
        let value = |model, route, code| {
            REQUESTS
                .with_label_values(&[model, "127.0.0.9:1", route, code])
                .get()
        };
        assert_eq!(value("kept-model", "fallback", "200"), 1);
        assert_eq!(value("kept-model", "past", "200"), 1);
        assert_eq!(value("kept-model", "fallback", "404"), 1);
        assert_eq!(value("kept-adapter", "fallback", "200"), 1);
    }
}
