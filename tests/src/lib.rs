//! Shared helpers for the integration tests: connecting to the test servers,
//! unique lease names and throw-away SQLite files.
//!
//! Tests that need a server call [`postgres`] or [`mysql`] first and return
//! early on `None`:
//!
//! ```no_run
//! # async fn f() {
//! let Some(pool) = lease_tests::postgres().await else { return };
//! # drop(pool); }
//! ```
//!
//! A test must not silently pass without its server: with
//! `LEASE_REQUIRE_SERVICES=1` (CI sets it) an unreachable server panics;
//! otherwise the helper prints one line `skipped: no <server> at <url>` and
//! the test returns early.
//!
//! | server | variable | default |
//! |---|---|---|
//! | PostgreSQL | `LEASE_POSTGRES_URL` | `postgres://postgres@127.0.0.1:5432/test` |
//! | MySQL / MariaDB | `LEASE_MYSQL_URL` | `mysql://root@127.0.0.1:3306/test` |

use std::fmt::Display;
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, MySqlConnection, MySqlPool, PgConnection, PgPool};

/// Environment variable with the PostgreSQL URL.
pub const POSTGRES_URL_VAR: &str = "LEASE_POSTGRES_URL";
/// PostgreSQL URL used when [`POSTGRES_URL_VAR`] is not set.
pub const POSTGRES_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Environment variable with the MySQL / MariaDB URL.
pub const MYSQL_URL_VAR: &str = "LEASE_MYSQL_URL";
/// MySQL / MariaDB URL used when [`MYSQL_URL_VAR`] is not set.
pub const MYSQL_URL_DEFAULT: &str = "mysql://root@127.0.0.1:3306/test";
/// Environment variable that, when `1`, turns an unreachable server into a
/// test failure instead of a skip.
pub const REQUIRE_SERVICES_VAR: &str = "LEASE_REQUIRE_SERVICES";

/// Connections per test pool: enough for the 16-way contention tests to
/// really run concurrently.
const MAX_CONNECTIONS: u32 = 20;
/// How long to wait for a connection before calling the server unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The PostgreSQL URL for tests: `$LEASE_POSTGRES_URL`, or the default.
pub fn postgres_url() -> String {
    std::env::var(POSTGRES_URL_VAR).unwrap_or_else(|_| POSTGRES_URL_DEFAULT.to_owned())
}

/// The MySQL / MariaDB URL for tests: `$LEASE_MYSQL_URL`, or the default.
pub fn mysql_url() -> String {
    std::env::var(MYSQL_URL_VAR).unwrap_or_else(|_| MYSQL_URL_DEFAULT.to_owned())
}

/// True when `LEASE_REQUIRE_SERVICES=1`: a missing server fails the test.
pub fn services_required() -> bool {
    std::env::var(REQUIRE_SERVICES_VAR).is_ok_and(|v| v == "1")
}

/// A pool on the test PostgreSQL server ([`postgres_url`]), or `None` after
/// printing `skipped: no postgres at <url>` when it cannot be reached.
///
/// Each call first tries one connection (so that a refused connection is
/// reported at once), then makes a new pool (up to 20 connections, opened
/// as needed), so every `#[tokio::test]` runtime gets its own.
///
/// # Panics
///
/// When the server cannot be reached and [`services_required`].
pub async fn postgres() -> Option<PgPool> {
    let url = postgres_url();
    probe::<PgConnection>("postgres", &url).await?;
    let pool = PgPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect(&url)
        .await;
    available("postgres", &url, pool)
}

/// A pool on the test MySQL or MariaDB server ([`mysql_url`]), or `None`
/// after printing `skipped: no mysql at <url>` when it cannot be reached.
///
/// Each call first tries one connection (so that a refused connection is
/// reported at once), then makes a new pool (up to 20 connections, opened
/// as needed), so every `#[tokio::test]` runtime gets its own.
///
/// # Panics
///
/// When the server cannot be reached and [`services_required`].
pub async fn mysql() -> Option<MySqlPool> {
    let url = mysql_url();
    probe::<MySqlConnection>("mysql", &url).await?;
    let pool = MySqlPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect(&url)
        .await;
    available("mysql", &url, pool)
}

/// One connection attempt, so that a refused connection is reported at once
/// (a pool would keep retrying until its acquire timeout).
async fn probe<C: Connection>(server: &str, url: &str) -> Option<()> {
    let attempt = tokio::time::timeout(CONNECT_TIMEOUT, C::connect(url)).await;
    let conn = match attempt {
        Ok(conn) => conn.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {CONNECT_TIMEOUT:?}")),
    };
    let conn = available(server, url, conn)?;
    let _ = conn.close().await;
    Some(())
}

fn available<P, E: Display>(server: &str, url: &str, pool: Result<P, E>) -> Option<P> {
    match pool {
        Ok(pool) => Some(pool),
        Err(e) if services_required() => {
            panic!("{REQUIRE_SERVICES_VAR}=1 but there is no {server} at {url}: {e}")
        }
        Err(_) => {
            println!("skipped: no {server} at {url}");
            None
        }
    }
}

/// A string that no other test (in this or another process, now or in an
/// earlier run) uses: `"{prefix}-{16 hex digits}"`. Use it for lease names,
/// holders and table names so that tests can run in parallel.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = (
        std::process::id(),
        SystemTime::now(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
    );
    format!("{prefix}-{:016x}", RandomState::new().hash_one(seed))
}

/// A path for a throw-away SQLite database in the temporary directory; the
/// file and its `-wal`/`-shm` companions are deleted when this is dropped.
#[derive(Debug)]
pub struct TempDb {
    path: PathBuf,
}

impl TempDb {
    /// A new, not yet existing path whose file name starts with `prefix`.
    pub fn new(prefix: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{}.db", unique(prefix)));
        Self { path }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut file = self.path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
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
