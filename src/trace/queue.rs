//! The SDK's batch span processor, with every span it cannot export
//! counted: it drops spans when its queue is full and when an export fails,
//! but counts neither where a metric can read it. Here a span is dropped
//! (and counted) before it would find the queue full, and a failed export's
//! spans are counted as it returns.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use log::{info, warn};
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfig, BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;

use crate::metrics;

/// `exporter` behind a batch span processor holding at most `max` spans.
pub(super) fn bounded<E: SpanExporter + 'static>(
    exporter: E,
    batches: BatchConfig,
    max: usize,
) -> Bounded {
    let queued = Arc::new(AtomicUsize::new(0));
    let exporter = Counted {
        inner: exporter,
        queued: queued.clone(),
        failing: AtomicBool::new(false),
    };
    Bounded {
        inner: BatchSpanProcessor::new(exporter, batches),
        queued,
        max,
    }
}

/// Spans handed to the processor and not yet taken by an export: never
/// fewer than its queue holds, so a span it would drop for a full queue is
/// dropped here first.
#[derive(Debug)]
pub(super) struct Bounded {
    inner: BatchSpanProcessor,
    queued: Arc<AtomicUsize>,
    max: usize,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            metrics::TRACE_SPANS_DROPPED
                .with_label_values(&["queue_full"])
                .inc();
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, counting what it takes from the queue and what it failed
/// to deliver.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
    /// The last export failed: said once, and once more when one succeeds.
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        self.queued.fetch_sub(spans, Ordering::AcqRel);
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    info!(event = "trace_export_recovered"; "");
                }
            }
            Err(e) => {
                metrics::TRACE_SPANS_DROPPED
                    .with_label_values(&["export_failed"])
                    .inc_by(spans as u64);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    warn!(event = "trace_export_failed", spans = spans, error:display = e; "");
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Mutex;

    use opentelemetry::trace::{Tracer, TracerProvider};
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracerProvider};

    use super::*;

    /// An exporter that waits for a word before each export: `Ok(true)`
    /// delivers the batch, `Ok(false)` fails it.
    #[derive(Debug)]
    struct Gate {
        go: Mutex<mpsc::Receiver<bool>>,
        exported: Arc<AtomicUsize>,
    }

    impl SpanExporter for Gate {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let ok = self.go.lock().unwrap().recv().unwrap_or(false);
            if !ok {
                return Err(OTelSdkError::InternalFailure("refused".into()));
            }
            self.exported.fetch_add(batch.len(), Ordering::SeqCst);
            Ok(())
        }
    }

    fn dropped(reason: &str) -> u64 {
        metrics::TRACE_SPANS_DROPPED
            .with_label_values(&[reason])
            .get()
    }

    #[test]
    fn a_stalled_export_drops_what_does_not_fit_and_counts_it() {
        let (go, waiting) = mpsc::channel();
        let exported = Arc::new(AtomicUsize::new(0));
        let gate = Gate {
            go: Mutex::new(waiting),
            exported: exported.clone(),
        };
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(4)
            .with_max_export_batch_size(2)
            .with_scheduled_delay(Duration::from_secs(3600))
            .build();
        let processor = bounded(gate, batches, 4);
        let queued = processor.queued.clone();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .build();
        let tracer = provider.tracer("test");
        let (full_before, failed_before) = (dropped("queue_full"), dropped("export_failed"));
        // The first batch of 2 goes to the stalled export; 4 more fill the
        // queue; the other 4 are dropped.
        for _ in 0..2 {
            tracer.start("s");
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while queued.load(Ordering::SeqCst) != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the export never began"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for _ in 0..8 {
            tracer.start("s");
        }
        // Counters are process-wide; other tests of this binary drop none.
        assert_eq!(dropped("queue_full") - full_before, 4);
        // The stalled export fails; the next two deliver what is queued.
        for ok in [false, true, true] {
            go.send(ok).unwrap();
        }
        provider.force_flush().unwrap();
        assert_eq!(dropped("export_failed") - failed_before, 2);
        assert_eq!(exported.load(Ordering::SeqCst), 4);
        assert_eq!(queued.load(Ordering::SeqCst), 0);
        drop(go);
    }
}
