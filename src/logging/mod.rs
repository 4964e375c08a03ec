//! The daemon's logger: JSON lines (`format`), filtered by `RUST_LOG` as
//! env_logger does, Pingora's false alarms lowered (`quiet`), written by a
//! thread of their own through a bounded queue that never blocks the thread
//! that logs (`queue`).

mod format;
mod queue;
mod quiet;

use std::io::Write;
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::Duration;

use log::{Level, Log, Metadata, Record};

use crate::metrics;
pub use format::{Event, JsonValue};
use queue::Queue;

/// At exit, how long to wait for the queued lines to be written to a stderr
/// that may be stalled.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

static LOGGER: OnceLock<JsonLogger> = OnceLock::new();
/// [`LOGGER`] once it is the `log` crate's logger.
static INSTALLED: OnceLock<&'static JsonLogger> = OnceLock::new();

/// Installs the logger: `RUST_LOG` filters, `info` by default.
pub fn init() {
    let filter =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max_level = filter.filter();
    let logger = LOGGER.get_or_init(|| {
        let output = Output::start(std::process::id(), &filter);
        JsonLogger {
            filter,
            output: RwLock::new(output),
        }
    });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(max_level);
        let _ = INSTALLED.set(logger);
    }
}

/// Log an event of `target` at `level` whose fields `fields` writes
/// straight into its line ([`Event`]), when `RUST_LOG` lets such a record
/// through; the line is the one `log::info!(target: …, key = value, …; "")`
/// writes. Not written unless this logger is the one installed.
pub fn event(level: Level, target: &'static str, fields: impl FnOnce(&mut Event)) {
    let Some(logger) = INSTALLED.get() else {
        return;
    };
    let record = Record::builder()
        .level(level)
        .target(target)
        .args(format_args!(""))
        .build();
    if level > log::max_level() || !logger.filter.matches(&record) {
        return;
    }
    let mut event = Event::new(level, target);
    fields(&mut event);
    logger.write(event.finish());
}

/// Write out what is queued (at exit: Pingora's `Server::run` has returned).
pub fn flush() {
    log::logger().flush();
}

/// Before Pingora's daemon mode forks (at the start of `Server::run`): a
/// thread does not survive a fork, and the parent exits right after it
/// without returning here, so from now on this process writes its lines
/// itself (they are few, and no connection is served yet). The daemon
/// starts a writer of its own with its first line.
pub fn prepare_for_fork() {
    if let Some(logger) = LOGGER.get() {
        let mut output = logger
            .output
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(queue) = output.queue.take() {
            queue.flush(FLUSH_TIMEOUT);
        }
    }
}

struct JsonLogger {
    /// env_logger's own filter, so `RUST_LOG` means what it always meant.
    filter: env_logger::Logger,
    output: RwLock<Output>,
}

/// Where one process's lines go.
struct Output {
    /// The process this output belongs to: its writer thread runs there.
    pid: u32,
    /// `None`: written by the thread that logs (before a fork, or if no
    /// thread could be started).
    queue: Option<Queue>,
}

impl Output {
    fn start(pid: u32, filter: &env_logger::Logger) -> Output {
        let report = Metadata::builder()
            .level(Level::Warn)
            .target(queue::REPORT_TARGET)
            .build();
        let queue = Queue::start(
            queue::BOUNDS,
            std::io::stderr(),
            metrics::LOG_LINES_DROPPED.clone(),
            filter.enabled(&report),
        );
        Output {
            pid,
            queue: queue.ok(),
        }
    }

    fn write(&self, line: Vec<u8>) {
        match &self.queue {
            Some(queue) => queue.push(line),
            None => {
                let _ = std::io::stderr().write_all(&line);
            }
        }
    }
}

impl JsonLogger {
    /// Hand `line` to this process's output, making one if this is a new
    /// process: the daemon, forked after `prepare_for_fork`.
    fn write(&self, line: Vec<u8>) {
        // One getpid(2) per line (~0.1 µs) is the price of noticing the
        // fork without a hook into it. (A pid kept per thread was tried: a
        // daemon's lines from its main thread after the fork were lost.)
        let pid = std::process::id();
        {
            let output = self.output.read().unwrap_or_else(PoisonError::into_inner);
            if output.pid == pid {
                output.write(line);
                return;
            }
        }
        let mut output = self.output.write().unwrap_or_else(PoisonError::into_inner);
        if output.pid != pid {
            let old = std::mem::replace(&mut *output, Output::start(pid, &self.filter));
            // An unprepared fork: the old writer thread stayed in the
            // parent, and its channel may be frozen mid-operation here.
            // Forget it rather than touch it.
            std::mem::forget(old);
        }
        output.write(line);
    }
}

impl Log for JsonLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.filter.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if !self.filter.matches(record) {
            return;
        }
        let lowered;
        let record = match quiet::lowered(record) {
            Some(level) => {
                lowered = record.to_builder().level(level).build();
                if !self.filter.matches(&lowered) {
                    return;
                }
                &lowered
            }
            None => record,
        };
        if let Some(line) = format::render(record) {
            self.write(line);
        }
    }

    fn flush(&self) {
        let output = self.output.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(queue) = &output.queue {
            queue.flush(FLUSH_TIMEOUT);
        }
    }
}
