//! Log lines say why: a backend error is logged with its whole cause chain,
//! so an operator reads "connection refused", not just "database error".
//! And they are as loud as the README says: a run skipped because the
//! lease is held elsewhere — every tick of every replica but one — is one
//! line at debug, never a warning; a run skipped because the backend is
//! unreachable is a warning.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_tests::{TempDb, unique};
use leasehold::backend::{Memory, PgTable, Redis, SqliteTable};
use leasehold::{Backend, Lease, Outcome, Skip};
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
    /// Every level, no colours: each line reads `<time> <LEVEL> <target>: <message> <fields>`.
    fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        lease_tests::enable_every_call_site();
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn lines(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The lines logged at `level` (`"WARN"`, `"DEBUG"`, ..).
    fn at(&self, level: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.split_whitespace().nth(1) == Some(level))
            .collect()
    }

    fn warnings(&self) -> Vec<String> {
        self.at("WARN")
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
    assert_eq!(
        warnings.len(),
        1,
        "one warning per skipped run: {warnings:#?}"
    );
    let lines = logs.lines();
    assert!(
        !lines.iter().any(|l| l.contains("held elsewhere")),
        "an error is not \"held elsewhere\": {lines:#?}"
    );
}

/// Another holder has the lease: the run is skipped with one line at
/// debug, and nothing is logged at info or above.
async fn held_elsewhere_is_one_debug_line_and_no_warning(backend: impl Backend + Clone) {
    let name = unique("logs-held");
    let ttl = Duration::from_secs(30);
    let holder = Lease::with_holder(backend.clone(), "pod-a");
    let held = holder.try_acquire(&name, ttl).await.unwrap().expect("free");

    let (logs, guard) = Logs::capture();
    let lease = Lease::with_holder(backend, "pod-b");
    let outcome = lease
        .with_lease(&name, ttl, |_| async { panic!("must not run") })
        .await;
    drop(guard);
    assert!(
        matches!(outcome, Outcome::Skipped(Skip::HeldElsewhere)),
        "{outcome:?}"
    );
    let lines = logs.lines();
    let skips: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("held elsewhere"))
        .collect();
    assert_eq!(skips.len(), 1, "one line for the skipped run: {lines:#?}");
    assert_eq!(
        skips[0].split_whitespace().nth(1),
        Some("DEBUG"),
        "{}",
        skips[0]
    );
    assert!(
        skips[0].contains(&name),
        "the line names the lease: {}",
        skips[0]
    );
    for level in ["INFO", "WARN", "ERROR"] {
        assert_eq!(logs.at(level), Vec::<String>::new(), "nothing at {level}");
    }
    held.release().await.unwrap();
}

#[tokio::test]
async fn held_elsewhere_memory() {
    held_elsewhere_is_one_debug_line_and_no_warning(Memory::new()).await;
}

#[tokio::test]
async fn held_elsewhere_sqlite() {
    let db = TempDb::new("logs-held");
    let table = SqliteTable::open(db.path()).await.unwrap();
    held_elsewhere_is_one_debug_line_and_no_warning(table).await;
}

#[tokio::test]
async fn held_elsewhere_postgres() {
    let Some(pool) = lease_tests::postgres().await else {
        return;
    };
    let table = PgTable::new(pool);
    table.ensure_schema().await.unwrap();
    held_elsewhere_is_one_debug_line_and_no_warning(table).await;
}

#[tokio::test]
async fn held_elsewhere_redis() {
    let Some(pool) = lease_tests::redis().await else {
        return;
    };
    held_elsewhere_is_one_debug_line_and_no_warning(Redis::new(pool)).await;
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
    let pool = leasehold::deadpool_redis::Config::from_url(format!("redis://{NOWHERE}"))
        .create_pool(Some(leasehold::deadpool_redis::Runtime::Tokio1))
        .unwrap();
    skipped_with_a_warning_that_says_why(Redis::new(pool)).await;
}
