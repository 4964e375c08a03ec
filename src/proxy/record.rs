//! The end of a request: its metrics (per backend, per tenant) and, for a
//! response whose usage the gateway reads, the `prefix_cache` log line.

use pingora::proxy::Session;

use super::{Phase, RequestCtx};
use crate::accounting::Record;
use crate::metrics::{self, TokenKind};
use crate::routing::Observed;

/// Count the request that ends, and log its usage.
pub(super) fn record(session: &Session, ctx: &RequestCtx) {
    let (pool, routed) = match &ctx.phase {
        Phase::Local => return, // no model: a local answer or a bad request
        Phase::Unserved(pool) => (pool, None),
        Phase::Routed(routed) => (&routed.pool, Some(&**routed)),
    };
    // 499 (nginx's word for it): the client left before any answer.
    let status = session.response_written().map(|r| r.status);
    let status_code = status.as_ref().map_or("499", |s| s.as_str());
    let status = status.map_or(499, |s| s.as_u16());
    let attempt = routed.map(|r| &r.attempt);
    let candidate = attempt.map(|a| a.candidate);
    let series = attempt.and_then(|a| a.members.series(&a.candidate.addr));
    let backend = series.map_or("none", |s| s.label.as_str());
    let route = candidate.map_or("none", |c| c.route.as_str());
    let model = ctx.model(pool);
    let duration = ctx.started.elapsed();
    match (series, candidate) {
        (Some(s), Some(c)) => s.count_request(model, (c.route as usize, route), status_code),
        _ => metrics::REQUESTS
            .with_label_values(&[model, backend, route, status_code])
            .inc(),
    }
    let tenant = ctx.tenant.as_ref().map_or("none", |t| t.label());
    let tenant_series = match &ctx.tenant {
        Some(t) => t.series().of_model(model),
        None => metrics::OfModel::untracked(tenant, model),
    };
    tenant_series.count_request(status_code);
    pool.series.duration.observe(duration.as_secs_f64());
    if let Some(ttfb) = ctx.first_byte {
        pool.series.time_to_first_byte.observe(ttfb.as_secs_f64());
    }

    let Some((routed, tracker)) = routed
        .filter(|r| r.attempt.response_started)
        .and_then(|r| Some((r, r.tracker.as_ref()?)))
    else {
        return;
    };
    let usage = tracker.usage();
    let attempt = &routed.attempt;
    if let (Some(expected), true) = (attempt.expected_tokens, (200..300).contains(&status)) {
        if let Some(counter) = series.and_then(|s| s.expected_tokens.as_ref()) {
            counter.inc_by(expected);
        }
        if !routed.input.warmup() {
            let seen = Observed {
                held: duration.saturating_sub(attempt.queued),
                ttft: ctx.first_byte.map(|t| t.saturating_sub(attempt.queued)),
                prompt_tokens: usage.prompt_tokens,
                cached_tokens: usage.cached_tokens,
            };
            routed.pool.routing.observed(&routed.input, seen);
        }
    }
    if let Some(series) = series {
        match usage.cached_tokens {
            Some(cached) => series.hit_tokens.inc_by(cached),
            None if (200..300).contains(&status) => series.usage_missing.inc(),
            None => {}
        }
        if let Some(prompt) = usage.prompt_tokens {
            series.prompt_tokens.inc_by(prompt);
        }
    }
    let kinds = [
        (TokenKind::Prompt, usage.prompt_tokens),
        (TokenKind::Cached, usage.cached_tokens),
        (TokenKind::Completion, usage.completion_tokens),
    ];
    for (kind, tokens) in kinds {
        if let Some(n) = tokens {
            tenant_series.count_tokens(kind, n);
        }
    }
    // Header values may carry any byte; the log shows UTF-8 as it is.
    let input = &routed.input;
    let cache_key = input
        .cache_key()
        .map(|k| String::from_utf8_lossy(k.as_bytes()));
    let record = Record {
        cache_key: cache_key.as_deref(),
        derived_key: input.derived_key().map(|k| k.as_str()),
        usage,
        expected_cached_tokens: attempt.expected_tokens,
        tenant,
        model,
        asked_model: ctx.asked_model.as_deref(),
        backend,
        route,
        status,
        duration,
    };
    record.log();
}
