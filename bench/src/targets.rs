//! The backends under test, and their floors: the same statements the
//! backend sends, issued directly through sqlx, redis or etcd-client on the
//! same pool or client (Redis Cluster: a cluster connection of its own to
//! the same nodes, since the backend keeps its own).
//!
//! The SQL and Lua here are copies of the backends' own (`lease/src/backend/`)
//! for the default table `task_leases`; the test `floor_statements` captures
//! the statements both send, and fails when they differ. The etcd floor is
//! the requests `Etcd` documents (`lease/src/backend/etcd.rs`, "Calls"):
//! `LeaseGrant`, a `Txn` that puts the key if it is absent, a `Txn` that
//! deletes it if it is still this acquisition's, `LeaseRevoke`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp};
use futures_util::future::join_all;
use leasehold::backend::{Etcd, MySqlTable, PgAdvisory, PgTable, Redis, SqliteTable};
use leasehold::{Acquisition, Backend, Error, Grant, Lease};
use sqlx::{MySqlPool, PgPool, SqlitePool};

use crate::BoxError;

#[cfg(test)]
mod floor_statements;

/// One backend under test.
#[derive(Clone)]
pub(crate) enum Target {
    Pg(PgTable),
    MySql(MySqlTable),
    Sqlite(SqliteTable),
    Redis(Redis, deadpool_redis::Pool),
    PgAdvisory(PgAdvisory, PgPool),
    /// Boxed, as the cluster client below: both are kilobytes large.
    Etcd(Box<Etcd>),
    /// `Redis::cluster`, and a cluster client to the same nodes for the floor.
    RedisCluster(Redis, Box<redis::cluster::ClusterClient>),
}

/// The floor's Redis connection: to one server, or to a Redis Cluster
/// (which routes each script to the master of its keys' hash slot).
#[derive(Clone)]
pub(crate) enum RedisConn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for RedisConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// `PgAdvisory::with_fencing`'s acquisition, `{table}` its fence table.
const ADVISORY_FENCED_ACQUIRE: &str = "WITH lock AS MATERIALIZED \
     (SELECT pg_try_advisory_lock($1) AS granted, pg_backend_pid() AS pid), \
     bumped AS (INSERT INTO {table} AS f (name, fence) SELECT $2, 1 FROM lock WHERE granted \
     ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1 RETURNING fence) \
     SELECT lock.granted, lock.pid, (SELECT fence FROM bumped) FROM lock";

const PG_ACQUIRE: &str = "INSERT INTO task_leases AS l (name, holder, expires_at, fence) \
     SELECT $1, $2, clock_timestamp() + $3 * interval '1 millisecond', 1 \
     WHERE NOT EXISTS (SELECT 1 FROM task_leases \
     WHERE name = $1 AND holder <> $2 AND expires_at > clock_timestamp()) \
     ON CONFLICT (name) DO UPDATE SET \
     holder = EXCLUDED.holder, \
     expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at), \
     fence = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > clock_timestamp() \
     AND l.fence > 0 THEN l.fence ELSE l.fence + 1 END, \
     value = NULL \
     WHERE l.expires_at <= clock_timestamp() OR l.holder = EXCLUDED.holder \
     RETURNING fence";
const PG_RELEASE: &str = "WITH released AS (UPDATE task_leases SET expires_at = TIMESTAMPTZ 'epoch', \
     value = NULL WHERE name = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp() \
     RETURNING name) SELECT pg_notify('lease:task_leases', name) FROM released";

const MY_ACQUIRE: &str = "INSERT INTO task_leases (name, holder, expires_at, fence) VALUES (?, ?, \
     TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6)), LAST_INSERT_ID(1)) \
     ON DUPLICATE KEY UPDATE fence = IF(expires_at <= UTC_TIMESTAMP(6) OR holder = ?, \
     LAST_INSERT_ID(IF(expires_at > UTC_TIMESTAMP(6) AND holder = ? AND fence > 0, fence, fence + 1)), \
     fence + LAST_INSERT_ID(0)), holder = IF(expires_at <= UTC_TIMESTAMP(6) OR holder = ?, ?, holder), \
     expires_at = IF(expires_at <= UTC_TIMESTAMP(6) OR holder = ?, \
     GREATEST(expires_at, TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6))), expires_at), \
     value = IF(holder = ?, NULL, value)";
const MY_RELEASE: &str = "UPDATE task_leases SET expires_at = FROM_UNIXTIME(1), value = NULL \
     WHERE name = ? AND holder = ? AND fence = ? AND expires_at > UTC_TIMESTAMP(6)";

macro_rules! now_ms {
    () => {
        "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    };
}
const LITE_ACQUIRE: &str = concat!(
    "INSERT INTO task_leases AS l (name, holder, expires_at, fence) VALUES (?1, ?2, ",
    now_ms!(),
    " + ?3, 1) ON CONFLICT (name) DO UPDATE SET \
     holder = excluded.holder, \
     expires_at = max(l.expires_at, excluded.expires_at), \
     fence = CASE WHEN l.holder = excluded.holder AND l.expires_at > ",
    now_ms!(),
    " THEN l.fence ELSE l.fence + 1 END, value = NULL WHERE l.expires_at <= ",
    now_ms!(),
    " OR l.holder = excluded.holder RETURNING fence"
);
const LITE_RELEASE: &str = concat!(
    "UPDATE task_leases SET expires_at = 0, value = NULL \
     WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND expires_at > ",
    now_ms!()
);

const REDIS_ACQUIRE: &str = r"
local slot, last = -1, -1
if ARGV[3] ~= '0' then
  if redis.replicate_commands then redis.replicate_commands() end
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  slot = math.floor(ms / tonumber(ARGV[3]))
  last = tonumber(redis.call('GET', KEYS[3]) or '-1') or -1
  if slot <= last then
    return {2, slot}
  end
end
local value = redis.call('GET', KEYS[1])
local fence
if value then
  local sep = string.find(value, ':', 1, true)
  fence = sep and tonumber(string.sub(value, 1, sep - 1))
  if not (fence and string.sub(value, sep + 1) == ARGV[1]) then
    return {0, redis.call('PTTL', KEYS[1])}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
  if counter and counter < fence then
    redis.call('SET', KEYS[2], fence)
  end
else
  fence = redis.pcall('INCR', KEYS[2])
  if type(fence) ~= 'number' or fence < 1 then
    return redis.error_reply('lease: the fence key ' .. KEYS[2] .. ' does not hold a positive integer')
  end
  redis.call('SET', KEYS[1], fence .. ':' .. ARGV[1], 'PX', ARGV[2])
end
if ARGV[4] == '1' and slot >= 0 then
  redis.call('SET', KEYS[3], string.format('%d', slot))
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[4], fence .. ':' .. ARGV[6])
else
  redis.call('DEL', KEYS[4])
end
return {1, fence, slot, last}
";
const REDIS_RELEASE: &str = r"
if KEYS[3] then
  local last = tonumber(redis.call('GET', KEYS[3]) or '-1') or -1
  if tonumber(ARGV[4]) > last then
    redis.call('SET', KEYS[3], ARGV[4])
  end
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local deleted = redis.call('DEL', KEYS[1])
  if KEYS[2] then
    redis.call('DEL', KEYS[2])
  end
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return deleted
end
return 0
";
/// `PgAdvisory`'s unlock, which notifies its waiters.
const ADVISORY_UNLOCK: &str = "SELECT CASE WHEN pg_advisory_unlock($1) \
     THEN (SELECT true FROM pg_notify('lease_advisory', $1::text)) ELSE false END";

/// Hashed once, as the backend does.
static SCRIPTS: std::sync::LazyLock<(redis::Script, redis::Script)> =
    std::sync::LazyLock::new(|| {
        (
            redis::Script::new(REDIS_ACQUIRE),
            redis::Script::new(REDIS_RELEASE),
        )
    });

type Fences = HashMap<(u8, String), Option<u64>>;

/// The fencing token of the last acquisition of each (target, name) made
/// through [`Target::acquire`], for the renewals and releases that follow.
fn fences() -> std::sync::MutexGuard<'static, Fences> {
    static FENCES: LazyLock<Mutex<Fences>> = LazyLock::new(Mutex::default);
    FENCES.lock().unwrap_or_else(|e| e.into_inner())
}

impl Target {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Target::Pg(_) => "PgTable",
            Target::MySql(_) => "MySqlTable",
            Target::Sqlite(_) => "SqliteTable",
            Target::Redis(..) => "Redis",
            Target::PgAdvisory(b, _) if b.fence_table().is_some() => "PgAdvisory (fenced)",
            Target::PgAdvisory(b, _) if !b.watches() => "PgAdvisory (unwatched)",
            Target::PgAdvisory(..) => "PgAdvisory",
            Target::Etcd(_) => "Etcd",
            Target::RedisCluster(..) => "RedisCluster",
        }
    }

    /// A `Lease` on this backend, optionally wrapped in [`Counted`].
    pub(crate) fn lease(&self, holder: &str) -> Lease {
        match self {
            Target::Pg(b) => Lease::with_holder(b.clone(), holder),
            Target::MySql(b) => Lease::with_holder(b.clone(), holder),
            Target::Sqlite(b) => Lease::with_holder(b.clone(), holder),
            Target::Redis(b, _) => Lease::with_holder(b.clone(), holder),
            Target::PgAdvisory(b, _) => Lease::with_holder(b.clone(), holder),
            Target::Etcd(b) => Lease::with_holder((**b).clone(), holder),
            Target::RedisCluster(b, _) => Lease::with_holder(b.clone(), holder),
        }
    }

    /// A `Lease` on this backend wrapped in [`Counted`].
    pub(crate) fn counted_lease(&self, holder: &str, batched: bool, calls: Arc<Calls>) -> Lease {
        match self {
            Target::Pg(b) => Lease::with_holder(Counted::new(b.clone(), batched, calls), holder),
            Target::MySql(b) => Lease::with_holder(Counted::new(b.clone(), batched, calls), holder),
            Target::Sqlite(b) => {
                Lease::with_holder(Counted::new(b.clone(), batched, calls), holder)
            }
            Target::Redis(b, _) => {
                Lease::with_holder(Counted::new(b.clone(), batched, calls), holder)
            }
            Target::PgAdvisory(b, _) => {
                Lease::with_holder(Counted::new(b.clone(), batched, calls), holder)
            }
            Target::Etcd(b) => {
                Lease::with_holder(Counted::new((**b).clone(), batched, calls), holder)
            }
            Target::RedisCluster(b, _) => {
                Lease::with_holder(Counted::new(b.clone(), batched, calls), holder)
            }
        }
    }

    pub(crate) async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, Error> {
        let grant = match self {
            Target::Pg(b) => b.acquire(name, holder, ttl).await?,
            Target::MySql(b) => b.acquire(name, holder, ttl).await?,
            Target::Sqlite(b) => b.acquire(name, holder, ttl).await?,
            Target::Redis(b, _) => b.acquire(name, holder, ttl).await?,
            Target::PgAdvisory(b, _) => b.acquire(name, holder, ttl).await?,
            Target::Etcd(b) => b.acquire(name, holder, ttl).await?,
            Target::RedisCluster(b, _) => b.acquire(name, holder, ttl).await?,
        };
        if let Some(grant) = grant {
            fences().insert((self.kind(), name.to_owned()), grant.fencing_token);
        }
        Ok(grant.is_some())
    }

    /// The acquisition of `name` by `holder` that [`acquire`](Self::acquire)
    /// last got (renew and release concern one acquisition).
    fn acquisition<'a>(&self, name: &'a str, holder: &'a str) -> Acquisition<'a> {
        let fence = fences()
            .get(&(self.kind(), name.to_owned()))
            .copied()
            .flatten();
        Acquisition::new(name, holder, fence)
    }

    fn kind(&self) -> u8 {
        match self {
            Target::Pg(_) => 0,
            Target::MySql(_) => 1,
            Target::Sqlite(_) => 2,
            Target::Redis(..) => 3,
            Target::PgAdvisory(..) => 4,
            Target::Etcd(_) => 5,
            Target::RedisCluster(..) => 6,
        }
    }

    pub(crate) async fn renew(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, Error> {
        let lease = self.acquisition(name, holder);
        match self {
            Target::Pg(b) => b.renew(lease, ttl).await,
            Target::MySql(b) => b.renew(lease, ttl).await,
            Target::Sqlite(b) => b.renew(lease, ttl).await,
            Target::Redis(b, _) => b.renew(lease, ttl).await,
            Target::PgAdvisory(b, _) => b.renew(lease, ttl).await,
            Target::Etcd(b) => b.renew(lease, ttl).await,
            Target::RedisCluster(b, _) => b.renew(lease, ttl).await,
        }
    }

    pub(crate) async fn renew_many(
        &self,
        holder: &str,
        leases: &[(&str, Duration)],
    ) -> Result<Vec<bool>, Error> {
        let leases: Vec<(Acquisition<'_>, Duration)> = leases
            .iter()
            .map(|&(name, ttl)| (self.acquisition(name, holder), ttl))
            .collect();
        match self {
            Target::Pg(b) => b.renew_many(&leases).await,
            Target::MySql(b) => b.renew_many(&leases).await,
            Target::Sqlite(b) => b.renew_many(&leases).await,
            Target::Redis(b, _) => b.renew_many(&leases).await,
            Target::PgAdvisory(b, _) => b.renew_many(&leases).await,
            Target::Etcd(b) => b.renew_many(&leases).await,
            Target::RedisCluster(b, _) => b.renew_many(&leases).await,
        }
    }

    pub(crate) async fn release(&self, name: &str, holder: &str) -> Result<(), Error> {
        let lease = self.acquisition(name, holder);
        match self {
            Target::Pg(b) => b.release(lease).await,
            Target::MySql(b) => b.release(lease).await,
            Target::Sqlite(b) => b.release(lease).await,
            Target::Redis(b, _) => b.release(lease).await,
            Target::PgAdvisory(b, _) => b.release(lease).await,
            Target::Etcd(b) => b.release(lease).await,
            Target::RedisCluster(b, _) => b.release(lease).await,
        }
    }

    /// Requests in one [`floor_cycle`](Self::floor_cycle): 2 (`Etcd`: 4).
    pub(crate) fn floor_requests(&self) -> u32 {
        if matches!(self, Target::Etcd(_)) {
            4
        } else {
            2
        }
    }

    /// The floor of one `with_lease` cycle: the backend's acquire statement
    /// and its release statement, sent directly on the same pool. Returns
    /// whether the acquire succeeded.
    pub(crate) async fn floor_cycle(
        &self,
        redis_conn: &mut Option<RedisConn>,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, BoxError> {
        let ttl_ms = ttl.as_millis() as i64;
        match self {
            Target::Pg(b) => pg_floor(b.pool(), name, holder, ttl_ms).await,
            Target::MySql(b) => my_floor(b.pool(), name, holder, ttl_ms).await,
            Target::Sqlite(b) => lite_floor(b.pool(), name, holder, ttl_ms).await,
            Target::Redis(b, pool) => {
                if redis_conn.is_none() {
                    let conn = pool.get().await?;
                    *redis_conn = Some(RedisConn::Single((*conn).clone()));
                }
                let conn = redis_conn.as_mut().ok_or("no redis connection")?;
                redis_floor(b, conn, name, holder, ttl_ms).await
            }
            Target::RedisCluster(b, client) => {
                if redis_conn.is_none() {
                    *redis_conn = Some(RedisConn::Cluster(client.get_async_connection().await?));
                }
                let conn = redis_conn.as_mut().ok_or("no redis connection")?;
                redis_floor(b, conn, name, holder, ttl_ms).await
            }
            Target::Etcd(b) => etcd_floor(b, name, holder, ttl).await,
            Target::PgAdvisory(b, pool) => {
                let mut conn = pool.acquire().await?;
                advisory_floor(b, &mut conn, name).await
            }
        }
    }

    /// `PgAdvisory` only: sqlx's own `PgAdvisoryLock` try-acquire and release.
    pub(crate) async fn sqlx_lock_cycle(&self, name: &str) -> Result<bool, BoxError> {
        let Target::PgAdvisory(b, pool) = self else {
            return Err("sqlx's PgAdvisoryLock is a PgAdvisory baseline only".into());
        };
        // The key the backend locks, derived on every cycle as the backend
        // derives it.
        let lock = sqlx::postgres::PgAdvisoryLock::with_key(
            sqlx::postgres::PgAdvisoryLockKey::BigInt(b.lock_key(name)),
        );
        let conn = pool.acquire().await?;
        match lock.try_acquire(conn).await? {
            sqlx::Either::Left(guard) => {
                guard.release_now().await?;
                Ok(true)
            }
            sqlx::Either::Right(_conn) => Ok(false),
        }
    }
}

/// `PgAdvisory`'s acquire statement and, if it was granted, its release
/// statement on `conn`; whether it was granted.
async fn advisory_floor(
    b: &PgAdvisory,
    conn: &mut sqlx::PgConnection,
    name: &str,
) -> Result<bool, BoxError> {
    // Derived on every cycle, as the backend derives it on every acquisition.
    let key = b.lock_key(name);
    let locked = match b.fence_table() {
        None => {
            let (locked, _pid): (bool, i32) =
                sqlx::query_as("SELECT pg_try_advisory_lock($1), pg_backend_pid()")
                    .bind(key)
                    .fetch_one(&mut *conn)
                    .await?;
            locked
        }
        // The fenced acquisition's statement (`PgAdvisory::with_fencing`).
        Some(table) => {
            let (locked, _pid, _fence): (bool, i32, Option<i64>) = sqlx::query_as(
                sqlx::AssertSqlSafe(ADVISORY_FENCED_ACQUIRE.replace("{table}", table)),
            )
            .bind(key)
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
            locked
        }
    };
    if locked {
        let _: bool = sqlx::query_scalar(ADVISORY_UNLOCK)
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
    }
    Ok(locked)
}

/// The floor of a `Redis` cycle on one multiplexed connection, for the
/// `cycles` example's profiles: the backend's two scripts sent directly.
pub async fn redis_floor_cycle(
    b: &Redis,
    conn: &redis::aio::MultiplexedConnection,
    name: &str,
    ttl: Duration,
) -> Result<bool, BoxError> {
    let mut conn = RedisConn::Single(conn.clone());
    redis_floor(b, &mut conn, name, "bench-floor", ttl.as_millis() as i64).await
}

/// The backend's acquire and release scripts (`Redis`, `RedisCluster`).
async fn redis_floor(
    b: &Redis,
    conn: &mut RedisConn,
    name: &str,
    holder: &str,
    ttl_ms: i64,
) -> Result<bool, BoxError> {
    let lock = b.lock_key(name);
    // No slot to claim ('0'), no value to publish ('0'): the value key is
    // deleted, as the backend's plain acquire does.
    let answer: Vec<i64> = SCRIPTS
        .0
        .key(&lock)
        .key(b.fence_key(name))
        .key(format!("{lock}:slot"))
        .key(format!("{lock}:value"))
        .arg(holder)
        .arg(ttl_ms)
        .arg("0")
        .arg("0")
        .arg("0")
        .arg("")
        .invoke_async(conn)
        .await?;
    // {1, fence, ..} when granted; the lock holds `{fence}:{holder}` while
    // this acquisition has it.
    let fence = if answer.first() == Some(&1) {
        answer[1]
    } else {
        0
    };
    let _: i64 = SCRIPTS
        .1
        .key(&lock)
        .key(format!("{lock}:value"))
        .arg(format!("{fence}:{holder}"))
        .arg(b.release_channel())
        .arg(name)
        .invoke_async(conn)
        .await?;
    Ok(fence > 0)
}

/// `Etcd`'s acquire (a new etcd lease, a transaction that puts the key
/// attached to it if the key is absent) and release (a transaction that
/// deletes the key if its `create_revision` and value are this
/// acquisition's, then the revocation of the etcd lease), on the backend's
/// own client: four requests.
async fn etcd_floor(b: &Etcd, name: &str, holder: &str, ttl: Duration) -> Result<bool, BoxError> {
    let mut client = b.client().clone();
    let id = client
        .lease_grant(Etcd::lease_ttl_secs(ttl), None)
        .await?
        .id();
    let key = b.key(name);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.clone(),
            holder,
            Some(PutOptions::new().with_lease(id)),
        )])
        .or_else([TxnOp::get(key.clone(), None)]);
    let put = client.txn(txn).await?;
    let fence = put.header().map(|h| h.revision()).unwrap_or(0);
    if put.succeeded() {
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, fence),
                Compare::value(key.clone(), CompareOp::Equal, holder),
            ])
            .and_then([TxnOp::delete(
                key,
                Some(DeleteOptions::new().with_prev_key()),
            )]);
        client.txn(txn).await?;
    }
    client.lease_revoke(id).await?;
    Ok(put.succeeded())
}

async fn pg_floor(pool: &PgPool, name: &str, holder: &str, ttl_ms: i64) -> Result<bool, BoxError> {
    let fence: Option<i64> = sqlx::query_scalar(PG_ACQUIRE)
        .bind(name)
        .bind(holder)
        .bind(ttl_ms)
        .fetch_optional(pool)
        .await?;
    sqlx::query(PG_RELEASE)
        .bind(name)
        .bind(holder)
        .bind(fence)
        .execute(pool)
        .await?;
    Ok(fence.is_some())
}

async fn my_floor(
    pool: &MySqlPool,
    name: &str,
    holder: &str,
    ttl_ms: i64,
) -> Result<bool, BoxError> {
    let (n, h) = (name.as_bytes(), holder.as_bytes());
    let done = sqlx::query(MY_ACQUIRE)
        .bind(n)
        .bind(h)
        .bind(ttl_ms)
        .bind(h)
        .bind(h)
        .bind(h)
        .bind(h)
        .bind(h)
        .bind(ttl_ms)
        .bind(h)
        .execute(pool)
        .await?;
    // The fence comes back as the last insert id (0: not acquired).
    let fence = done.last_insert_id();
    sqlx::query(MY_RELEASE)
        .bind(n)
        .bind(h)
        .bind(i64::try_from(fence).ok())
        .execute(pool)
        .await?;
    Ok(fence != 0)
}

async fn lite_floor(
    pool: &SqlitePool,
    name: &str,
    holder: &str,
    ttl_ms: i64,
) -> Result<bool, BoxError> {
    let fence: Option<i64> = sqlx::query_scalar(LITE_ACQUIRE)
        .bind(name)
        .bind(holder)
        .bind(ttl_ms)
        .fetch_optional(pool)
        .await?;
    sqlx::query(LITE_RELEASE)
        .bind(name)
        .bind(holder)
        .bind(fence)
        .execute(pool)
        .await?;
    Ok(fence.is_some())
}

/// Renewal calls a `Counted` backend saw: for backends without a server
/// (SQLite) and as a cross-check of the server's count.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    /// `renew` calls and `renew_many` calls (each one statement when batched).
    pub(crate) renew_calls: AtomicU64,
    /// Leases renewed (in `renew` and `renew_many` together).
    pub(crate) renewed_leases: AtomicU64,
    /// `(ms since the start, leases)` of every call.
    pub(crate) log: std::sync::Mutex<Vec<(u128, usize)>>,
    pub(crate) start: std::sync::OnceLock<std::time::Instant>,
}

impl Calls {
    fn record(&self, leases: usize) {
        self.renew_calls.fetch_add(1, Ordering::Relaxed);
        self.renewed_leases
            .fetch_add(leases as u64, Ordering::Relaxed);
        let start = *self.start.get_or_init(std::time::Instant::now);
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((start.elapsed().as_millis(), leases));
    }
}

/// A backend that counts renewals, and either passes `renew_many` on
/// (`batched`) or renews each lease on its own, as the trait's default does
/// for a backend that does not override it — the unbatched baseline.
pub(crate) struct Counted<B> {
    inner: B,
    batched: bool,
    calls: Arc<Calls>,
}

impl<B> Counted<B> {
    pub(crate) fn new(inner: B, batched: bool, calls: Arc<Calls>) -> Self {
        Self {
            inner,
            batched,
            calls,
        }
    }
}

impl<B: Backend> Backend for Counted<B> {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        self.inner.acquire(name, holder, ttl).await
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        self.calls.record(1);
        self.inner.renew(lease, ttl).await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.inner.release(lease).await
    }

    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        if self.batched {
            self.calls.record(leases.len());
            self.inner.renew_many(leases).await
        } else {
            join_all(leases.iter().map(|&(lease, ttl)| self.renew(lease, ttl)))
                .await
                .into_iter()
                .collect()
        }
    }
}
