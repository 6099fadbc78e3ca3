//! `#[singleton]` without `lease = ...` uses `leasehold::global_default()`.
//!
//! The default can be set once per process, so this file is a test binary
//! of its own, with a single test that goes through the states in order.

use std::io::Write;
use std::sync::{Arc, Mutex};

use leasehold::backend::Memory;
use leasehold::{Lease, singleton};

#[singleton(name = "singleton-global", ttl = "2s")]
async fn nightly_report(rows: &[u32]) -> Option<u32> {
    Some(rows.iter().sum())
}

#[singleton(name = "singleton-global-unit", ttl = "2s", token = cancel)]
async fn cleanup(done: &Mutex<bool>) {
    *done.lock().expect("not poisoned") = !cancel.is_cancelled();
}

#[tokio::test]
async fn without_a_lease_the_run_is_skipped_with_an_error_log_then_the_global_default_is_used() {
    let logs = capture_logs();

    // No global default and no `lease = ...`: skipped, logged at error level,
    // and no panic.
    assert!(leasehold::global_default().is_none());
    assert_eq!(nightly_report(&[1, 2, 3]).await, None);
    let done = Mutex::new(false);
    cleanup(&done).await;
    assert!(!*done.lock().unwrap(), "the body must not run");

    let logged = logs.text();
    let errors: Vec<&str> = logged.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 2, "{logged}");
    assert!(errors[0].contains("singleton-global"), "{logged}");
    assert!(
        errors[0].contains("leasehold::set_global_default"),
        "says how to fix it: {logged}"
    );
    assert!(
        errors[0].contains("lease = ..."),
        "says how to fix it: {logged}"
    );

    // Once a default is installed, the same fns run on it.
    let db = Memory::new();
    leasehold::set_global_default(Lease::with_holder(db.clone(), "pod-a")).unwrap();
    assert_eq!(nightly_report(&[1, 2, 3]).await, Some(6));
    cleanup(&done).await;
    assert!(*done.lock().unwrap());

    // ...and are skipped while another pod holds the lease.
    let other = Lease::with_holder(db, "pod-b");
    let held = other
        .try_acquire("singleton-global", std::time::Duration::from_secs(2))
        .await
        .unwrap();
    assert!(held.is_some());
    assert_eq!(nightly_report(&[1, 2, 3]).await, None);
}

/// Log lines written while the returned value lives, on this thread.
struct Logs {
    buf: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf.lock().expect("not poisoned")).into_owned()
    }
}

fn capture_logs() -> Logs {
    #[derive(Clone)]
    struct Writer(Arc<Mutex<Vec<u8>>>);
    impl Write for Writer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("not poisoned").write(bytes)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    let writer = Writer(buf.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    Logs {
        buf,
        _guard: tracing::subscriber::set_default(subscriber),
    }
}
