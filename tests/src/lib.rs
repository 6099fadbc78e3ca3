//! Shared helpers for the integration tests: connecting to the test servers,
//! unique lease names, throw-away SQLite files and a slow TCP proxy; and the
//! fault-injection suite with what it is built from: private servers that a
//! test may crash ([`servers`]), a fault-injecting TCP proxy ([`proxy`]) and
//! the suite itself ([`faults`], run by the `fault-suite` binary and by
//! `tests/faults.rs`); and the pictures of `docs/` ([`plots`]).
//!
//! Tests that need a server call [`postgres`], [`mysql`] or [`redis()`] first
//! and return early on `None`:
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
//! | Redis | `LEASE_REDIS_URL` | `redis://127.0.0.1:6379` |

pub mod clusters;
pub mod faults;
pub mod plots;
pub mod proxy;
pub mod servers;

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
/// Environment variable with the Redis URL.
pub const REDIS_URL_VAR: &str = "LEASE_REDIS_URL";
/// Redis URL used when [`REDIS_URL_VAR`] is not set.
pub const REDIS_URL_DEFAULT: &str = "redis://127.0.0.1:6379";
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

/// The Redis URL for tests: `$LEASE_REDIS_URL`, or the default.
pub fn redis_url() -> String {
    std::env::var(REDIS_URL_VAR).unwrap_or_else(|_| REDIS_URL_DEFAULT.to_owned())
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
    postgres_with(PgPoolOptions::new().max_connections(MAX_CONNECTIONS)).await
}

/// Like [`postgres`], with the caller's pool options (for tests that watch
/// which connection the pool hands out, or need a small pool).
///
/// # Panics
///
/// When the server cannot be reached and [`services_required`].
pub async fn postgres_with(options: PgPoolOptions) -> Option<PgPool> {
    let url = postgres_url();
    probe::<PgConnection>("postgres", &url).await?;
    let pool = options.acquire_timeout(CONNECT_TIMEOUT).connect(&url).await;
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

/// A pool on the test Redis server ([`redis_url`]) that answered a `PING`,
/// or `None` after printing `skipped: no redis at <url>` when it cannot be
/// reached.
///
/// # Panics
///
/// When the server cannot be reached and [`services_required`].
pub async fn redis() -> Option<deadpool_redis::Pool> {
    redis_with(|builder| builder).await
}

/// Like [`redis()`], letting the caller adjust the pool (size, hooks).
///
/// # Panics
///
/// When the server cannot be reached and [`services_required`].
pub async fn redis_with(
    configure: impl FnOnce(deadpool_redis::PoolBuilder) -> deadpool_redis::PoolBuilder,
) -> Option<deadpool_redis::Pool> {
    let url = redis_url();
    let pool = async {
        let builder = deadpool_redis::Config::from_url(url.clone())
            .builder()
            .map_err(|e| e.to_string())?;
        let pool = configure(builder.runtime(deadpool_redis::Runtime::Tokio1))
            .build()
            .map_err(|e| e.to_string())?;
        let ping = async {
            let mut conn = pool.get().await.map_err(|e| e.to_string())?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, ping).await {
            Ok(Ok(_)) => Ok(pool),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no answer within {CONNECT_TIMEOUT:?}")),
        }
    }
    .await;
    available("redis", &url, pool)
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

/// Microseconds on the host's `CLOCK_MONOTONIC`, the clock of
/// [`std::time::Instant`] on Linux: one clock for every process of the
/// host, which the wall clock (stepped or slewed by NTP) is not, so readings
/// taken in different processes (the fault suite's contenders and its
/// orchestrator) can be compared.
///
/// The standard library gives no raw reading of an `Instant`, and this
/// workspace forbids the `unsafe` a `clock_gettime` call would need; on
/// Linux an `Instant`'s `Debug` output is its `timespec`
/// (`Instant { tv_sec: 1557, tv_nsec: 750695348 }`), which is read here.
///
/// # Panics
///
/// If that output has another shape (another platform or standard
/// library): the fault suite cannot compare its processes' readings then.
pub fn monotonic_us() -> i64 {
    monotonic_us_of(std::time::Instant::now())
}

/// [`monotonic_us`] of an `Instant` taken earlier.
///
/// # Panics
///
/// As [`monotonic_us`].
pub fn monotonic_us_of(t: std::time::Instant) -> i64 {
    let text = format!("{t:?}");
    let field = |name: &str| -> Option<i64> {
        let start = text.find(name)? + name.len();
        let digits: String = text[start..]
            .chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    match (field("tv_sec:"), field("tv_nsec:")) {
        (Some(sec), Some(nsec)) => sec * 1_000_000 + nsec / 1000,
        _ => panic!("cannot read CLOCK_MONOTONIC from {text:?} on this platform"),
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

/// The `main` of a test binary without libtest's harness (`harness =
/// false`) that holds the one test `name`: just enough of libtest's
/// command line (`args`, without the program) for `cargo test` — a name
/// filter, `--list` and `--ignored`; other options are ignored.
pub fn single_test(args: &[String], name: &str, test: fn()) {
    if args.iter().any(|a| a == "--list") {
        println!("{name}: test");
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected = filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    if !selected || args.iter().any(|a| a == "--ignored") {
        println!(
            "\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out\n"
        );
        return;
    }
    println!("\nrunning 1 test");
    let started = std::time::Instant::now();
    test();
    println!("test {name} ... ok");
    println!(
        "\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
        started.elapsed().as_secs_f64()
    );
}

/// Install, once per process, a global subscriber that enables every call
/// site and writes nowhere; call it before a test installs a thread-local
/// subscriber (`set_default`) whose events it asserts on. tracing decides
/// once per call site, for the whole process, by the subscriber of the
/// thread that reaches the site first: a test running beside it without a
/// subscriber would otherwise switch the site off for every thread.
pub fn enable_every_call_site() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Fails only if a global subscriber is set already: then that one is it.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
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
/// A TCP proxy that holds back every byte the server sends for a fixed
/// delay, passing the client's bytes on at once; through it, a query's
/// answer arrives `delay` after the server acted on it, which widens the
/// window between "done on the server" and "answered" for cancellation tests.
///
/// When the server closes a connection (`CLIENT KILL`,
/// `pg_terminate_backend`), the proxy drops the client's side at once,
/// with the bytes still held back, so the client sees its request fail.
/// Dropping the proxy stops it and cuts every connection.
#[derive(Debug)]
pub struct SlowProxy {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl SlowProxy {
    /// Listen on a free port of 127.0.0.1 and forward to `upstream`.
    ///
    /// # Panics
    ///
    /// If no local port can be bound.
    pub async fn start(upstream: std::net::SocketAddr, delay: Duration) -> SlowProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                connections.spawn(forward(client, upstream, delay));
            }
        });
        SlowProxy { addr, task }
    }

    /// The address to connect to instead of the server's.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its `JoinSet`, which aborts every connection.
        self.task.abort();
    }
}

async fn forward(client: tokio::net::TcpStream, upstream: std::net::SocketAddr, delay: Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let down_read = async move {
        let mut buf = vec![0; 16 * 1024];
        while let Ok(n @ 1..) = server_read.read(&mut buf).await {
            if tx
                .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    let down_write = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if client_write.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    // The server's side ending (or the client's) ends the connection:
    // whatever is still held back is dropped with it.
    tokio::select! {
        () = up => {}
        () = down_read => {}
        () = down_write => {}
    }
}
