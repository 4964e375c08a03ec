//! vLLM's per-response load report (ORCA): asked for with
//! `endpoint-load-metrics-format: json` (or `text`), answered in the
//! `endpoint-load-metrics` response header:
//!
//! ```text
//! endpoint-load-metrics: JSON {"named_metrics": {"num_requests_waiting": 3.0, "kv_cache_usage_perc": 0.4}}
//! endpoint-load-metrics: TEXT named_metrics.num_requests_waiting=3.0, named_metrics.kv_cache_usage_perc=0.4
//! ```
//!
//! Parsing only, and only of what admission uses: the waiting count (the
//! KV-cache usage says nothing about free sequence slots). Anything
//! malformed is `None`, never an error, so a bad header can neither fail a
//! request nor change admission.

/// The request header that asks for a report.
pub const FORMAT_HEADER: &str = "endpoint-load-metrics-format";
/// The response header that carries it.
pub const HEADER: &str = "endpoint-load-metrics";

/// Larger counts are nonsense from any real server: refused rather than
/// trusted.
const MAX_WAITING: f64 = 1e6;

/// `num_requests_waiting` of a header value: the requests the backend
/// holds in its own queue, from every client. `None` if the value is not a
/// report or lacks a sane count.
pub fn waiting(value: &[u8]) -> Option<usize> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (format, rest) = value.split_once(' ')?;
    let waiting = if format.eq_ignore_ascii_case("JSON") {
        json_waiting(rest)?
    } else if format.eq_ignore_ascii_case("TEXT") {
        text_waiting(rest)?
    } else {
        return None;
    };
    count(waiting)
}

fn json_waiting(s: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(s).ok()?;
    v.get("named_metrics")?
        .get("num_requests_waiting")?
        .as_f64()
}

fn text_waiting(s: &str) -> Option<f64> {
    let mut waiting = None;
    for pair in s.split(',') {
        let (k, v) = pair.trim().split_once('=')?;
        if k.trim() == "named_metrics.num_requests_waiting" {
            waiting = Some(v.trim().parse().ok()?);
        }
    }
    waiting
}

/// A whole, non-negative, sane count (vLLM writes it as a float: `3.0`).
fn count(x: f64) -> Option<usize> {
    (x.is_finite() && (0.0..=MAX_WAITING).contains(&x) && x.fract() == 0.0).then_some(x as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_json_and_text_formats() {
        let json = br#"JSON {"named_metrics": {"num_requests_waiting": 3.0, "kv_cache_usage_perc": 0.25}}"#;
        assert_eq!(waiting(json), Some(3));
        // The simulator writes integers; other metrics are ignored.
        let sim = br#"JSON {"named_metrics": {"num_requests_waiting": 0, "kv_cache_usage_perc": 0}, "cpu_utilization": 0.5}"#;
        assert_eq!(waiting(sim), Some(0));
        let text =
            b"TEXT named_metrics.kv_cache_usage_perc=0.5, named_metrics.num_requests_waiting=12.0";
        assert_eq!(waiting(text), Some(12));
        assert_eq!(
            waiting(b" text cpu_utilization=0.3,named_metrics.num_requests_waiting=2 "),
            Some(2)
        );
    }

    #[test]
    fn malformed_reports_are_none() {
        for bad in [
            &b""[..],
            b"JSON",
            b"JSON {",
            b"JSON []",
            b"JSON {\"named_metrics\": 3}",
            b"JSON {\"named_metrics\": {\"kv_cache_usage_perc\": 0.1}}",
            b"JSON {\"named_metrics\": {\"num_requests_waiting\": -1}}",
            b"JSON {\"named_metrics\": {\"num_requests_waiting\": 2.5}}",
            b"JSON {\"named_metrics\": {\"num_requests_waiting\": 1e300}}",
            b"JSON {\"named_metrics\": {\"num_requests_waiting\": \"3\"}}",
            b"XML <load/>",
            b"TEXT named_metrics.num_requests_waiting",
            b"TEXT named_metrics.num_requests_waiting=NaN",
            b"TEXT named_metrics.num_requests_waiting=inf",
            b"TEXT named_metrics.num_requests_waiting=x",
            b"TEXT named_metrics.kv_cache_usage_perc=0.1",
            b"\xff\xfe",
        ] {
            assert_eq!(waiting(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
