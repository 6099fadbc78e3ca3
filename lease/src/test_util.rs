//! Helpers for the unit tests.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Lease;
use crate::backend::Memory;

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A current-thread runtime with tokio's clock paused.
pub(crate) fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// One `Memory` and two `Lease`s on it, of holders "a" and "b".
pub(crate) fn pods() -> (Memory, Lease, Lease) {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "a");
    let b = Lease::with_holder(db.clone(), "b");
    (db, a, b)
}

/// What a [`capture_logs`] subscriber has written so far.
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Everything logged so far, as text.
    pub(crate) fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8(bytes).expect("BUG: the fmt subscriber writes UTF-8")
    }
}

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write(bytes)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A `fmt` subscriber (every level, no colours) writing into a buffer,
/// installed for this thread until the guard is dropped. Tasks of a
/// current-thread runtime log into it too.
///
/// tracing decides once per call site, for the whole process, whether the
/// site is enabled, by the subscriber of the thread that reaches it first.
/// A test running beside this one without a subscriber would switch a
/// call site off for every thread (CI saw `once_per_runs_a_slot_once..`
/// capture no "has run already" line), so a global subscriber that enables
/// everything and writes nowhere is installed first: every thread has one.
pub(crate) fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    static EVERYTHING_ENABLED: std::sync::Once = std::sync::Once::new();
    EVERYTHING_ENABLED.call_once(|| {
        // Fails only if another global subscriber is set: then that one is it.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

#[cfg(test)]
mod tests {
    use super::capture_logs;

    fn probe() {
        tracing::debug!("the probe's line");
    }

    /// A call site first reached by a thread without a subscriber of its own
    /// still logs into a capture made afterwards (without the global
    /// subscriber, tracing had switched it off for the whole process).
    #[test]
    fn a_call_site_first_reached_elsewhere_is_still_captured() {
        let (logs, _guard) = capture_logs();
        std::thread::spawn(probe).join().unwrap();
        probe();
        assert!(logs.text().contains("the probe's line"), "{}", logs.text());
    }
}
