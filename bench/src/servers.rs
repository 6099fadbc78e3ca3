//! The servers under test, set up so that the benchmark's round trips can be
//! counted by the servers themselves without other clients' traffic:
//!
//! - PostgreSQL: a dedicated database `lease_bench`; `pg_stat_database.xact_commit`
//!   of that database counts one per autocommit statement. It is read from a
//!   connection to another database, after making the pool's connections
//!   flush their statistics with `pg_stat_force_next_flush()` (PostgreSQL 15
//!   flushes an idle backend's counters only a second, or even ten, after it
//!   goes idle); those flushes' own commits are subtracted.
//! - MariaDB / MySQL: a dedicated user `lease_bench` and database `lease_bench`;
//!   with `userstat = 1`, `information_schema.USER_STATISTICS` counts the
//!   commands of that user alone (`SELECT_COMMANDS + UPDATE_COMMANDS + OTHER_COMMANDS`).
//! - Redis: a private `redis-server` on a free port of 127.0.0.1, started and
//!   stopped by the benchmark; `INFO commandstats` counts the commands the
//!   clients sent: every command but our own `INFO` and those that the
//!   lease scripts run inside Redis (`GET`, `SET`, `PEXPIRE`, `INCR`, `DEL`).
//! - SQLite: a throw-away file; it has no server, so nothing counts its
//!   statements but the process (see `Counted`).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{MySqlPool, PgPool};
use tokio::time::sleep;

use crate::BoxError;

/// The database and user the benchmark owns on the shared servers.
pub(crate) const BENCH_DB: &str = "lease_bench";

/// Connections in each benchmark pool: room for 64 contenders to queue and
/// for `PgAdvisory`'s one connection per held lock.
pub(crate) const POOL_SIZE: u32 = 40;

/// Something that counts the requests a server has executed for us.
pub(crate) enum Counter {
    Pg {
        monitor: PgPool,
        /// The benchmark's pool, whose connections are made to flush their statistics.
        pool: PgPool,
        /// Commits of our own (the flushes), not to be counted.
        own: u64,
    },
    MySql {
        monitor: MySqlPool,
    },
    Redis {
        conn: redis::aio::MultiplexedConnection,
    },
    /// SQLite: no server to ask.
    None,
}

/// A reading of a [`Counter`]: the total, and per command where the server
/// tells (Redis).
#[derive(Debug, Clone, Default)]
pub(crate) struct Count {
    pub(crate) total: u64,
    pub(crate) by_command: BTreeMap<String, u64>,
}

impl Count {
    /// `self - earlier`, command by command.
    pub(crate) fn since(&self, earlier: &Count) -> Count {
        let by_command = self
            .by_command
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v - earlier.by_command.get(k).copied().unwrap_or(0),
                )
            })
            .filter(|(_, v)| *v > 0)
            .collect();
        Count {
            total: self.total - earlier.total,
            by_command,
        }
    }
}

impl Counter {
    /// True when the server counts for us.
    pub(crate) fn counts(&self) -> bool {
        !matches!(self, Counter::None)
    }

    /// The server's count now. For PostgreSQL, call it only when the
    /// requests to count are done and every connection is back in the pool:
    /// the pool's idle connections are made to flush their statistics first.
    /// A connection that is not idle, such as one holding an advisory lock,
    /// may not have flushed yet (and never does on its own, while it runs
    /// only statements that read no table).
    pub(crate) async fn read(&mut self) -> Result<Count, BoxError> {
        match self {
            Counter::Pg { monitor, pool, own } => {
                // An idle backend flushes its pending counters at most once a
                // second, and after a recent flush only 10 s later: make
                // every idle connection of the pool flush now. Each
                // `pg_stat_force_next_flush()` is one more commit, subtracted.
                // Connections are given back to the pool by tasks of their own.
                sleep(Duration::from_millis(100)).await;
                let mut conns = Vec::new();
                while let Some(conn) = pool.try_acquire() {
                    conns.push(conn);
                }
                for conn in &mut conns {
                    // Reading a table gives the backend relation statistics
                    // to flush: one with none pending skips the flush, and
                    // with it the commits of statements that read no table
                    // (such as `pg_try_advisory_lock`).
                    sqlx::query("SELECT pg_stat_force_next_flush() FROM lease_bench_flush")
                        .execute(&mut **conn)
                        .await?;
                }
                let flushes = conns.len() as u64;
                drop(conns);
                *own += flushes;
                sleep(Duration::from_millis(50)).await;
                let mut last = pg_xact(monitor).await?;
                loop {
                    sleep(Duration::from_millis(100)).await;
                    let now = pg_xact(monitor).await?;
                    if now == last {
                        if std::env::var_os("LEASE_BENCH_DEBUG").is_some() {
                            eprintln!(
                                "pg count: xact_commit {now}, own {own}, flushed {flushes} of {} connections",
                                pool.size()
                            );
                        }
                        return Ok(Count {
                            total: now - *own,
                            by_command: BTreeMap::new(),
                        });
                    }
                    last = now;
                }
            }
            Counter::MySql { monitor } => {
                let row: Option<(i64, i64, i64)> = sqlx::query_as(
                    "SELECT SELECT_COMMANDS, UPDATE_COMMANDS, OTHER_COMMANDS \
                     FROM information_schema.USER_STATISTICS WHERE USER = ?",
                )
                .bind(BENCH_DB)
                .fetch_optional(&*monitor)
                .await?;
                let (s, u, o) = row.unwrap_or_default();
                let by_command = BTreeMap::from([
                    ("select".to_owned(), s as u64),
                    ("update".to_owned(), u as u64),
                    ("other".to_owned(), o as u64),
                ]);
                Ok(Count {
                    total: (s + u + o) as u64,
                    by_command,
                })
            }
            Counter::Redis { conn } => {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query_async(conn)
                    .await?;
                let mut count = Count::default();
                for line in info.lines() {
                    let Some((cmd, rest)) = line
                        .strip_prefix("cmdstat_")
                        .and_then(|l| l.split_once(':'))
                    else {
                        continue;
                    };
                    // Our own `INFO`, and the commands the lease scripts
                    // run inside Redis (counted per call of the script).
                    if matches!(cmd, "info" | "get" | "set" | "pexpire" | "incr" | "del") {
                        continue;
                    }
                    let calls = rest
                        .split(',')
                        .find_map(|kv| kv.strip_prefix("calls="))
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0);
                    count.total += calls;
                    count.by_command.insert(cmd.to_owned(), calls);
                }
                Ok(count)
            }
            Counter::None => Ok(Count::default()),
        }
    }
}

async fn pg_xact(monitor: &PgPool) -> Result<u64, BoxError> {
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(monitor)
        .await?;
    let n: i64 = sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = $1")
        .bind(BENCH_DB)
        .fetch_one(monitor)
        .await?;
    Ok(n as u64)
}

/// PostgreSQL: the benchmark pool on `lease_bench`, a monitor on the
/// configured database, and the server version.
pub(crate) async fn postgres() -> Result<(PgPool, Counter, String), BoxError> {
    let url = lease_tests::postgres_url();
    let monitor = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(BENCH_DB)
            .fetch_one(&monitor)
            .await?;
    if !exists {
        // A constant identifier, not input.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {BENCH_DB}")))
            .execute(&monitor)
            .await?;
    }
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&monitor)
        .await?;
    let options = PgConnectOptions::from_str(&url)?.database(BENCH_DB);
    let pool = PgPoolOptions::new()
        .max_connections(POOL_SIZE)
        // The default pings every idle connection it hands out: one more
        // round trip per statement, for the floor and the library alike.
        .test_before_acquire(false)
        .connect_with(options)
        .await?;
    let counter = Counter::Pg {
        monitor,
        pool: pool.clone(),
        own: 0,
    };
    Ok((pool, counter, format!("PostgreSQL {version}")))
}

/// The lease table in `lease_bench`, without autovacuum (whose transactions
/// would count in the database's statistics).
pub(crate) async fn pg_table(pool: &PgPool) -> Result<lease::backend::PgTable, BoxError> {
    let table = lease::backend::PgTable::new(pool.clone());
    table.ensure_schema().await?;
    for sql in [
        "ALTER TABLE task_leases SET (autovacuum_enabled = false)",
        "CREATE TABLE IF NOT EXISTS lease_bench_flush (one INT) WITH (autovacuum_enabled = false)",
        "INSERT INTO lease_bench_flush SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM lease_bench_flush)",
    ] {
        sqlx::query(sql).execute(pool).await?;
    }
    Ok(table)
}

/// MariaDB / MySQL: the benchmark pool as user `lease_bench` on database
/// `lease_bench`, a monitor as the configured user, and the server version.
/// Turns `userstat` on (MariaDB) and returns its previous value.
pub(crate) async fn mysql() -> Result<(MySqlPool, Counter, String, bool), BoxError> {
    let url = lease_tests::mysql_url();
    let monitor = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&monitor)
        .await?;
    // Constant identifiers only.
    for sql in [
        "CREATE DATABASE IF NOT EXISTS lease_bench",
        "CREATE USER IF NOT EXISTS 'lease_bench'@'%'",
        "CREATE USER IF NOT EXISTS 'lease_bench'@'localhost'",
        "GRANT ALL ON lease_bench.* TO 'lease_bench'@'%'",
        "GRANT ALL ON lease_bench.* TO 'lease_bench'@'localhost'",
    ] {
        sqlx::query(sql).execute(&monitor).await?;
    }
    let (_, userstat): (String, String) = sqlx::query_as("SHOW GLOBAL VARIABLES LIKE 'userstat'")
        .fetch_one(&monitor)
        .await?;
    let was_on = userstat.eq_ignore_ascii_case("ON");
    sqlx::query("SET GLOBAL userstat = 1")
        .execute(&monitor)
        .await?;
    let root = MySqlConnectOptions::from_str(&url)?;
    let options = MySqlConnectOptions::new()
        .host(root.get_host())
        .port(root.get_port())
        .username(BENCH_DB)
        .database(BENCH_DB);
    let pool = MySqlPoolOptions::new()
        .max_connections(POOL_SIZE)
        .test_before_acquire(false)
        .connect_with(options)
        .await?;
    Ok((pool, Counter::MySql { monitor }, version, was_on))
}

/// Set `userstat` back to what it was.
pub(crate) async fn mysql_restore(counter: &Counter, was_on: bool) {
    if let (Counter::MySql { monitor }, false) = (counter, was_on) {
        let _ = sqlx::query("SET GLOBAL userstat = 0")
            .execute(monitor)
            .await;
    }
}

/// A private `redis-server`, stopped when dropped.
pub(crate) struct PrivateRedis {
    child: tokio::process::Child,
    pub(crate) url: String,
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Start a private `redis-server` (no persistence) on a free port of
/// 127.0.0.1, and return it with a pool, a counter and its version.
pub(crate) async fn redis()
-> Result<(PrivateRedis, deadpool_redis::Pool, Counter, String), BoxError> {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?.port()
    };
    let child = tokio::process::Command::new("redis-server")
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start redis-server (is it installed?): {e}"))?;
    let server = PrivateRedis {
        child,
        url: format!("redis://127.0.0.1:{port}"),
    };
    let client = redis::Client::open(server.url.as_str())?;
    let mut conn = None;
    for _ in 0..100 {
        if let Ok(c) = client.get_multiplexed_async_connection().await {
            conn = Some(c);
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    let mut conn = conn.ok_or("the private redis-server did not come up")?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let pool = deadpool_redis::Config::from_url(server.url.clone())
        .builder()?
        .max_size(POOL_SIZE as usize)
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()?;
    Ok((
        server,
        pool,
        Counter::Redis { conn },
        format!("Redis {version}"),
    ))
}
