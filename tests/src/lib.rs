//! Shared helpers for the integration tests: unique lease names and logging.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A lease name no other test (in this run or an earlier one against the same
/// server) uses: `"{prefix}-{pid}-{nanos}-{counter}"`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{}-{n}", std::process::id(), nanos % 1_000_000_000_000)
}

/// Send `tracing` output to the test's captured output (`RUST_LOG` filters it,
/// default `warn`). Safe to call from every test.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}
