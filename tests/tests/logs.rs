//! Log lines say why: a backend error is logged with its whole cause chain,
//! so an operator reads "connection refused", not just "database error".

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease::backend::{PgTable, Redis};
use lease::{Backend, Lease, Outcome, Skip};
use sqlx::postgres::PgPoolOptions;

/// Everything logged on this thread while the guard lives.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().write(bytes)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn warnings(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .filter(|l| l.contains("WARN"))
            .map(str::to_owned)
            .collect()
    }
}

/// No server listens on port 1 of the loopback address.
const NOWHERE: &str = "127.0.0.1:1";

async fn skipped_with_a_warning_that_says_why(backend: impl Backend) {
    let (logs, _guard) = Logs::capture();
    let lease = Lease::with_holder(backend, "pod-a");
    let outcome = lease
        .with_lease("logs-job", Duration::from_secs(5), |_| async {})
        .await;
    let Outcome::Skipped(Skip::Error(error)) = outcome else {
        panic!("{outcome:?}");
    };
    let warnings = logs.warnings();
    let line = warnings
        .iter()
        .find(|l| l.contains("skipped: could not acquire lease"))
        .unwrap_or_else(|| panic!("no warning for the skipped run: {warnings:#?}"));
    assert!(
        line.to_lowercase().contains("connection refused"),
        "the warning does not say why ({error}): {line}"
    );
}

#[tokio::test]
async fn a_refused_postgres_connection_reads_connection_refused() {
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(&format!("postgres://postgres@{NOWHERE}/test"))
        .unwrap();
    skipped_with_a_warning_that_says_why(PgTable::new(pool)).await;
}

#[tokio::test]
async fn a_refused_redis_connection_reads_connection_refused() {
    let pool = lease::deadpool_redis::Config::from_url(format!("redis://{NOWHERE}"))
        .create_pool(Some(lease::deadpool_redis::Runtime::Tokio1))
        .unwrap();
    skipped_with_a_warning_that_says_why(Redis::new(pool)).await;
}
