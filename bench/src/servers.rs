//! The servers under test: private servers that the benchmark starts with
//! the tests' launcher ([`lease_tests::servers`]) and stops at its end, set
//! up so that the benchmark's round trips are counted by the servers
//! themselves, and by nothing else's traffic (nothing else connects to them,
//! so neither the shared test servers nor another run of the benchmark
//! disturb a count):
//!
//! - PostgreSQL: a dedicated database `lease_bench`; `pg_stat_database.xact_commit`
//!   of that database counts one per autocommit statement. It is read from a
//!   connection to another database (`postgres`), after making the pool's
//!   connections flush their statistics with `pg_stat_force_next_flush()`
//!   (PostgreSQL 15 flushes an idle backend's counters only a second, or
//!   even ten, after it goes idle); those flushes' own commits are subtracted.
//! - MariaDB: a dedicated user `lease_bench` (on the database `test`); with
//!   `userstat = 1`, `information_schema.USER_STATISTICS` counts the
//!   commands of that user alone (`SELECT_COMMANDS + UPDATE_COMMANDS + OTHER_COMMANDS`).
//!   MariaDB adds a command to those statistics after it has sent the
//!   answer: each idle connection of the pool is pinged before a reading, so
//!   that the reading sees every answered command.
//! - Redis: `INFO commandstats` counts the commands the clients sent: every
//!   command but our own `INFO` and those that the lease scripts run inside
//!   Redis (`GET`, `SET`, `PEXPIRE`, `INCR`, `DEL`, and the release's
//!   `PUBLISH`).
//! - Redis Cluster: a private 3-master cluster; `INFO commandstats` of every
//!   master, summed, with the same exclusions as Redis.
//! - etcd: a private 3-member cluster; each member's `/metrics` counts the
//!   gRPC messages it received from clients, by method
//!   (`grpc_server_msg_received_total`: one per unary call, one per
//!   `LeaseKeepAlive` request on its stream), summed over the members. A
//!   request that a follower passes to the leader (a keep-alive, a write
//!   through raft) goes over the peer port and is counted once, where the
//!   client sent it. Reading `/metrics` is HTTP, not gRPC: not counted.
//! - SQLite: a throw-away file; it has no server, so nothing counts its
//!   statements but the process (see `Counted`).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use lease_tests::clusters::{EtcdCluster, RedisCluster};
use lease_tests::servers::{PrivateServer, RedisPersistence};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, MySqlPool, PgPool};
use tokio::time::sleep;

use crate::BoxError;

/// The PostgreSQL database whose requests are counted.
pub(crate) const BENCH_DB: &str = "lease_bench";
/// The MariaDB user whose requests are counted.
pub(crate) const BENCH_USER: &str = "lease_bench";

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
        /// The benchmark's pool, whose idle connections are pinged before a reading.
        pool: MySqlPool,
    },
    Redis {
        conn: redis::aio::MultiplexedConnection,
    },
    /// A connection to each master of a Redis Cluster.
    RedisCluster {
        conns: Vec<redis::aio::MultiplexedConnection>,
    },
    /// The client addresses (`127.0.0.1:port`) of the etcd members, whose
    /// `/metrics` count.
    Etcd { members: Vec<String> },
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
                    v.saturating_sub(earlier.by_command.get(k).copied().unwrap_or(0)),
                )
            })
            .filter(|(_, v)| *v > 0)
            .collect();
        // A counter that went backwards (statistics reset) counts 0, which
        // fails every check on a count.
        Count {
            total: self.total.saturating_sub(earlier.total),
            by_command,
        }
    }
}

impl Count {
    /// Add `other` to this count (the nodes of a cluster).
    fn add(&mut self, other: &Count) {
        self.total += other.total;
        for (k, v) in &other.by_command {
            *self.by_command.entry(k.clone()).or_default() += v;
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
                let started = std::time::Instant::now();
                sleep(Duration::from_millis(100)).await;
                all_idle(pool).await;
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
                                "pg count: xact_commit {now}, own {own}, flushed {flushes} of {} connections, in {:?}",
                                pool.size(),
                                started.elapsed()
                            );
                        }
                        return Ok(Count {
                            total: now.saturating_sub(*own),
                            by_command: BTreeMap::new(),
                        });
                    }
                    last = now;
                }
            }
            Counter::MySql { monitor, pool } => {
                // The server adds a command to `USER_STATISTICS` after it has
                // sent the answer, so a reading taken at once may miss the
                // last one. A connection handles one command at a time: its
                // answer to a ping means it has finished the command before
                // (pings are not counted). Every connection is pinged, once
                // it is back in the pool.
                all_idle(pool).await;
                let mut conns = Vec::new();
                while let Some(conn) = pool.try_acquire() {
                    conns.push(conn);
                }
                for conn in &mut conns {
                    conn.ping().await?;
                }
                drop(conns);
                let row: Option<(i64, i64, i64)> = sqlx::query_as(
                    "SELECT SELECT_COMMANDS, UPDATE_COMMANDS, OTHER_COMMANDS \
                     FROM information_schema.USER_STATISTICS WHERE USER = ?",
                )
                .bind(BENCH_USER)
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
            Counter::Redis { conn } => commandstats(conn).await,
            Counter::RedisCluster { conns } => {
                let mut count = Count::default();
                for conn in conns {
                    count.add(&commandstats(conn).await?);
                }
                Ok(count)
            }
            Counter::Etcd { members } => {
                let mut count = Count::default();
                for member in members.iter() {
                    count.add(&etcd_messages(member).await?);
                }
                Ok(count)
            }
            Counter::None => Ok(Count::default()),
        }
    }
}

/// `INFO commandstats` of one Redis: the calls of every command but our own
/// `INFO` and those that the lease scripts run inside Redis (`GET`, `SET`,
/// `PEXPIRE`, `INCR`, `DEL`, and the release's `PUBLISH`), which are
/// counted per call of the script.
async fn commandstats(conn: &mut redis::aio::MultiplexedConnection) -> Result<Count, BoxError> {
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
        if matches!(
            cmd,
            "info" | "get" | "set" | "pexpire" | "incr" | "del" | "publish"
        ) {
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

/// The gRPC messages the etcd member at `addr` (`127.0.0.1:port`) received,
/// by method: `grpc_server_msg_received_total` of its `/metrics`.
async fn etcd_messages(addr: &str) -> Result<Count, BoxError> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut reply = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut reply)).await??;
    let mut count = Count::default();
    for line in reply.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let method = labels
            .split(',')
            .find_map(|l| l.strip_prefix("grpc_method=\""))
            .map(|m| m.trim_end_matches('"'))
            .unwrap_or("?");
        // Counters are printed as floats (`12`, or `1.2e+06` when large).
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        if n > 0 {
            count.total += n;
            *count.by_command.entry(method.to_owned()).or_default() += n;
        }
    }
    if !reply.contains("grpc_server_msg_received_total") {
        return Err(
            format!("etcd at {addr} has no grpc_server_msg_received_total in /metrics").into(),
        );
    }
    Ok(count)
}

/// Wait, for a second at most, until every connection of `pool` is idle:
/// a connection goes back to the pool a moment after the answer to its last
/// request, in a task of its own.
async fn all_idle<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while pool.num_idle() < pool.size() as usize && std::time::Instant::now() < deadline {
        sleep(Duration::from_millis(5)).await;
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

/// The three private servers, stopped (and their directories deleted) when
/// this is dropped.
pub(crate) struct Servers {
    pub(crate) postgres: PrivateServer,
    pub(crate) mariadb: PrivateServer,
    pub(crate) redis: PrivateServer,
}

/// The private servers could not be started (binaries missing, ...): the
/// benchmark cannot run here.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot start the private servers: {}", self.0)
    }
}

impl std::error::Error for Unavailable {}

impl Servers {
    /// Start PostgreSQL, MariaDB and Redis (no persistence).
    pub(crate) async fn start() -> Result<Self, Unavailable> {
        Ok(Self {
            postgres: PrivateServer::postgres().await.map_err(Unavailable)?,
            mariadb: PrivateServer::mariadb().await.map_err(Unavailable)?,
            redis: PrivateServer::redis(RedisPersistence::None)
                .await
                .map_err(Unavailable)?,
        })
    }
}

/// PostgreSQL: a new benchmark pool on `lease_bench` (created if need be),
/// and its counter, which reads the statistics from the database `postgres`.
pub(crate) async fn postgres(server: &PrivateServer) -> Result<(PgPool, Counter), BoxError> {
    let url = server.url();
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
    Ok((pool, counter))
}

/// The lease table in `lease_bench`, without autovacuum (whose transactions
/// would count in the database's statistics), and the table that the
/// counter's flushes read.
pub(crate) async fn pg_table(pool: &PgPool) -> Result<leasehold::backend::PgTable, BoxError> {
    let table = leasehold::backend::PgTable::new(pool.clone());
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

/// `PgAdvisory::with_fencing` on `lease_fences`, the table created.
pub(crate) async fn pg_advisory_fenced(
    pool: &PgPool,
) -> Result<leasehold::backend::PgAdvisory, BoxError> {
    let backend = leasehold::backend::PgAdvisory::new(pool.clone()).with_fencing("lease_fences")?;
    backend.ensure_schema().await?;
    Ok(backend)
}

/// MariaDB: switch `userstat` on, and return the benchmark pool as user
/// `lease_bench` on the database `test`, with its counter (a monitor as `root`).
pub(crate) async fn mysql(server: &PrivateServer) -> Result<(MySqlPool, Counter), BoxError> {
    server.mariadb_user(BENCH_USER).await?;
    let root = MySqlConnectOptions::from_str(&server.url())?;
    let monitor = MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with(root.clone())
        .await?;
    sqlx::query("SET GLOBAL userstat = 1")
        .execute(&monitor)
        .await?;
    let pool = MySqlPoolOptions::new()
        .max_connections(POOL_SIZE)
        .test_before_acquire(false)
        .connect_with(root.username(BENCH_USER))
        .await?;
    let counter = Counter::MySql {
        monitor,
        pool: pool.clone(),
    };
    Ok((pool, counter))
}

/// The private clusters: a 3-member etcd cluster and a 3-master Redis
/// Cluster (the tests' launchers, [`lease_tests::clusters`]), each started
/// only when its backend is measured; stopped and deleted on drop.
#[derive(Default)]
pub(crate) struct Clusters {
    pub(crate) etcd: Option<EtcdCluster>,
    pub(crate) redis: Option<RedisCluster>,
}

impl Clusters {
    /// Start the clusters asked for (their launchers block: on a thread of
    /// their own).
    pub(crate) async fn start(etcd: bool, redis: bool) -> Result<Self, Unavailable> {
        tokio::task::spawn_blocking(move || {
            Ok(Self {
                etcd: if etcd {
                    Some(EtcdCluster::start(3).map_err(Unavailable)?)
                } else {
                    None
                },
                redis: if redis {
                    Some(RedisCluster::start(3).map_err(Unavailable)?)
                } else {
                    None
                },
            })
        })
        .await
        .map_err(|e| Unavailable(e.to_string()))?
    }
}

/// etcd: a backend connected to every member, and a counter reading every
/// member's `/metrics`.
pub(crate) async fn etcd(
    cluster: &EtcdCluster,
) -> Result<(leasehold::backend::Etcd, Counter), BoxError> {
    let endpoints = cluster.endpoints();
    let etcd = leasehold::backend::Etcd::connect(&endpoints).await?;
    let members = endpoints
        .iter()
        .map(|e| e.trim_start_matches("http://").to_owned())
        .collect();
    Ok((etcd, Counter::Etcd { members }))
}

/// Redis Cluster: a backend on the cluster (subscribed for releases through
/// one node: the cluster passes a `PUBLISH` to every node), a cluster client
/// to the same nodes for the floor, and a counter on a connection to each
/// master.
pub(crate) async fn redis_cluster(
    cluster: &RedisCluster,
) -> Result<
    (
        leasehold::backend::Redis,
        redis::cluster::ClusterClient,
        Counter,
    ),
    BoxError,
> {
    let nodes = cluster.nodes();
    let backend = leasehold::backend::Redis::cluster(&nodes)
        .await?
        .with_pubsub(redis::Client::open(nodes[0].as_str())?);
    let client = redis::cluster::ClusterClient::new(nodes.clone())?;
    let mut conns = Vec::new();
    for node in &nodes {
        conns.push(
            redis::Client::open(node.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    Ok((backend, client, Counter::RedisCluster { conns }))
}

/// Redis: a pool and a counter (on a connection of its own).
pub(crate) async fn redis(
    server: &PrivateServer,
) -> Result<(deadpool_redis::Pool, Counter), BoxError> {
    let client = redis::Client::open(server.url())?;
    let conn = client.get_multiplexed_async_connection().await?;
    let pool = deadpool_redis::Config::from_url(server.url())
        .builder()?
        .max_size(POOL_SIZE as usize)
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()?;
    Ok((pool, Counter::Redis { conn }))
}
