//! `tracing`: optional OpenTelemetry traces of requests (see `crate::trace`),
//! exported over OTLP/HTTP to a collector.

use std::time::Duration;

use serde::Deserialize;

use super::ms;
use crate::field::{invalid, Bound, Invalid};

#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TracingFile {
    /// The collector's OTLP/HTTP base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT`:
    /// spans go to `<otlp_endpoint>/v1/traces`. Required.
    otlp_endpoint: String,
    /// The share of traces begun here that are recorded and exported. A
    /// request whose `traceparent` says whether it is sampled follows it.
    /// Default 1.0.
    #[serde(default = "default_sample_ratio")]
    sample_ratio: f64,
    /// The resource's `service.name`. Default `poimen-gateway`.
    #[serde(default = "default_service_name")]
    service_name: String,
    /// Finished spans waiting for export; past it spans are dropped and
    /// counted. Default 2048.
    #[serde(default = "default_max_queued_spans")]
    max_queued_spans: u64,
    /// How long one export may take, its retries included. Default 10000.
    #[serde(default = "default_export_timeout_ms")]
    export_timeout_ms: u64,
}

fn default_sample_ratio() -> f64 {
    1.0
}
fn default_service_name() -> String {
    "poimen-gateway".into()
}
fn default_max_queued_spans() -> u64 {
    2048
}
fn default_export_timeout_ms() -> u64 {
    10_000
}

#[derive(Debug, Clone)]
pub struct TracingConfig {
    /// Where spans are posted: the base URL's `/v1/traces`.
    pub traces_url: String,
    pub sample_ratio: f64,
    pub service_name: String,
    pub max_queued_spans: usize,
    pub export_timeout: Duration,
}

pub const SAMPLE_RATIO: Bound<f64> = Bound::new(&["gateway.tracing.sample_ratio"], 0.0, 1.0);
pub const MAX_QUEUED_SPANS: Bound<u64> =
    Bound::new(&["gateway.tracing.max_queued_spans"], 1, 1_000_000);
pub const EXPORT_TIMEOUT_MS: Bound<u64> =
    Bound::new(&["gateway.tracing.export_timeout_ms"], 1, 120_000);

/// OTLP/HTTP's path for traces under a base URL.
const TRACES_PATH: &str = "/v1/traces";

pub fn validate(t: TracingFile) -> Result<TracingConfig, Invalid> {
    let at = |key: &str| format!("gateway.tracing.{key}");
    if t.service_name.trim().is_empty() {
        return Err(invalid(
            at("service_name"),
            &t.service_name,
            "must not be empty",
        ));
    }
    Ok(TracingConfig {
        traces_url: traces_url(&t.otlp_endpoint)
            .map_err(|rule| invalid(at("otlp_endpoint"), &t.otlp_endpoint, rule))?,
        sample_ratio: SAMPLE_RATIO.check(&at("sample_ratio"), t.sample_ratio)?,
        service_name: t.service_name,
        max_queued_spans: MAX_QUEUED_SPANS.check(&at("max_queued_spans"), t.max_queued_spans)?
            as usize,
        export_timeout: ms(EXPORT_TIMEOUT_MS.check(&at("export_timeout_ms"), t.export_timeout_ms)?),
    })
}

/// The URL spans are posted to: `base` (`http://host:port`, maybe with a
/// path) and `/v1/traces`.
fn traces_url(base: &str) -> Result<String, &'static str> {
    let uri: http::Uri = base
        .parse()
        .map_err(|_| "not a URL: http://host:port expected")?;
    match uri.scheme_str() {
        Some("http") => {}
        // The exporter is built without TLS (see Cargo.toml).
        Some("https") => {
            return Err(
                "https is not supported: reach the collector over http (on this host or a sidecar)",
            )
        }
        _ => return Err("not a URL: http://host:port expected"),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("has no host: http://host:port expected");
    }
    if uri.query().is_some() {
        return Err("must not have a query");
    }
    Ok(format!("{}{TRACES_PATH}", base.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn the_traces_path_is_added_to_the_base_url() {
        let url = |b| traces_url(b).unwrap();
        assert_eq!(
            url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            url("http://127.0.0.1:4318/"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            url("http://otel:4318/otlp/"),
            "http://otel:4318/otlp/v1/traces"
        );
        assert_eq!(url("http://[::1]:4318"), "http://[::1]:4318/v1/traces");
    }

    #[test]
    fn only_plain_http_urls_are_accepted() {
        for bad in [
            "127.0.0.1:4318",
            "https://otel:4318",
            "ftp://x",
            "",
            "http://",
            "http://h/?a=b",
        ] {
            assert!(traces_url(bad).is_err(), "{bad}");
        }
    }
}
