//! Optional OpenTelemetry traces: one span per proxied request, with the
//! GenAI semantic conventions' attributes and what only the gateway knows
//! (route, backend, attempts, tenant, time queued), exported over OTLP/HTTP.
//!
//! - Off (no `gateway.tracing`): nothing is built and a request carries no
//!   span; a client's `traceparent` goes upstream as it came.
//! - On: a request continues the client's W3C `traceparent` (or begins a
//!   trace, sampled at `sample_ratio`), and the backend gets the gateway's
//!   span as its parent, so a vLLM that traces joins the same trace.
//! - Export is the SDK's batch span processor, on a thread of its own: a
//!   request only hands its finished span to a bounded queue
//!   (`queue.rs`). A slow, stalled or absent collector never slows or
//!   fails a request; what cannot be exported is dropped and counted in
//!   `poimen_gateway_trace_spans_dropped_total`.
//!
//! The pipeline starts with the first request, in the process that serves:
//! its thread would not survive Pingora's daemon fork. `shutdown` exports
//! what is still queued when the server has stopped.

mod queue;
mod span;

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use log::error;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Tracer, TracerProvider};
use opentelemetry::KeyValue;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::config::TracingConfig;
use crate::metrics;
pub use span::{Outcome, RequestSpan};

/// Spans in one export (the SDK's default); a full batch goes at once, the
/// rest every `OTEL_BSP_SCHEDULE_DELAY` (the SDK's, default 5 s).
const EXPORT_BATCH: usize = 512;

/// The request tracer of one process; cheap to clone.
#[derive(Clone)]
pub struct Traces(Arc<Inner>);

struct Inner {
    config: TracingConfig,
    /// Started by the first request; `None` if it could not be.
    pipeline: OnceLock<Option<Pipeline>>,
}

struct Pipeline {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Traces {
    pub fn new(config: TracingConfig) -> Self {
        metrics::init_trace_drops();
        Traces(Arc::new(Inner {
            config,
            pipeline: OnceLock::new(),
        }))
    }

    /// The span of a request whose header was read at `started`: a child of
    /// the context in its `traceparent`, if any. Named by its method (`GET`,
    /// else `POST`: a traced route takes no other) until
    /// [`RequestSpan::finish`] knows better.
    pub fn begin(
        &self,
        started: SystemTime,
        method: &http::Method,
        headers: &http::HeaderMap,
    ) -> Option<RequestSpan> {
        let pipeline = self.pipeline()?;
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        let name = match *method {
            http::Method::GET => "GET",
            _ => "POST",
        };
        let span = pipeline
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_start_time(started)
            .start_with_context(&pipeline.tracer, &parent);
        Some(RequestSpan::new(span, name))
    }

    /// Export what is still queued, within the export timeout. For the end
    /// of the process.
    pub fn shutdown(&self) {
        if let Some(Some(p)) = self.0.pipeline.get() {
            let _ = p
                .provider
                .shutdown_with_timeout(self.0.config.export_timeout);
        }
    }

    fn pipeline(&self) -> Option<&Pipeline> {
        let started = self.0.pipeline.get_or_init(|| {
            Pipeline::start(&self.0.config)
                .inspect_err(|e| error!(event = "tracing_off", error:display = e; ""))
                .ok()
        });
        started.as_ref()
    }
}

impl Pipeline {
    fn start(config: &TracingConfig) -> Result<Self, String> {
        let timeout = config.export_timeout;
        // Built on a thread of its own: a blocking client must not be made
        // (or dropped) inside an async runtime, where the first request is.
        let client = std::thread::spawn(move || {
            otlp_client::blocking::Client::builder()
                .no_proxy()
                .timeout(timeout)
                .build()
        })
        .join()
        .map_err(|_| "the HTTP client could not be built".to_string())?
        .map_err(|e| format!("the HTTP client could not be built: {e}"))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.traces_url.clone())
            .with_timeout(timeout)
            .build()
            .map_err(|e| e.to_string())?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(config.max_queued_spans)
            .with_max_export_batch_size(EXPORT_BATCH.min(config.max_queued_spans))
            .build();
        let processor = queue::bounded(exporter, batches, config.max_queued_spans);
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let ratio = Sampler::TraceIdRatioBased(config.sample_ratio);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(ratio)))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer(env!("CARGO_PKG_NAME"));
        Ok(Pipeline { provider, tracer })
    }
}
