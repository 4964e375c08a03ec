//! The bounded queue between the threads that log and the one thread that
//! writes to stderr.
//!
//! Pingora runs with `work_stealing: false`: a worker thread owns its
//! connections, so a worker blocked in `write(2)` on a full stderr pipe (a
//! hung journald, a stopped reader) would stall every connection it holds.
//! Here a worker only hands its rendered line to the queue and never waits:
//! when the queue is full the line is dropped and counted
//! (`poimen_gateway_log_lines_dropped_total`), and the writer reports the
//! drops in one `log_lines_dropped` line once it has caught up.

use std::io::{BufWriter, Write};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::kv::Value;
use log::Level;
use prometheus::IntCounter;

use super::format;

/// How much the queue holds before lines are dropped.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub lines: usize,
    pub bytes: usize,
}

/// 8192 lines is about a second of a busy gateway's per-request lines
/// (~350 bytes each, ~3 MiB), enough to ride out a slow reader's hiccup
/// without holding much. The byte bound caps memory whatever the lines
/// hold: a line carries the client's cache key, which may be long.
pub const BOUNDS: Bounds = Bounds {
    lines: 8192,
    bytes: 4 << 20,
};

/// The target of the writer's own `log_lines_dropped` line.
pub const REPORT_TARGET: &str = "poimen_gateway::logging";

/// How long the writer naps when it has caught up. While lines keep coming
/// it polls rather than parks on the channel: a parked receiver costs every
/// logging worker a wake-up syscall per line (measured: about 20 us of CPU
/// per request at one line per request); a nap costs a line at most this
/// much delay.
const IDLE_POLL: Duration = Duration::from_millis(5);

/// Naps in a row with nothing to write before the writer parks until the
/// next line (100 ms): a quiet gateway (`RUST_LOG=warn`, or idle) then
/// costs no wake-ups at all, and only the first line after a lull pays one.
const NAPS_BEFORE_PARK: u32 = 20;

/// Lines written out in one write(2) when they come faster than stderr
/// takes them.
const BATCH_BYTES: usize = 64 * 1024;

enum Msg {
    Line(Vec<u8>),
    /// Answered once every line queued before it is written.
    Flush(SyncSender<()>),
}

/// What the threads that log and the writer share.
struct Shared {
    /// Bytes of the lines queued and not yet taken by the writer.
    bytes: AtomicUsize,
    /// Lines dropped since the writer last reported.
    unreported: AtomicU64,
    /// The writer is parked (or about to): the next push unparks it.
    parked: AtomicBool,
}

/// The logging side of the queue: `push` never blocks.
pub struct Queue {
    tx: SyncSender<Msg>,
    shared: Arc<Shared>,
    writer: std::thread::Thread,
    max_bytes: usize,
    dropped: IntCounter,
}

impl Queue {
    /// Start the writer thread writing to `out`. Dropped lines count in
    /// `dropped`; they are reported in a WARN line when `report`.
    pub fn start<W: Write + Send + 'static>(
        bounds: Bounds,
        out: W,
        dropped: IntCounter,
        report: bool,
    ) -> std::io::Result<Queue> {
        let (tx, rx) = mpsc::sync_channel(bounds.lines);
        let shared = Arc::new(Shared {
            bytes: AtomicUsize::new(0),
            unreported: AtomicU64::new(0),
            parked: AtomicBool::new(false),
        });
        let writer = Writer {
            rx,
            out: BufWriter::with_capacity(BATCH_BYTES, out),
            shared: shared.clone(),
            report,
            report_every: bounds.lines,
        };
        let handle = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || writer.run())?;
        Ok(Queue {
            tx,
            shared,
            writer: handle.thread().clone(),
            max_bytes: bounds.bytes,
            dropped,
        })
    }

    /// Queue `line` for the writer, or drop and count it if the queue is
    /// full. Never waits.
    pub fn push(&self, line: Vec<u8>) {
        let len = line.len();
        let held = self.shared.bytes.fetch_add(len, Ordering::Relaxed);
        if held + len <= self.max_bytes && self.tx.try_send(Msg::Line(line)).is_ok() {
            self.wake_writer();
            return;
        }
        // Full (or, should the writer have died, gone): lost, and said so.
        self.shared.bytes.fetch_sub(len, Ordering::Relaxed);
        self.shared.unreported.fetch_add(1, Ordering::Relaxed);
        self.dropped.inc();
    }

    /// Wait until every line queued so far is written, for at most
    /// `timeout`: at exit, a stalled stderr must not keep the process alive.
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let (ack, acked) = mpsc::sync_channel(1);
        let mut msg = Msg::Flush(ack);
        // The queue may be full; this is the one caller allowed to wait.
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return,
            }
        }
        self.wake_writer();
        let _ = acked.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }

    /// Unpark the writer if it parked: one atomic load while it polls.
    fn wake_writer(&self) {
        // Pairs with the writer's fence between announcing `parked` and
        // looking at the channel once more: either it sees this message or
        // this sees `parked`.
        fence(Ordering::SeqCst);
        if self.shared.parked.load(Ordering::Relaxed)
            && self.shared.parked.swap(false, Ordering::AcqRel)
        {
            self.writer.unpark();
        }
    }
}

/// The writer thread's side: writes lines in order, and the drop reports.
struct Writer<W: Write> {
    rx: Receiver<Msg>,
    out: BufWriter<W>,
    shared: Arc<Shared>,
    report: bool,
    /// While the writer never catches up, report at least this often (in
    /// lines written), so that drops under a sustained overload are told.
    report_every: usize,
}

impl<W: Write> Writer<W> {
    fn run(mut self) {
        let (mut since_report, mut naps) = (0, 0);
        loop {
            let msg = match self.rx.try_recv() {
                Ok(msg) => msg,
                Err(TryRecvError::Empty) => {
                    // Caught up: what was dropped meanwhile can be told;
                    // the batch goes out in one write.
                    self.report_drops();
                    since_report = 0;
                    let _ = self.out.flush();
                    if naps < NAPS_BEFORE_PARK {
                        naps += 1;
                        std::thread::sleep(IDLE_POLL);
                        continue;
                    }
                    match self.park() {
                        Some(msg) => msg,
                        None => continue,
                    }
                }
                Err(TryRecvError::Disconnected) => {
                    self.report_drops();
                    let _ = self.out.flush();
                    return;
                }
            };
            naps = 0;
            match msg {
                Msg::Line(line) => {
                    self.shared.bytes.fetch_sub(line.len(), Ordering::Relaxed);
                    // A failed write (stderr closed) loses the line: there
                    // is nowhere else to say so.
                    let _ = self.out.write_all(&line);
                    since_report += 1;
                    if since_report >= self.report_every {
                        self.report_drops();
                        since_report = 0;
                    }
                }
                Msg::Flush(ack) => {
                    self.report_drops();
                    let _ = self.out.flush();
                    let _ = ack.send(());
                }
            }
        }
    }

    /// Sleep until a push unparks this thread, or return what was sent
    /// meanwhile. `parked` is announced before the last look at the
    /// channel, so a message sent at the same time is either taken here or
    /// unparks the thread (an unpark before `park` is not lost: `park`
    /// then returns at once).
    fn park(&self) -> Option<Msg> {
        self.shared.parked.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let msg = self.rx.try_recv().ok();
        if msg.is_none() {
            std::thread::park();
        }
        self.shared.parked.store(false, Ordering::Relaxed);
        msg
    }

    /// One WARN line with the lines dropped since the last one, if any.
    fn report_drops(&mut self) {
        let dropped = self.shared.unreported.swap(0, Ordering::Relaxed);
        if dropped == 0 || !self.report {
            return;
        }
        let kvs: &[(&str, Value)] = &[
            ("event", Value::from("log_lines_dropped")),
            ("dropped", Value::from(dropped)),
        ];
        let record = log::Record::builder()
            .level(Level::Warn)
            .target(REPORT_TARGET)
            .args(format_args!(""))
            .key_values(&kvs)
            .build();
        if let Some(line) = format::render(&record) {
            let _ = self.out.write_all(&line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Condvar, Mutex};

    /// A sink whose writes wait until it is opened: a stderr nobody reads.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<GateState>, Condvar)>);

    #[derive(Default)]
    struct GateState {
        open: bool,
        writing: bool,
        written: Vec<u8>,
    }

    impl Gate {
        fn update<T>(&self, f: impl FnOnce(&mut GateState) -> T) -> T {
            let (state, changed) = &*self.0;
            let out = f(&mut state.lock().unwrap());
            changed.notify_all();
            out
        }

        /// Wait (in the test) until `cond` holds.
        fn wait_until(&self, cond: impl Fn(&GateState) -> bool) {
            let (state, changed) = &*self.0;
            let state = state.lock().unwrap();
            let (_state, timeout) = changed
                .wait_timeout_while(state, Duration::from_secs(10), |s| !cond(s))
                .unwrap();
            assert!(!timeout.timed_out(), "the writer never got there");
        }

        fn set_open(&self, open: bool) {
            self.update(|s| s.open = open);
        }

        /// Every line written so far, each parsed as JSON.
        fn lines(&self) -> Vec<serde_json::Value> {
            let text = self.update(|s| String::from_utf8(s.written.clone()).unwrap());
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.update(|s| s.writing = true);
            let (state, changed) = &*self.0;
            let mut state = changed
                .wait_while(state.lock().unwrap(), |s| !s.open)
                .unwrap();
            state.writing = false;
            state.written.extend_from_slice(buf);
            changed.notify_all();
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(n: usize) -> Vec<u8> {
        format!("{{\"n\":{n}}}\n").into_bytes()
    }

    fn counter() -> IntCounter {
        IntCounter::new("dropped_total", "test").unwrap()
    }

    /// A queue whose writer is stuck writing line 0.
    fn stalled(bounds: Bounds, report: bool) -> (Queue, Gate, IntCounter) {
        let (gate, dropped) = (Gate::default(), counter());
        let queue = Queue::start(bounds, gate.clone(), dropped.clone(), report).unwrap();
        queue.push(line(0));
        gate.wait_until(|s| s.writing);
        (queue, gate, dropped)
    }

    fn numbers(lines: &[serde_json::Value]) -> Vec<u64> {
        lines.iter().filter_map(|l| l["n"].as_u64()).collect()
    }

    fn reports(lines: &[serde_json::Value]) -> Vec<&serde_json::Value> {
        lines
            .iter()
            .filter(|l| l["event"] == "log_lines_dropped")
            .collect()
    }

    const FOUR_LINES: Bounds = Bounds {
        lines: 4,
        bytes: 1 << 20,
    };

    #[test]
    fn a_full_queue_drops_counts_and_reports_once_writing_resumes() {
        let (queue, gate, dropped) = stalled(FOUR_LINES, true);
        // Four fit behind the stalled line; the next three are dropped at
        // once instead of waiting.
        (1..8).for_each(|n| queue.push(line(n)));
        assert_eq!(dropped.get(), 3);
        assert!(gate.lines().is_empty(), "nothing written while stalled");

        gate.set_open(true);
        queue.flush(Duration::from_secs(10));
        let lines = gate.lines();
        assert_eq!(numbers(&lines), [0, 1, 2, 3, 4], "in order, none twice");
        assert_eq!(lines[0]["n"], 0, "told once writing has resumed");
        let told = reports(&lines);
        assert_eq!(told.len(), 1, "{lines:?}");
        assert_eq!(told[0]["level"], "WARN");
        assert_eq!(told[0]["target"], REPORT_TARGET);
        assert_eq!(told[0]["dropped"], 3);

        // The next report counts only what was dropped since this one.
        gate.set_open(false);
        queue.push(line(8));
        gate.wait_until(|s| s.writing);
        (9..15).for_each(|n| queue.push(line(n)));
        assert_eq!(dropped.get(), 5);
        gate.set_open(true);
        queue.flush(Duration::from_secs(10));
        let lines = gate.lines();
        assert_eq!(numbers(&lines), [0, 1, 2, 3, 4, 8, 9, 10, 11, 12]);
        let reports = reports(&lines);
        assert_eq!(reports.len(), 2);
        assert_eq!(reports[1]["dropped"], 2);
    }

    #[test]
    fn without_drops_there_is_no_report() {
        let (queue, gate, dropped) = stalled(FOUR_LINES, true);
        (1..5).for_each(|n| queue.push(line(n)));
        gate.set_open(true);
        queue.flush(Duration::from_secs(10));
        assert_eq!(numbers(&gate.lines()), [0, 1, 2, 3, 4]);
        assert!(reports(&gate.lines()).is_empty());
        assert_eq!(dropped.get(), 0);
    }

    #[test]
    fn the_byte_bound_drops_lines_before_the_line_bound() {
        let bounds = Bounds {
            lines: 100,
            bytes: 3 * line(1).len(),
        };
        let (queue, gate, dropped) = stalled(bounds, true);
        (1..4).for_each(|n| queue.push(line(n)));
        queue.push(b"{\"n\":4,\"long\":\"xxxxxxxx\"}\n".to_vec());
        assert_eq!(dropped.get(), 1, "over the byte bound");
        gate.set_open(true);
        queue.flush(Duration::from_secs(10));
        assert_eq!(numbers(&gate.lines()), [0, 1, 2, 3]);
        assert_eq!(reports(&gate.lines())[0]["dropped"], 1);
        // Taken by the writer, the bytes are free again.
        queue.push(line(5));
        queue.flush(Duration::from_secs(10));
        assert_eq!(numbers(&gate.lines()), [0, 1, 2, 3, 5]);
        assert_eq!(dropped.get(), 1);
    }

    #[test]
    fn drops_are_counted_but_not_reported_when_warn_is_filtered_out() {
        let (queue, gate, dropped) = stalled(FOUR_LINES, false);
        (1..6).for_each(|n| queue.push(line(n)));
        gate.set_open(true);
        queue.flush(Duration::from_secs(10));
        assert_eq!(dropped.get(), 1);
        assert!(reports(&gate.lines()).is_empty());
    }

    #[test]
    fn a_line_after_a_lull_wakes_the_parked_writer() {
        let (gate, dropped) = (Gate::default(), counter());
        gate.set_open(true);
        let queue = Queue::start(FOUR_LINES, gate.clone(), dropped, true).unwrap();
        for n in 0..3 {
            // Past the naps: the writer has parked when the line comes.
            std::thread::sleep(IDLE_POLL * (NAPS_BEFORE_PARK + 10));
            queue.push(line(n));
            gate.wait_until(|s| s.written.iter().filter(|&&b| b == b'\n').count() > n);
        }
        assert_eq!(numbers(&gate.lines()), [0, 1, 2]);
    }

    #[test]
    fn a_flush_gives_up_on_a_stalled_writer() {
        let (queue, gate, _) = stalled(FOUR_LINES, true);
        (1..5).for_each(|n| queue.push(line(n)));
        let (done, flushed) = mpsc::channel();
        std::thread::spawn(move || {
            queue.flush(Duration::from_millis(100));
            done.send(()).unwrap();
        });
        let returned = flushed.recv_timeout(Duration::from_secs(10));
        gate.set_open(true);
        assert!(returned.is_ok(), "flush waited on past its timeout");
    }
}
