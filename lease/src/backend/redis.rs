//! [`Redis`]: `SET NX PX` locks with token-checked Lua renew and release.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use ::redis::aio::{MultiplexedConnection, PubSubSink, PubSubStream};
use ::redis::{RedisError, Script, ScriptInvocation};
use deadpool_redis::Pool;
use futures_util::StreamExt;
use futures_util::future::join_all;

use crate::backend::push::{Event, Push, Source};
use crate::{Acquisition, Backend, Error, Grant, LeaseInfo, Result, validate};

/// Acquire. KEYS: lock, fence. ARGV: holder, ttl in ms.
/// Returns the fencing token (an integer), or 0 when another holder has the
/// lock.
///
/// The lock's value is `{fence}:{holder}`: the fence lives with the lock, so
/// an idempotent re-acquire returns the lease's real fence even if the fence
/// key was lost (evicted, deleted), and puts the counter back up to it.
const ACQUIRE: &str = r"
local value = redis.call('GET', KEYS[1])
if value then
  local sep = string.find(value, ':', 1, true)
  local fence = sep and tonumber(string.sub(value, 1, sep - 1))
  if fence and string.sub(value, sep + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
    if counter and counter < fence then
      redis.call('SET', KEYS[2], fence)
    end
    return fence
  end
  return 0
end
local fence = redis.pcall('INCR', KEYS[2])
if type(fence) ~= 'number' or fence < 1 then
  return redis.error_reply('lease: the fence key ' .. KEYS[2] .. ' does not hold a positive integer')
end
redis.call('SET', KEYS[1], fence .. ':' .. ARGV[1], 'PX', ARGV[2])
return fence
";

/// Renew. KEYS: lock. ARGV: the acquisition's lock value, ttl in ms.
/// Returns 1 if renewed, 0 if the lock no longer holds that acquisition.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Renew many. KEYS: locks. ARGV: per key, the acquisition's lock value and
/// the ttl in ms. Returns one integer per key, in order: 1 if renewed, 0 if
/// not.
const RENEW_MANY: &str = r"
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[2 * i - 1] then
    renewed[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    renewed[i] = 0
  end
end
return renewed
";

/// The most keys one [`RENEW_MANY`] call takes: Redis runs a script
/// without serving anyone else, so a huge batch is split.
const RENEW_MANY_CHUNK: usize = crate::backend::MAX_BATCH;

/// Release. KEYS: lock. ARGV: the acquisition's lock value, the channel of
/// releases, the lease name. Returns 1 if deleted, 0 if the lock no longer
/// holds that acquisition.
///
/// A lock deleted is announced with `PUBLISH channel name`, in the same
/// script: waiters subscribed to the channel (in this or any process) try
/// to acquire at once. Plain `PUBLISH` (not Redis 7's sharded `SPUBLISH`):
/// it reaches every subscriber of the channel, on a single server and on
/// every node of a Redis Cluster alike.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local deleted = redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return deleted
end
return 0
";

/// Inspect. KEYS: lock, and in the default layout the fence key. Returns
/// the lock's value (nil if none), its `PTTL` (-2: no lock, -1: no expiry)
/// and the fence counter (nil if none, or no fence key given).
const INSPECT: &str = r"
local value = redis.call('GET', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
local fence = false
if KEYS[2] then
  fence = redis.call('GET', KEYS[2])
end
return {value, ttl, fence}
";

/// One step of `SCAN` (never `KEYS`, which blocks the server for the whole
/// keyspace). ARGV: the cursor, the `MATCH` pattern, the `COUNT`. Returns
/// the next cursor and the keys of this step, as `SCAN` does.
const SCAN: &str = r"
return redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
";

/// Force a release. KEYS: lock. ARGV: the channel of releases, the lease
/// name. Deletes the lock whoever holds it (the fence key stays) and
/// announces it as [`RELEASE`] does. Returns 1 if a lock was deleted.
const FORCE_RELEASE: &str = r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  return 1
end
return 0
";

/// Acquire in the Go locker's protocol ([`Redis::with_go_locker_protocol`]).
/// KEYS: lock. ARGV: the token of our live acquisition of this name (`''`
/// if none), a new random token, ttl in ms. Returns 1 if the lock now holds
/// the new token, 0 when another holder has it.
///
/// A free lock is taken with `SET lock token NX PX ttl`, exactly as the Go
/// locker takes it. A lock that holds our current token (an idempotent
/// re-acquire), or already the new one (this very call, retried after its
/// answer was lost), gets the new token and a fresh ttl: every acquisition
/// has a token of its own, so that a late release of an older acquisition
/// (which deletes the lock iff it holds that acquisition's token) can never
/// end a newer one.
const GO_ACQUIRE: &str = r"
local value = redis.call('GET', KEYS[1])
if not value then
  if redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[3]) then
    return 1
  end
  return 0
end
if value == ARGV[2] or (ARGV[1] ~= '' and value == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

struct Scripts {
    acquire: Script,
    go_acquire: Script,
    renew: Script,
    renew_many: Script,
    release: Script,
    inspect: Script,
    scan: Script,
    force_release: Script,
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag
/// (the part between the first `{` and the next `}`, if not empty) or of
/// the whole key, modulo 16384.
fn hash_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(bytes) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Built once: `Script::new` hashes the source for `EVALSHA`.
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(ACQUIRE),
    go_acquire: Script::new(GO_ACQUIRE),
    renew: Script::new(RENEW),
    renew_many: Script::new(RENEW_MANY),
    release: Script::new(RELEASE),
    inspect: Script::new(INSPECT),
    scan: Script::new(SCAN),
    force_release: Script::new(FORCE_RELEASE),
});

/// Leases as Redis keys: `SET key value NX PX ttl`, renewed and released
/// by Lua scripts that first check the key still holds this acquisition,
/// with fencing tokens.
///
/// # Keys
///
/// A lease name `name` uses two keys, both in the same cluster hash slot:
///
/// - the lock key `{prefix}{{esc(name)}}`, whose value is
///   `{fencing token}:{holder}` and whose TTL is the lease's ttl (set by
///   Redis, so expiry follows the server's clock). Renew and release compare
///   the whole value: they concern one acquisition, so a late request of an
///   older acquisition (even by the same holder) never touches a newer one;
/// - the fence key `{prefix}{{esc(name)}}:fence`, a counter `INCR`ed on every
///   acquisition (not on an idempotent re-acquire). It never expires, so the
///   fencing token keeps growing across releases: expect one small key per
///   name ever acquired.
///
/// The fencing token of a live lease is kept in its lock's value, so it
/// never goes back while the lock lives: if the fence key is lost (deleted,
/// evicted) an idempotent re-acquire still returns the lease's own token and
/// sets the counter back up to it. If the fence key is lost while *no* lock
/// of its name lives, the next acquisition starts again at 1: tokens can
/// then go backwards (see below for what loses keys).
///
/// `esc` percent-encodes exactly `%`, `{` and `}` (as `%25`, `%7B`, `%7D`),
/// so the part between the braces is the Redis Cluster hash tag, every name
/// maps to its own keys, and a lock key (ending in `}`) never equals a fence
/// key (ending in `:fence`). Names are data: quotes, spaces, `%`, braces and
/// any Unicode work. The prefix defaults to `lease:`
/// ([`with_prefix`](Redis::with_prefix)). For example the name `a{b}` has the
/// lock key `lease:{a%7Bb%7D}`.
///
/// That is the default layout. To run beside the Go `lock` package's
/// `Redis` locker, [`with_go_locker_protocol`](Redis::with_go_locker_protocol)
/// switches to its protocol: one key `{prefix}{name}` per name, whose value
/// is a random token per acquisition, and no fencing token.
///
/// # Calls
///
/// Each acquire, renew and release is one `EVALSHA` (via [`redis::Script`],
/// which loads the script on `NOSCRIPT`): one round trip. The renewals of
/// many leases of one holder ([`Backend::renew_many`]) are one `EVALSHA` of
/// a script over all their keys (up to 1,000 keys per call; larger batches
/// are split into several calls, sent together), which tells each lease
/// whether it was renewed. On a Redis Cluster (`Redis::cluster`) a
/// script's keys must share a hash slot, so the batch is split by slot: one
/// script per slot, sent together (each to the master of its slot). A
/// client that does not know it talks to a cluster (a pool on a cluster
/// proxy) sends one script over many slots; when that is refused with
/// `CROSSSLOT`, the renewals are sent one script per key instead, pipelined.
///
/// # Connection
///
/// The backend sends every call on one connection of its own (on a Redis
/// Cluster, one cluster connection, which keeps a connection per node and
/// routes each request to the master of its slot); with a pool, a
/// [`MultiplexedConnection`] that pipelines concurrent requests (checking a
/// connection out of the pool for each call would cost a round trip of its
/// own: deadpool-redis checks a connection with `PING` each time it hands it
/// out). It takes that connection from the pool and removes it from the pool
/// for good ([`deadpool_redis::Connection::take`]): the pool's connection
/// settings and hooks apply to it, but no other user of the pool ever sends
/// a command on it — a `BLPOP`, a slow command or a `MULTI` of the
/// application cannot hold up a renewal — and it no longer counts against
/// the pool's size. Clones of the backend share it.
///
/// Each call is bounded by the backend's [timeout](Redis::with_timeout)
/// (default 5 s), getting a connection included, after which it fails with
/// [`Error::Timeout`]. Each request on the connection is also bounded by the
/// connection's own response timeout (redis' default is 500 ms, unless the
/// pool's connection settings choose another), after which it fails with a
/// [`Error::Redis`] timeout; and the engine gives every call a time limit
/// of its own (a renewal at most `ttl/3`), at which it drops the call.
///
/// A connection that leaves a request without its answer is never used
/// again. When a request times out (by any of these limits), is dropped
/// before its answer arrived, or fails on the connection (an I/O error; the
/// server closed it, after a restart or a `CLIENT KILL`; a `READONLY` error
/// from a primary demoted to a replica), the connection is retired and the
/// next call takes a new one from the pool (calls that need one at the same
/// time wait for the same new connection rather than each taking one). The
/// call that failed that way is retried once at once, on the new
/// connection, within the same timeout: all the scripts are idempotent.
/// An error reply of the server (it answered) keeps the connection.
///
/// So a connection that stops answering without being closed — a half-open
/// socket after a network partition, a failover behind a virtual IP, a lost
/// NAT entry, which TCP itself reports only after about 15 minutes — is
/// retired when the first call sent into the silence reaches its time
/// limit: the shortest of the backend's timeout (5 s by default), the
/// response timeout (500 ms by default) and the engine's limit for that
/// call (`ttl/3` for a renewal, `min(ttl - margin, 30 s)` for an
/// acquisition). Every call that starts after that goes to a new
/// connection, which costs the time to get one from the pool (a new TCP
/// connection, or the pool's `PING` of an idle one; if the pool is
/// exhausted, it waits for a free slot, within the call's time limit).
/// With redis' default response timeout, the call that ran into the silent
/// connection is itself retried on a new one after 500 ms. Calls already in
/// flight on the retired connection fail at their own time limits.
/// Renewals that fail are retried by the engine until the lease's local
/// deadline, so a connection that dies or goes silent while a lease is held
/// does not lose the lease if a new connection works before then.
///
/// A call therefore costs one round trip (plus `SCRIPT LOAD` the first time
/// on a server), and a renewal must answer within `ttl/3`: choose a ttl well
/// above three times the worst round trip to Redis (`docs/RELIABILITY.md`
/// measures it under added latency).
///
/// When Redis is unreachable, [`Lease::try_acquire`](crate::Lease::try_acquire)
/// returns `Err` within this timeout or the engine's acquire limit
/// (`min(ttl - margin, 30 s)`), whichever is shorter — at once for a refused
/// connection — and never hangs; [`Lease::with_lease`](crate::Lease::with_lease)
/// returns `Skipped(Skip::Error(_))` (the next tick tries again).
///
/// # Waiting
///
/// The release script announces every lock it deletes: `PUBLISH
/// {prefix}released name` ([`release_channel`](Redis::release_channel)),
/// in the same script (still one round trip), in both layouts. It is plain
/// `PUBLISH`, not Redis 7's sharded `SPUBLISH`: one channel for every name
/// reaches a subscriber on a single server and, through the cluster bus, on
/// any node of a Redis Cluster (sharded channels would need a subscription
/// on the shard of each name's slot). Releases are rare, so the broadcast
/// costs little.
///
/// Waiters ([`Lease::acquire`](crate::Lease::acquire) with a wait, an
/// [`Election`](crate::Election)) learn of a release by that message only
/// with [`with_pubsub`](Redis::with_pubsub): a `deadpool_redis` pool cannot
/// subscribe (it hands out multiplexed connections, and keeps its
/// connection settings to itself), so the subscription is a connection of
/// its own, opened from the `redis::Client` given there. The first waiter
/// of a backend value opens it; every waiter of that value and its clones
/// shares it; the waiters of the released name are woken about one round
/// trip after the release, and try to acquire (a message is never trusted).
/// It is checked with `PING` every 30 s (within the backend's timeout), is
/// opened again after a failure (a `CLIENT KILL`, a restart, a silent
/// connection; then every waiter tries once more, as releases in between
/// went unseen), and is closed 10 s after the last waiter is gone (the next
/// one opens it again) or with the last clone of the backend.
///
/// Waiters also poll (every `ttl/10`, at most 1 s, ±20%), and that is all
/// they do without [`with_pubsub`](Redis::with_pubsub). They learn by the
/// poll alone of a lock that **expired** (a crashed holder: Redis publishes
/// nothing when a key expires; taken about one poll after the expiry), of a
/// release by a Go replica (its script does not publish), and of anything
/// released while the subscription was down or where pub/sub does not work
/// (a proxy that refuses `SUBSCRIBE`).
///
/// # What can lose a lease (read this before relying on it)
///
/// A Redis lock is only as durable as the keys behind it:
///
/// - **Restart without persistence** (no AOF, or RDB snapshots only) loses
///   the lock keys *and the fence counters*. A holder finds out at its next
///   renewal (within `ttl/3`) and its token is cancelled, but in the
///   meantime another replica may acquire the same name: two holders overlap
///   for up to `ttl/3`. The new holder's fencing token starts again at 1, so
///   fencing tokens can go *backwards*: a resource that rejects tokens below
///   the largest it has seen would reject the new holder until the counter
///   catches up. Use `appendonly yes` with `appendfsync always` if that
///   matters (`everysec` can still lose the last second).
/// - **Failover to a replica**: replication is asynchronous, so a lock (and
///   a fence increment) acknowledged by the old primary may never have
///   reached the promoted replica. The same overlap of up to `ttl/3` and
///   the same repeated or backwards fencing tokens follow. This backend does
///   not implement Redlock.
/// - **Eviction**: under memory pressure, the `allkeys-lru`, `allkeys-lfu`
///   and `allkeys-random` policies can evict lock keys and fence keys, and
///   `volatile-lru`, `volatile-lfu`, `volatile-random` and `volatile-ttl`
///   can evict lock keys (they have a TTL; fence keys do not). An evicted
///   lock key is a lost lease, as above. Run the instance that holds leases
///   with `maxmemory-policy noeviction`: writes then fail with an error
///   (`try_acquire` returns `Err`) instead of silently dropping locks.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lease::{backend::Redis, deadpool_redis, Lease};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
/// let backend = Redis::new(pool).with_prefix("myapp:lease:")?.with_timeout(Duration::from_secs(2));
/// let lease = Lease::new(backend);
/// if let Some(guard) = lease.try_acquire("nightly-report", Duration::from_secs(30)).await? {
///     println!("fencing token {:?}", guard.fencing_token());
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redis {
    /// Where the backend's connection comes from.
    source: Origin,
    prefix: Arc<str>,
    timeout: Duration,
    /// The connection every call uses, taken out of `pool` on first use and
    /// again after it was retired. Shared by clones.
    conn: Arc<Shared>,
    /// `Some` in the Go locker's protocol: the token of each live
    /// acquisition, by (name, holder). Shared by clones.
    tokens: Option<Arc<Mutex<Tokens>>>,
    /// Where the subscription to releases connects
    /// ([`with_pubsub`](Redis::with_pubsub)); without it, waiters poll.
    pubsub: Option<Arc<::redis::Client>>,
    /// The waiters' subscription, started by the first waiter and stopped
    /// with the last clone. Shared by clones.
    push: Arc<OnceLock<Push<RedisSource>>>,
}

/// The answer of [`INSPECT`]: the lock's value, its `PTTL`, the fence counter.
type InspectAnswer = (Option<String>, i64, Option<String>);

/// Where a [`Redis`] gets its connection.
#[derive(Clone)]
enum Origin {
    /// A deadpool-redis pool ([`Redis::new`]).
    Pool(Pool),
    /// A client the user has ([`Redis::with_client`]).
    Client(Arc<::redis::Client>),
    /// A Redis Cluster ([`Redis::cluster`]).
    #[cfg(feature = "redis-cluster")]
    Cluster(Arc<::redis::cluster::ClusterClient>),
}

/// The backend's connection: to one server, or to a Redis Cluster (which
/// routes each request to the node of its keys' hash slot).
#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(::redis::cluster_async::ClusterConnection),
}

impl ::redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, ::redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The token of each live acquisition, by (name, holder).
type Tokens = HashMap<(String, String), String>;

/// The connection state that clones of a [`Redis`] share.
#[derive(Default)]
struct Shared {
    /// The connection in use: none before the first call and after the
    /// last one was retired.
    current: Mutex<Option<Arc<Conn>>>,
    /// Held while a new connection is taken from the pool, so that the
    /// calls that find none wait for the same one instead of each taking one.
    opening: tokio::sync::Mutex<()>,
}

/// One request in flight on a connection, from just before it is sent
/// until its answer: if it ends any other way — it is dropped (the
/// backend's or the engine's time limit ran out, or the caller gave up) or
/// fails without an answer — the connection is retired ([`Redis::retire`]).
struct InFlight<'a> {
    redis: &'a Redis,
    conn: Arc<Conn>,
    answered: bool,
}

impl InFlight<'_> {
    /// The request ended with `result`: anything but an answer from the
    /// server retires the connection (and asks for a retry).
    fn finish<T>(mut self, result: &Result<T, RedisError>) -> Ended {
        match result {
            Ok(_) => {
                self.answered = true;
                Ended::Answered
            }
            Err(e) if connection_failed(e) => {
                tracing::debug!(error = %e, "redis connection failed; retiring it");
                Ended::ConnectionFailed
            }
            Err(_) => {
                self.answered = true;
                Ended::Answered
            }
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.redis.retire(&self.conn);
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The server answered (a value or an error reply).
    Answered,
    /// No answer, or a connection that cannot be trusted: it was retired.
    ConnectionFailed,
}

/// `e` says nothing came back on the connection (a timeout, an I/O error,
/// a closed connection), or that it is unusable (a protocol error, failed
/// authentication), or that it leads to a primary demoted to a replica
/// (`READONLY`, after a failover behind the same address).
fn connection_failed(e: &RedisError) -> bool {
    e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || e.code() == Some("READONLY")
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("prefix", &self.prefix)
            .field("go_locker_protocol", &self.tokens.is_some())
            .field("pubsub", &self.pubsub.is_some())
            .field("timeout", &self.timeout)
            .field(
                "source",
                &match &self.source {
                    Origin::Pool(pool) => format!("pool {:?}", pool.status()),
                    Origin::Client(_) => "client".to_owned(),
                    #[cfg(feature = "redis-cluster")]
                    Origin::Cluster(_) => "cluster".to_owned(),
                },
            )
            .finish()
    }
}

impl Redis {
    /// The key prefix used unless [`with_prefix`](Redis::with_prefix) sets another.
    pub const DEFAULT_PREFIX: &'static str = "lease:";
    /// The longest key prefix, in bytes.
    pub const MAX_PREFIX_LEN: usize = 64;
    /// How long each Redis call may take unless [`with_timeout`](Redis::with_timeout) says otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// A backend on `pool`, with the key prefix `lease:` and a 5 s timeout per call.
    pub fn new(pool: Pool) -> Self {
        Self::from_source(Origin::Pool(pool))
    }

    /// A backend on a [`redis::Client`](::redis::Client) the application
    /// already has (no pool): it opens its own multiplexed connection from
    /// it, and another one when that one was retired (see
    /// [Connection](Redis#connection)). Key prefix `lease:`, 5 s timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use lease::backend::Redis;
    /// use lease::deadpool_redis::redis;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let backend = Redis::with_client(client.clone()).with_pubsub(client);
    /// assert_eq!(backend.prefix(), "lease:");
    /// # Ok(()) }
    /// ```
    pub fn with_client(client: ::redis::Client) -> Self {
        Self::from_source(Origin::Client(Arc::new(client)))
    }

    /// A backend on a Redis Cluster, reached through `nodes` (URLs such as
    /// `["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]`; any of the
    /// cluster's nodes will do, the client learns the others). It connects
    /// once now, to fail early on a wrong address, and keeps that
    /// connection, which routes each request to the master of its keys'
    /// hash slot and follows `MOVED`/`ASK` redirections.
    ///
    /// Both keys of a lease share one hash slot ([Keys](Redis#keys)), so
    /// every script runs on one node; [`renew_many`](Backend::renew_many)
    /// sends one script per hash slot. Needs the feature `redis-cluster`.
    ///
    /// What a failover does to a held lease: see [What can lose a
    /// lease](Redis#what-can-lose-a-lease-read-this-before-relying-on-it)
    /// (replication to the promoted replica is asynchronous).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] for an invalid node URL or when no node answers.
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub async fn cluster<N: AsRef<str>>(nodes: impl IntoIterator<Item = N>) -> Result<Self, Error> {
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        let client = ::redis::cluster::ClusterClient::new(nodes)?;
        let conn = client.get_async_connection().await?;
        let redis = Self::from_source(Origin::Cluster(Arc::new(client)));
        *redis.cached() = Some(Arc::new(Conn::Cluster(conn)));
        Ok(redis)
    }

    /// True when the backend runs on a Redis Cluster (`Redis::cluster`, feature `redis-cluster`).
    pub fn is_cluster(&self) -> bool {
        match self.source {
            #[cfg(feature = "redis-cluster")]
            Origin::Cluster(_) => true,
            _ => false,
        }
    }

    fn from_source(source: Origin) -> Self {
        Self {
            source,
            prefix: Self::DEFAULT_PREFIX.into(),
            timeout: Self::DEFAULT_TIMEOUT,
            conn: Arc::default(),
            tokens: None,
            pubsub: None,
            push: Arc::default(),
        }
    }

    /// Learn of releases as Redis pushes them, instead of polling: waiters
    /// ([`Lease::acquire`](crate::Lease::acquire), elections) subscribe to
    /// the channel of releases ([`release_channel`](Redis::release_channel))
    /// on a connection of their own, opened from `client`, which must
    /// reach the same Redis server (or cluster) as the pool.
    ///
    /// A `deadpool_redis` pool hands out only multiplexed connections, on
    /// which RESP2 cannot subscribe, and does not tell how it connects: so
    /// the subscription needs its own [`redis::Client`](::redis::Client)
    /// (build it from the pool's URL). Without one, waiters poll (every
    /// `ttl/10`, at most 1 s, with jitter); see [Waiting](Redis#waiting).
    ///
    /// # Examples
    ///
    /// ```
    /// use lease::backend::Redis;
    /// use lease::deadpool_redis::{self, redis};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "redis://127.0.0.1:6379";
    /// let pool = deadpool_redis::Config::from_url(url)
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let backend = Redis::new(pool).with_pubsub(redis::Client::open(url)?);
    /// assert_eq!(backend.release_channel(), "lease:released");
    /// # Ok(()) }
    /// ```
    pub fn with_pubsub(self, client: ::redis::Client) -> Self {
        Self {
            pubsub: Some(Arc::new(client)),
            push: Arc::default(),
            ..self
        }
    }

    /// The channel the release script publishes each released lease's name
    /// on, and waiters subscribe to: `{prefix}released` (`lease:released`
    /// by default). Channels are not keys: it shares nothing with the keys
    /// of a lease named `released`.
    pub fn release_channel(&self) -> String {
        format!("{}released", self.prefix)
    }

    /// Speak the protocol of the Go `lock` package's `Redis` locker, so that
    /// Go replicas and Rust replicas of one job exclude each other on one
    /// Redis while a service migrates: use the Go services' key prefix
    /// ([`with_prefix`](Redis::with_prefix)) too.
    ///
    /// - The lock of `name` is the key `{prefix}{name}`, exactly
    ///   ([`lock_key`](Redis::lock_key)): no braces, no escaping, no fence key.
    /// - Its value is a random token (128 bits, hex), new for every
    ///   acquisition; a free lock is taken with `SET key token NX PX ttl`.
    /// - Renew is `PEXPIRE` iff the key still holds the token, release `DEL`
    ///   iff it does (the Go locker's release), each one Lua script; the
    ///   release also publishes the name for waiters ([Waiting](Redis#waiting)),
    ///   which the Go locker's does not (Rust waiters poll for those).
    /// - [`inspect`](Backend::inspect) cannot say who holds a lock (its value
    ///   is a random token) unless it is this backend value's own.
    /// - **No fencing token**: grants carry `None`
    ///   ([`LeaseGuard::fencing_token`](crate::LeaseGuard::fencing_token)).
    ///
    /// Renewals and releases get no token from the engine (the grant had
    /// none): the backend keeps the token of each live acquisition in
    /// memory, by (name, holder), shared by its clones, and forgets it when
    /// the lease is released or found lost. A backend value that did not
    /// acquire a lease (another process, a new value) cannot renew or
    /// release it: it is lost, or ends at its ttl. An idempotent re-acquire
    /// of a live lease by the same holder (through this backend) replaces
    /// its token with a new one, so that a late release of the older
    /// acquisition deletes nothing.
    ///
    /// The default layout (with fencing tokens, [Keys](Redis#keys)) stays
    /// the default; every Rust replica of a job must use the same one. Switch
    /// back to it only once no Go replica takes the job's lock any more (and
    /// then on every Rust replica at once: the two layouts use different
    /// keys, so they do not exclude each other).
    ///
    /// # Examples
    ///
    /// ```
    /// # fn pool() -> lease::deadpool_redis::Pool {
    /// #     lease::deadpool_redis::Config::from_url("redis://127.0.0.1:1")
    /// #         .create_pool(Some(lease::deadpool_redis::Runtime::Tokio1)).unwrap()
    /// # }
    /// use lease::backend::Redis;
    ///
    /// # fn main() -> Result<(), lease::Error> {
    /// let redis = Redis::new(pool()).with_prefix("lock:")?.with_go_locker_protocol();
    /// assert_eq!(redis.lock_key("nightly-report"), "lock:nightly-report");
    /// # Ok(()) }
    /// ```
    pub fn with_go_locker_protocol(self) -> Self {
        Self {
            tokens: Some(Arc::default()),
            ..self
        }
    }

    /// Use `prefix` in front of every key (default `lease:`); may be empty.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPrefix`] if `prefix` is longer than 64 bytes or
    /// contains `{` or `}` (braces would change the keys' hash tag).
    pub fn with_prefix(self, prefix: impl Into<String>) -> Result<Self, Error> {
        let prefix: String = prefix.into();
        if prefix.len() > Self::MAX_PREFIX_LEN || prefix.contains(['{', '}']) {
            return Err(Error::InvalidPrefix {
                len: prefix.len(),
                prefix,
            });
        }
        Ok(Self {
            prefix: prefix.into(),
            push: Arc::default(),
            ..self
        })
    }

    /// Give every Redis call (getting a connection, the command, and its one
    /// retry on a new connection together) at most `timeout` (default 5 s);
    /// a call that takes longer fails with [`Error::Timeout`], and its
    /// connection is retired (see [Connection](Redis#connection)). The
    /// connection's own response timeout (redis' default: 500 ms) bounds
    /// each request within it, and the engine applies its own, often
    /// shorter, limits on top (a renewal gets at most `ttl/3`). A zero
    /// timeout makes every call fail.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The timeout of each Redis call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The Redis key of the lock of `name`: `{prefix}{{esc(name)}}` (see
    /// [Keys](Redis#keys)); in the [Go locker's
    /// protocol](Redis::with_go_locker_protocol), `{prefix}{name}`.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn pool() -> lease::deadpool_redis::Pool {
    /// #     lease::deadpool_redis::Config::from_url("redis://127.0.0.1:1")
    /// #         .create_pool(Some(lease::deadpool_redis::Runtime::Tokio1)).unwrap()
    /// # }
    /// use lease::backend::Redis;
    ///
    /// let redis = Redis::new(pool());
    /// assert_eq!(redis.lock_key("report"), "lease:{report}");
    /// assert_eq!(redis.fence_key("report"), "lease:{report}:fence");
    /// assert_eq!(redis.lock_key("50% {off}"), "lease:{50%25 %7Boff%7D}");
    /// ```
    pub fn lock_key(&self, name: &str) -> String {
        if self.tokens.is_some() {
            return format!("{}{name}", self.prefix);
        }
        let mut key = String::with_capacity(self.prefix.len() + name.len() + 2);
        key.push_str(&self.prefix);
        key.push('{');
        for c in name.chars() {
            match c {
                '%' => key.push_str("%25"),
                '{' => key.push_str("%7B"),
                '}' => key.push_str("%7D"),
                c => key.push(c),
            }
        }
        key.push('}');
        key
    }

    /// The Redis Cluster hash slot of the lease `name`'s keys (its lock
    /// and fence keys share one): where a cluster keeps it, and how
    /// `renew_many` groups a batch.
    pub fn hash_slot(&self, name: &str) -> u16 {
        hash_slot(&self.lock_key(name))
    }

    /// The Redis key of the fencing counter of `name`: the lock key followed
    /// by `:fence` (the [Go locker's protocol](Redis::with_go_locker_protocol)
    /// has none, and never uses it).
    pub fn fence_key(&self, name: &str) -> String {
        self.lock_key(name) + ":fence"
    }

    /// The tokens of the live acquisitions, in the Go locker's protocol.
    fn tokens(&self) -> Option<MutexGuard<'_, Tokens>> {
        // Every update is a single insert or remove: a poisoned lock is consistent.
        self.tokens
            .as_ref()
            .map(|t| t.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Forget the token of `(name, holder)` if it is still `token` (a newer
    /// acquisition's is kept).
    fn forget(&self, name: &str, holder: &str, token: &str) {
        if let Some(mut tokens) = self.tokens() {
            let key = (name.to_owned(), holder.to_owned());
            if tokens.get(&key).is_some_and(|t| t == token) {
                tokens.remove(&key);
            }
        }
    }

    /// The value of the lock key while `lease` holds it: `{fence}:{holder}`
    /// in the default layout, the acquisition's token in the Go locker's
    /// protocol; `None` when there is none (it cannot be ours).
    fn lock_value(&self, lease: Acquisition<'_>) -> Option<String> {
        match self.tokens() {
            Some(tokens) => tokens
                .get(&(lease.name.to_owned(), lease.holder.to_owned()))
                .cloned(),
            None => Some(format!("{}:{}", lease.fencing_token?, lease.holder)),
        }
    }

    /// Acquire in the Go locker's protocol: [`GO_ACQUIRE`] with our current
    /// token, if any, and a new one.
    async fn go_acquire(&self, name: &str, holder: &str, ttl_ms: u32) -> Result<Option<Grant>> {
        let key = (name.to_owned(), holder.to_owned());
        let current = self.tokens().and_then(|t| t.get(&key).cloned());
        let token = new_token();
        let mut call = SCRIPTS.go_acquire.key(self.lock_key(name));
        call.arg(current.as_deref().unwrap_or(""))
            .arg(&token)
            .arg(ttl_ms);
        let [acquired] = self.run::<i64>("acquire", &[call]).await?[..] else {
            return Err(Error::Protocol(
                "the acquire script answered no value".to_owned(),
            ));
        };
        if acquired == 1 {
            if let Some(mut tokens) = self.tokens() {
                tokens.insert(key, token);
            }
            Ok(Some(Grant::new(None)))
        } else {
            if let Some(current) = current {
                self.forget(name, holder, &current);
            }
            Ok(None)
        }
    }

    /// The backend's connection; if there is none, one taken out of the
    /// pool for good (by one caller at a time: the others wait for it).
    async fn connection(&self) -> Result<Arc<Conn>, Error> {
        if let Some(conn) = self.cached().clone() {
            return Ok(conn);
        }
        let _opening = self.conn.opening.lock().await;
        if let Some(conn) = self.cached().clone() {
            // Another call took one while this one waited.
            return Ok(conn);
        }
        let conn = Arc::new(match &self.source {
            // Out of the pool: no other user of the pool sends anything on it.
            Origin::Pool(pool) => Conn::Single(deadpool_redis::Connection::take(pool.get().await?)),
            Origin::Client(client) => {
                Conn::Single(client.get_multiplexed_async_connection().await?)
            }
            #[cfg(feature = "redis-cluster")]
            Origin::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
        });
        *self.cached() = Some(conn.clone());
        Ok(conn)
    }

    fn cached(&self) -> MutexGuard<'_, Option<Arc<Conn>>> {
        // Every update is a single assignment: a poisoned lock is consistent.
        self.conn.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Never hand out `conn` again; nothing if it was retired already (a
    /// newer connection is not touched). It closes once the requests still
    /// in flight on it are done.
    fn retire(&self, conn: &Arc<Conn>) {
        let mut cached = self.cached();
        if cached.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *cached = None;
            drop(cached);
            tracing::debug!("redis connection retired; the next call takes a new one");
        }
    }

    /// Run `calls` concurrently on the backend's connection (they are
    /// pipelined on it), within the timeout. A request that ends without
    /// its answer — an error on the connection, a timeout, or dropped by
    /// the caller's time limit — retires the connection ([`InFlight`]); on
    /// an error, the whole batch is retried once on a new connection: every
    /// script is idempotent.
    async fn run<T>(
        &self,
        operation: &'static str,
        calls: &[ScriptInvocation<'static>],
    ) -> Result<Vec<T>, Error>
    where
        T: ::redis::FromRedisValue + Send,
    {
        let attempt = async {
            let mut retried = false;
            loop {
                let conn = self.connection().await?;
                let results = join_all(calls.iter().map(|call| {
                    let mut c = (*conn).clone();
                    let request = InFlight {
                        redis: self,
                        conn: conn.clone(),
                        answered: false,
                    };
                    async move {
                        let result = call.invoke_async::<T>(&mut c).await;
                        let outcome = request.finish(&result);
                        (result, outcome)
                    }
                }))
                .await;
                let failed = results
                    .iter()
                    .any(|(_, outcome)| *outcome == Ended::ConnectionFailed);
                match results
                    .into_iter()
                    .map(|(result, _)| result)
                    .collect::<Result<Vec<T>, RedisError>>()
                {
                    Ok(values) => return Ok(values),
                    Err(e) if failed && !retried => {
                        retried = true;
                        tracing::debug!(operation, error = %e, "redis connection lost; retrying on another");
                    }
                    Err(e) => return Err(Error::Redis(e)),
                }
            }
        };
        // On a timeout, the requests in flight are dropped unanswered: the
        // connection is retired, and the next call takes a new one.
        tokio::time::timeout(self.timeout, attempt)
            .await
            .unwrap_or(Err(Error::Timeout {
                operation,
                after: self.timeout,
            }))
    }

    /// The [`INSPECT`] script for `name`.
    fn inspect_call(&self, name: &str) -> ScriptInvocation<'static> {
        let mut call = SCRIPTS.inspect.key(self.lock_key(name));
        if self.tokens.is_none() {
            call.key(self.fence_key(name));
        }
        call
    }

    /// What [`INSPECT`]'s answer says about `name` (see [`Backend::inspect`]).
    fn lease_info(&self, name: &str, answer: &InspectAnswer) -> Option<LeaseInfo> {
        let (value, pttl, counter) = answer;
        let expires_in = match *pttl {
            ms if ms > 0 => Some(Duration::from_millis(ms.unsigned_abs())),
            // A lock without expiry (not one of ours): held until deleted.
            -1 => Some(Duration::MAX),
            _ => None,
        };
        match (value, self.tokens()) {
            (Some(token), Some(tokens)) => {
                let holder = tokens
                    .iter()
                    .find(|((n, _), t)| n == name && *t == token)
                    .map(|((_, holder), _)| holder.clone())
                    .unwrap_or_default();
                Some(LeaseInfo::new(name, holder, expires_in, None))
            }
            (None, Some(_)) => None,
            (Some(value), None) => {
                let (fence, holder) = match value.split_once(':') {
                    Some((fence, holder)) => (fence.parse::<u64>().ok(), holder),
                    None => (None, value.as_str()),
                };
                Some(LeaseInfo::new(name, holder, expires_in, fence))
            }
            (None, None) => counter.as_deref().map(|counter| {
                let fence = counter.parse::<u64>().ok().filter(|&f| f > 0);
                LeaseInfo::new(name, "", None, fence)
            }),
        }
    }

    /// The `MATCH` pattern of the keys under the prefix: the prefix with
    /// the glob's special characters escaped, then `{*` in the default
    /// layout (lock and fence keys), `*` in the Go locker's protocol.
    fn scan_pattern(&self) -> String {
        let mut pattern = String::with_capacity(self.prefix.len() + 2);
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str(if self.tokens.is_some() { "*" } else { "{*" });
        pattern
    }

    /// The lease name of a key found under the prefix: in the default
    /// layout the part between the braces of a lock key (`{prefix}{..}`)
    /// or a fence key (`{prefix}{..}:fence`), unescaped; in the Go
    /// locker's protocol the key without the prefix. `None` for any other key.
    fn name_of_key(&self, key: &[u8]) -> Option<String> {
        let rest = key.strip_prefix(self.prefix.as_bytes())?;
        let rest = std::str::from_utf8(rest).ok()?;
        if self.tokens.is_some() {
            return (!rest.is_empty()).then(|| rest.to_owned());
        }
        let inner = rest.strip_prefix('{')?;
        let (escaped, tail) = inner.split_once('}')?;
        if !(tail.is_empty() || tail == ":fence") || escaped.is_empty() {
            return None;
        }
        let name = escaped
            .replace("%7D", "}")
            .replace("%7B", "{")
            .replace("%25", "%");
        // Only a key this layout would write for that name.
        (self.lock_key(&name) == format!("{}{{{escaped}}}", self.prefix)).then_some(name)
    }

    /// The keys under `pattern` on every master of the cluster: `CLUSTER
    /// SLOTS` (on any node) names the masters, then each is scanned with
    /// `SCAN cursor MATCH pattern COUNT step` sent to it by address, one
    /// round trip per step. Bounded by the backend's timeout as a whole.
    #[cfg(feature = "redis-cluster")]
    async fn scan_masters(&self, pattern: &str, step: u32) -> Result<Vec<Vec<Vec<u8>>>, Error> {
        use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let scan = async {
            let conn = self.connection().await?;
            let Conn::Cluster(c) = &*conn else {
                return Err(Error::Protocol("not a cluster connection".to_owned()));
            };
            let mut c = c.clone();
            let slots = self
                .route(
                    &conn,
                    &mut c,
                    ::redis::cmd("CLUSTER").arg("SLOTS").clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                )
                .await?;
            // Each range: start, end, then the master `[ip, port, id, ..]`
            // and its replicas.
            let ranges: Vec<Vec<::redis::Value>> =
                ::redis::from_redis_value(slots).map_err(RedisError::from)?;
            let mut masters: Vec<(String, u16)> = Vec::new();
            for range in &ranges {
                let Some(master) = range.get(2) else { continue };
                let master: Vec<::redis::Value> =
                    ::redis::from_redis_value_ref(master).map_err(RedisError::from)?;
                let (Some(host), Some(port)) = (master.first(), master.get(1)) else {
                    continue;
                };
                let host: String = ::redis::from_redis_value_ref(host).map_err(RedisError::from)?;
                let port: u16 = ::redis::from_redis_value_ref(port).map_err(RedisError::from)?;
                if !masters.iter().any(|m| m.0 == host && m.1 == port) {
                    masters.push((host, port));
                }
            }
            let mut keys = Vec::new();
            for (host, port) in masters {
                let mut cursor = "0".to_owned();
                loop {
                    let mut cmd = ::redis::cmd("SCAN");
                    cmd.arg(&cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(step);
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    });
                    let (next, found): (String, Vec<Vec<u8>>) =
                        ::redis::from_redis_value(self.route(&conn, &mut c, cmd, routing).await?)
                            .map_err(RedisError::from)?;
                    keys.push(found);
                    if next == "0" {
                        break;
                    }
                    cursor = next;
                }
            }
            Ok(keys)
        };
        tokio::time::timeout(self.timeout, scan)
            .await
            .unwrap_or(Err(Error::Timeout {
                operation: "list",
                after: self.timeout,
            }))
    }

    /// One command sent where `routing` says on the cluster connection
    /// `c` (a clone of `conn`); `conn` is retired if it ends unanswered.
    #[cfg(feature = "redis-cluster")]
    async fn route(
        &self,
        conn: &Arc<Conn>,
        c: &mut ::redis::cluster_async::ClusterConnection,
        cmd: ::redis::Cmd,
        routing: ::redis::cluster_routing::RoutingInfo,
    ) -> Result<::redis::Value, Error> {
        let in_flight = InFlight {
            redis: self,
            conn: conn.clone(),
            answered: false,
        };
        let result = c.route_command(cmd, routing).await;
        in_flight.finish(&result);
        Ok(result?)
    }

    /// The renewal of `lease` for `ttl_ms`, or `None` if it has no fencing
    /// token (every grant of this backend has one, so it cannot be ours).
    fn renew_call(&self, lease: Acquisition<'_>, ttl_ms: u32) -> Option<ScriptInvocation<'static>> {
        let mut call = SCRIPTS.renew.key(self.lock_key(lease.name));
        call.arg(self.lock_value(lease)?).arg(ttl_ms);
        Some(call)
    }
}

/// A new random token for the Go locker's protocol: 128 bits, as 32 hex
/// digits. `RandomState` is seeded from the OS's randomness and differs for
/// every instance; the counter and the clock make each pair of hashes unique.
fn new_token() -> String {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = (
        COUNTER.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now(),
        std::process::id(),
    );
    let (a, b) = (
        RandomState::new().hash_one(seed),
        RandomState::new().hash_one(seed),
    );
    format!("{a:016x}{b:016x}")
}

/// How often an idle subscription is checked with `PING`: a connection
/// that died silently (a half-open socket) is replaced within this and the
/// backend's timeout, instead of when TCP gives up.
const PING_EVERY: Duration = Duration::from_secs(30);

/// Redis pub/sub as a [`Source`] of releases: a connection of its own,
/// opened from the client given to [`Redis::with_pubsub`].
struct RedisSource {
    client: ::redis::Client,
    channel: String,
    timeout: Duration,
}

/// A subscribed pub/sub connection.
struct Subscribed {
    sink: PubSubSink,
    stream: PubSubStream,
    ping: tokio::time::Interval,
    timeout: Duration,
}

impl Source for RedisSource {
    type Subscription = Subscribed;
    const WHAT: &'static str = "redis SUBSCRIBE";

    async fn subscribe(&self) -> Result<Subscribed, Error> {
        let subscribe = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.subscribe(&self.channel).await?;
            Ok::<_, RedisError>(pubsub)
        };
        let pubsub = tokio::time::timeout(self.timeout, subscribe)
            .await
            .map_err(|_| Error::Timeout {
                operation: "subscribe",
                after: self.timeout,
            })??;
        let (sink, stream) = pubsub.split();
        let start = tokio::time::Instant::now() + PING_EVERY;
        let mut ping = tokio::time::interval_at(start, PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Subscribed {
            sink,
            stream,
            ping,
            timeout: self.timeout,
        })
    }

    async fn next(s: &mut Subscribed) -> Event {
        loop {
            tokio::select! {
                message = s.stream.next() => match message {
                    Some(message) => {
                        if let Ok(name) = message.get_payload::<String>() {
                            return Event::Released(name);
                        }
                    }
                    // The connection closed (`CLIENT KILL`, a restart, a reset).
                    None => return Event::Lost("the connection closed".to_owned()),
                },
                _ = s.ping.tick() => {
                    match tokio::time::timeout(s.timeout, s.sink.ping::<::redis::Value>()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Event::Lost(format!("PING failed: {e}")),
                        Err(_) => {
                            return Event::Lost(format!("no answer to PING within {:?}", s.timeout));
                        }
                    }
                }
            }
        }
    }
}

impl Backend for Redis {
    /// One script: if the lock is free, `INCR fence` and `SET lock
    /// "{fence}:{holder}" PX ttl`; if it already holds `holder`, `PEXPIRE`
    /// and its fence.
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        let ttl_ms = validate::call(name, holder, ttl)?;
        if self.tokens.is_some() {
            return self.go_acquire(name, holder, ttl_ms).await;
        }
        let mut call = SCRIPTS.acquire.key(self.lock_key(name));
        call.key(self.fence_key(name)).arg(holder).arg(ttl_ms);
        let [fence] = self.run::<i64>("acquire", &[call]).await?[..] else {
            return Err(Error::Protocol(
                "the acquire script answered no value".to_owned(),
            ));
        };
        match fence {
            0 => Ok(None),
            f if f > 0 => Ok(Some(Grant::new(Some(f.unsigned_abs())))),
            f => Err(Error::Protocol(format!(
                "the acquire script answered the fencing token {f}"
            ))),
        }
    }

    /// `PEXPIRE lock ttl` iff the lock still holds this acquisition.
    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        let ttl_ms = validate::call(lease.name, lease.holder, ttl)?;
        let Some(value) = self.lock_value(lease) else {
            return Ok(false);
        };
        let mut call = SCRIPTS.renew.key(self.lock_key(lease.name));
        call.arg(&value).arg(ttl_ms);
        let renewed = self.run::<i64>("renew", &[call]).await?.first() == Some(&1);
        if !renewed {
            self.forget(lease.name, lease.holder, &value);
        }
        Ok(renewed)
    }

    /// `DEL lock` iff the lock still holds this acquisition. The fence key stays.
    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        let Some(value) = self.lock_value(lease) else {
            return Ok(());
        };
        let mut call = SCRIPTS.release.key(self.lock_key(lease.name));
        call.arg(&value).arg(self.release_channel()).arg(lease.name);
        self.run::<i64>("release", &[call]).await?;
        // Deleted, or no longer ours: either way this acquisition is over.
        // (After an error it is kept: a re-acquire replaces it anyway.)
        self.forget(lease.name, lease.holder, &value);
        Ok(())
    }

    /// One script (one round trip): `GET` and `PTTL` of the lock key, and in
    /// the default layout `GET` of the fence key. The time left is Redis'
    /// own `PTTL`.
    ///
    /// - **Default layout**: a live lock's value is `{fence}:{holder}`, so
    ///   `holder`, `fencing_token` and `expires_in` are all known. A lock
    ///   that was released or expired is deleted (by this backend or by
    ///   Redis), and only the fence key is left: the answer then has
    ///   `expires_in: None`, the last fencing token, and an **empty**
    ///   `holder` (Redis keeps no trace of it). `Ok(None)` when neither key
    ///   exists: never acquired (or the keys were lost).
    /// - **Go locker's protocol**: the value is a random token, which says
    ///   nothing about who took it. A live lock answers its time left, no
    ///   fencing token, and as `holder` the holder of this backend value's
    ///   own acquisition with that token if there is one, otherwise an
    ///   empty string (a Go replica, another process). A lock that was
    ///   released or expired leaves nothing: `Ok(None)`.
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        validate::name(name)?;
        let [answer] = &self
            .run::<InspectAnswer>("inspect", &[self.inspect_call(name)])
            .await?[..]
        else {
            return Err(Error::Protocol(
                "the inspect script answered no value".to_owned(),
            ));
        };
        Ok(self.lease_info(name, answer))
    }

    /// Every lease under the prefix: the names found by `SCAN` (never
    /// `KEYS`) with `MATCH` on the prefix, a step of up to 1,000 keys per
    /// round trip, then each as [`inspect`](Backend::inspect) answers it
    /// (its scripts sent together, pipelined), in the order `SCAN` found
    /// them. On a Redis Cluster (`Redis::cluster`) every master is scanned
    /// in turn (the masters of `CLUSTER SLOTS`), since each holds the keys
    /// of its own slots only; a lease whose slot moves to another master
    /// during the scan (a failover, a resharding) may be missed.
    ///
    /// - **Default layout**: the lock keys and the fence keys under the
    ///   prefix ([Keys](Redis#keys)) name the leases, so a name once
    ///   acquired is listed as long as its fence key lives, held or not
    ///   (released ones with an empty `holder`, as `inspect` answers).
    /// - **Go locker's protocol**: every key under the prefix is taken for
    ///   a lock (the protocol's keys are `{prefix}{name}`, nothing marks
    ///   them), so give it a prefix of its own; only live locks exist.
    ///
    /// `SCAN` may return a key twice (names are listed once) and misses no
    /// key that lived through the whole scan; a lease taken or released
    /// during it may or may not be listed.
    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        const STEP: u32 = 1000;
        let pattern = self.scan_pattern();
        let mut names: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut found = |keys: &[Vec<u8>]| {
            for key in keys {
                if let Some(name) = self.name_of_key(key)
                    && seen.insert(name.clone())
                {
                    names.push(name);
                }
            }
        };
        #[cfg(feature = "redis-cluster")]
        if self.is_cluster() {
            // A script without keys runs on one node: scan every master.
            for keys in self.scan_masters(&pattern, STEP).await? {
                found(&keys);
            }
        }
        let mut cursor = "0".to_owned();
        while !self.is_cluster() {
            let mut call = SCRIPTS.scan.prepare_invoke();
            call.arg(&cursor).arg(&pattern).arg(STEP);
            let [(next, keys)] = &self.run::<(String, Vec<Vec<u8>>)>("list", &[call]).await?[..]
            else {
                return Err(Error::Protocol(
                    "the scan script answered no value".to_owned(),
                ));
            };
            found(keys);
            if next == "0" {
                break;
            }
            cursor = next.clone();
        }
        let mut leases = Vec::with_capacity(names.len());
        for chunk in names.chunks(RENEW_MANY_CHUNK) {
            let calls: Vec<_> = chunk.iter().map(|name| self.inspect_call(name)).collect();
            let answers = self.run::<InspectAnswer>("list", &calls).await?;
            leases.extend(
                chunk
                    .iter()
                    .zip(&answers)
                    .filter_map(|(name, answer)| self.lease_info(name, answer)),
            );
        }
        Ok(leases)
    }

    /// One script: `DEL` of the lock key, whoever holds it, and the
    /// release's `PUBLISH` if it existed. The fence key stays, so the next
    /// acquisition gets a larger fencing token; the evicted holder's next
    /// renewal finds no lock and reports the lease lost. In the Go
    /// locker's protocol, the same `DEL` of `{prefix}{name}`.
    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        let mut call = SCRIPTS.force_release.key(self.lock_key(name));
        call.arg(self.release_channel()).arg(name);
        let deleted = self.run::<i64>("force_release", &[call]).await?;
        Ok(deleted.first() == Some(&1))
    }

    /// With [`with_pubsub`](Redis::with_pubsub): the release script's
    /// `PUBLISH`, about one round trip after the release; otherwise, and
    /// while the subscription is down, `poll`. See [Waiting](Redis#waiting).
    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        let push = self.pubsub.as_ref().map(|client| {
            self.push.get_or_init(|| {
                Push::new(RedisSource {
                    client: (**client).clone(),
                    channel: self.release_channel(),
                    timeout: self.timeout,
                })
            })
        });
        let waiting = push.map(|push| push.released(name.to_owned(), poll));
        let polling = waiting.is_none().then(|| tokio::time::sleep(poll));
        async move {
            match (waiting, polling) {
                (Some(waiting), _) => waiting.await,
                (None, Some(polling)) => polling.await,
                (None, None) => {}
            }
        }
    }

    /// One script over all the keys (per 1,000), which answers for each
    /// lease; on a cluster proxy that refuses a script over keys of several
    /// hash slots (`CROSSSLOT`), one script per key, pipelined.
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        // Leases without a fencing token cannot be ours: answered `false`
        // without asking.
        let mut ours: Vec<(usize, String, u32)> = Vec::with_capacity(leases.len());
        for (i, &(lease, ttl)) in leases.iter().enumerate() {
            let ttl_ms = validate::call(lease.name, lease.holder, ttl)?;
            if let Some(value) = self.lock_value(lease) {
                ours.push((i, value, ttl_ms));
            }
        }
        let mut out = vec![false; leases.len()];
        // On a cluster, one script per hash slot (a script's keys must share
        // one); elsewhere one script for all. `order`: the leases of `ours`
        // in the order of the scripts' keys.
        let keys: Vec<String> = ours
            .iter()
            .map(|(i, _, _)| self.lock_key(leases[*i].0.name))
            .collect();
        let slots: Vec<u16> = if self.is_cluster() {
            keys.iter().map(|k| hash_slot(k)).collect()
        } else {
            vec![0; keys.len()]
        };
        let mut order: Vec<usize> = (0..ours.len()).collect();
        order.sort_by_key(|&k| slots[k]);
        let mut calls = Vec::new();
        let mut group = (u16::MAX, 0);
        for &k in &order {
            let (_, value, ttl) = &ours[k];
            if calls.is_empty() || group.0 != slots[k] || group.1 == RENEW_MANY_CHUNK {
                calls.push(SCRIPTS.renew_many.prepare_invoke());
                group = (slots[k], 0);
            }
            group.1 += 1;
            calls
                .last_mut()
                .expect("BUG: a call was pushed")
                .key(&keys[k])
                .arg(value)
                .arg(*ttl);
        }
        let renewed: Vec<i64> = match self.run::<Vec<i64>>("renew", &calls).await {
            Ok(renewed) => {
                let in_order: Vec<i64> = renewed.into_iter().flatten().collect();
                if in_order.len() != ours.len() {
                    return Err(Error::Protocol(format!(
                        "the renew script answered {} results for {} leases",
                        in_order.len(),
                        ours.len()
                    )));
                }
                let mut renewed = vec![0; ours.len()];
                for (k, r) in order.iter().zip(in_order) {
                    renewed[*k] = r;
                }
                renewed
            }
            Err(Error::Redis(e)) if e.code() == Some("CROSSSLOT") => {
                let calls: Vec<_> = ours
                    .iter()
                    .filter_map(|&(i, _, ttl)| self.renew_call(leases[i].0, ttl))
                    .collect();
                self.run::<i64>("renew", &calls).await?
            }
            Err(e) => return Err(e),
        };
        if renewed.len() != ours.len() {
            return Err(Error::Protocol(format!(
                "the renew script answered {} results for {} leases",
                renewed.len(),
                ours.len()
            )));
        }
        for ((i, value, _), r) in ours.iter().zip(renewed) {
            out[*i] = r == 1;
            if r != 1 {
                self.forget(leases[*i].0.name, leases[*i].0.holder, value);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    #[test]
    fn hash_slots_are_redis_clusters() {
        assert_eq!(hash_slot("123456789"), 0x31C3); // CRC16-XMODEM check value
        assert_eq!(hash_slot("foo"), 12182);
        assert_eq!(hash_slot("{user1000}.following"), hash_slot("user1000"));
        assert_eq!(
            hash_slot("lease:{report}"),
            hash_slot("lease:{report}:fence")
        );
    }

    /// A pool that is never connected (creating one needs no server).
    fn backend() -> Redis {
        let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("pool");
        Redis::new(pool)
    }

    #[test]
    fn prefix_rules() {
        assert_eq!(backend().prefix(), "lease:");
        assert_eq!(
            backend()
                .with_prefix("")
                .expect("empty is fine")
                .lock_key("n"),
            "{n}"
        );
        let longest = "p".repeat(Redis::MAX_PREFIX_LEN);
        assert!(backend().with_prefix(longest.clone()).is_ok());
        for bad in [
            format!("{longest}p"),
            "a{".to_owned(),
            "}".to_owned(),
            "x{y}z".to_owned(),
        ] {
            match backend().with_prefix(bad.clone()) {
                Err(Error::InvalidPrefix { len, prefix }) => {
                    assert_eq!((len, prefix.as_str()), (bad.len(), bad.as_str()));
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn keys_are_distinct_and_share_a_hash_tag() {
        let redis = backend().with_prefix("p:").expect("valid");
        let names = [
            "a", "a}", "a}:fence", "a:fence", "{a}", "}x", "{", "}", "%", "%25", "%7B", "%7D",
            "%%", "{}", "🦀", "a b", "'\"",
        ];
        let mut keys = HashSet::new();
        for name in names {
            let (lock, fence) = (redis.lock_key(name), redis.fence_key(name));
            // The hash tag is everything between the prefix's `{` and the last `}`.
            let inner = &lock["p:{".len()..lock.len() - 1];
            assert!(!inner.contains(['{', '}']), "{name:?} -> {lock}");
            assert!(lock.starts_with("p:{") && lock.ends_with('}'), "{lock}");
            assert_eq!(fence, format!("{lock}:fence"));
            assert!(keys.insert(lock) && keys.insert(fence), "{name:?} collides");
        }
        assert_eq!(redis.lock_key("%{}"), "p:{%25%7B%7D}");
    }

    #[test]
    fn go_locker_keys_are_the_prefix_and_the_name() {
        let redis = backend()
            .with_prefix("lock:")
            .expect("valid")
            .with_go_locker_protocol();
        assert_eq!(redis.lock_key("report"), "lock:report");
        assert_eq!(redis.lock_key("50% {off}"), "lock:50% {off}");
        assert_eq!(
            backend().with_go_locker_protocol().lock_key("a{b}"),
            "lease:a{b}"
        );
        // Nothing to renew or release without a token of this backend.
        assert_eq!(
            redis.lock_value(Acquisition::new("report", "pod", None)),
            None
        );
        assert_eq!(
            redis.lock_value(Acquisition::new("report", "pod", Some(3))),
            None
        );
        assert_eq!(
            backend()
                .lock_value(Acquisition::new("report", "pod", Some(3)))
                .as_deref(),
            Some("3:pod")
        );
    }

    #[test]
    fn tokens_are_random_and_distinct() {
        let tokens: HashSet<String> = (0..1000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 1000);
        for token in &tokens {
            assert_eq!(token.len(), 32);
            assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
        }
    }

    #[test]
    fn which_errors_retire_the_connection() {
        use std::io;
        let io = |kind: io::ErrorKind| RedisError::from(io::Error::from(kind));
        let reply = |bytes: &[u8]| {
            ::redis::parse_redis_value(bytes)
                .expect("a reply")
                .extract_error()
                .expect_err("an error reply")
        };
        // Nothing came back, or the connection is gone or leads to a replica.
        for e in [
            io(io::ErrorKind::TimedOut),
            io(io::ErrorKind::ConnectionReset),
            io(io::ErrorKind::BrokenPipe),
            io(io::ErrorKind::UnexpectedEof),
            reply(b"-READONLY You can't write against a read only replica.\r\n"),
        ] {
            assert!(connection_failed(&e), "{e}");
        }
        // The server answered: the connection works.
        for e in [
            reply(b"-ERR something\r\n"),
            reply(b"-NOSCRIPT No matching script\r\n"),
            reply(b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"),
            reply(b"-BUSY Redis is busy running a script\r\n"),
            RedisError::from((::redis::ErrorKind::UnexpectedReturnType, "not an integer")),
        ] {
            assert!(!connection_failed(&e), "{e}");
        }
    }
}
