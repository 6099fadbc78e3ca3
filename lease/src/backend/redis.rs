//! [`Redis`]: `SET NX PX` locks with token-checked Lua renew and release.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{RedisError, Script, ScriptInvocation};
use deadpool_redis::Pool;
use futures_util::future::join_all;

use crate::{Acquisition, Backend, Error, Grant};

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

/// Release. KEYS: lock. ARGV: the acquisition's lock value. Returns 1 if
/// deleted, 0 if the lock no longer holds that acquisition.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

struct Scripts {
    acquire: Script,
    renew: Script,
    renew_many: Script,
    release: Script,
}

/// Built once: `Script::new` hashes the source for `EVALSHA`.
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(ACQUIRE),
    renew: Script::new(RENEW),
    renew_many: Script::new(RENEW_MANY),
    release: Script::new(RELEASE),
});

/// Leases as Redis keys: `SET key holder NX PX ttl`, renewed and released
/// by Lua scripts that first check the key still holds our holder — the
/// backend of the Go `lock.Redis` this crate ports, plus fencing tokens.
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
/// # Calls
///
/// Each acquire, renew and release is one `EVALSHA` (via [`redis::Script`],
/// which loads the script on `NOSCRIPT`): one round trip. The renewals of
/// many leases of one holder ([`Backend::renew_many`]) are one `EVALSHA` of
/// a script over all their keys (up to 1,000 keys per call; larger batches
/// are split into several calls, sent together), which tells each lease
/// whether it was renewed. That script touches keys in many hash slots: on
/// a Redis Cluster proxy that rejects it with `CROSSSLOT`, the renewals are
/// sent one script per key instead, pipelined.
///
/// The backend takes one connection from the pool and keeps using it for
/// every call: a [`MultiplexedConnection`] pipelines concurrent requests,
/// and checking one out of the pool for each call would cost a round trip
/// of its own (deadpool-redis checks a connection with `PING` each time it
/// hands it out). Each call is bounded by the backend's
/// [timeout](Redis::with_timeout) (default 5 s) — getting a connection
/// included — after which it fails with [`Error::Timeout`]. If the
/// connection turns out to be dead (the server restarted, `CLIENT KILL`, a
/// proxy closed it), it is dropped and the call is retried once at once on
/// another connection from the pool, within the same timeout: all the
/// scripts are idempotent. Renewals that fail anyway are retried by the
/// engine until the lease's local deadline, so a connection killed while a
/// lease is held does not lose the lease.
///
/// A call therefore costs one round trip (plus `SCRIPT LOAD` the first time
/// on a server), and a renewal must answer within `ttl/3`: choose a ttl well
/// above three times the worst round trip to Redis. (The fault suite's
/// results in `docs/RELIABILITY.md`, leases lost at a round trip of `ttl/6`,
/// were measured when every call still checked a connection out of the pool,
/// which deadpool-redis does with a `PING`: two round trips per call.)
///
/// When Redis is unreachable, [`Lease::try_acquire`](crate::Lease::try_acquire)
/// returns `Err` within this timeout or the engine's acquire limit
/// (`min(ttl - margin, 30 s)`), whichever is shorter — at once for a refused
/// connection — and never hangs; [`Lease::with_lease`](crate::Lease::with_lease)
/// returns `Skipped(Skip::Error(_))` (the next tick tries again).
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
    pool: Pool,
    prefix: Arc<str>,
    timeout: Duration,
    /// The connection every call uses, taken from `pool` on first use and
    /// again after it died. Shared by clones.
    conn: Arc<Mutex<Option<MultiplexedConnection>>>,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("pool", &self.pool.status())
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
        Self {
            pool,
            prefix: Self::DEFAULT_PREFIX.into(),
            timeout: Self::DEFAULT_TIMEOUT,
            conn: Arc::default(),
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
            ..self
        })
    }

    /// Give every Redis call (pool checkout and command together) at most
    /// `timeout` (default 5 s); a call that takes longer fails with
    /// [`Error::Timeout`]. The engine applies its own, often shorter,
    /// limits on top (a renewal gets at most `ttl/3`). A zero timeout makes
    /// every call fail.
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

    /// The Redis key of the lock of `name`: `{prefix}{{esc(name)}}` (see [Keys](Redis#keys)).
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

    /// The Redis key of the fencing counter of `name`: the lock key followed by `:fence`.
    pub fn fence_key(&self, name: &str) -> String {
        self.lock_key(name) + ":fence"
    }

    /// The shared connection, taken from the pool if there is none.
    async fn connection(&self) -> Result<MultiplexedConnection, Error> {
        if let Some(conn) = self.cached().clone() {
            return Ok(conn);
        }
        // The pooled object goes back to the pool at once; the clone shares
        // its socket.
        let conn = (*self.pool.get().await?).clone();
        Ok(self.cached().get_or_insert(conn).clone())
    }

    fn cached(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        // Every update is a single assignment: a poisoned lock is consistent.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `calls` concurrently on the shared connection (they are
    /// pipelined on it), within the timeout. A dead connection is dropped
    /// (the pool weeds out its own copy when it next hands it out) and the
    /// whole batch retried once on another: every script is idempotent.
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
                    let mut c = conn.clone();
                    async move { call.invoke_async::<T>(&mut c).await }
                }))
                .await;
                match results.into_iter().collect::<Result<Vec<T>, RedisError>>() {
                    Ok(values) => return Ok(values),
                    Err(e) if e.is_unrecoverable_error() => {
                        // Never use this connection again.
                        self.cached().take();
                        if retried {
                            return Err(Error::Redis(e));
                        }
                        retried = true;
                        tracing::debug!(operation, error = %e, "redis connection lost; retrying on another");
                    }
                    Err(e) => return Err(Error::Redis(e)),
                }
            }
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => {
                // A connection that leaves a call unanswered (a black hole, a
                // half-open socket) is not trusted again: the next call takes
                // a fresh one from the pool.
                self.cached().take();
                Err(Error::Timeout {
                    operation,
                    after: self.timeout,
                })
            }
        }
    }

    /// The renewal of `lease`, or `None` if it has no fencing token (every
    /// grant of this backend has one, so it cannot be ours).
    fn renew_call(
        &self,
        lease: Acquisition<'_>,
        ttl: Duration,
    ) -> Option<ScriptInvocation<'static>> {
        let mut call = SCRIPTS.renew.key(self.lock_key(lease.name));
        call.arg(lock_value(lease)?).arg(millis(ttl));
        Some(call)
    }
}

/// The value of the lock key while `lease` holds it: `{fence}:{holder}`.
fn lock_value(lease: Acquisition<'_>) -> Option<String> {
    Some(format!("{}:{}", lease.fencing_token?, lease.holder))
}

/// A ttl in whole milliseconds (the engine only passes whole milliseconds).
fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

impl Backend for Redis {
    /// One script: if the lock is free, `INCR fence` and `SET lock
    /// "{fence}:{holder}" PX ttl`; if it already holds `holder`, `PEXPIRE`
    /// and its fence.
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        let mut call = SCRIPTS.acquire.key(self.lock_key(name));
        call.key(self.fence_key(name)).arg(holder).arg(millis(ttl));
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
        let Some(call) = self.renew_call(lease, ttl) else {
            return Ok(false);
        };
        let renewed = self.run::<i64>("renew", &[call]).await?;
        Ok(renewed.first() == Some(&1))
    }

    /// `DEL lock` iff the lock still holds this acquisition. The fence key stays.
    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        let Some(value) = lock_value(lease) else {
            return Ok(());
        };
        let mut call = SCRIPTS.release.key(self.lock_key(lease.name));
        call.arg(value);
        self.run::<i64>("release", &[call]).await?;
        Ok(())
    }

    /// One script over all the keys (per 1,000), which answers for each
    /// lease; on a cluster proxy that refuses a script over keys of several
    /// hash slots (`CROSSSLOT`), one script per key, pipelined.
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        // Leases without a fencing token cannot be ours: answered `false`
        // without asking.
        let ours: Vec<(usize, String, Duration)> = leases
            .iter()
            .enumerate()
            .filter_map(|(i, &(lease, ttl))| Some((i, lock_value(lease)?, ttl)))
            .collect();
        let mut out = vec![false; leases.len()];
        let calls: Vec<_> = ours
            .chunks(RENEW_MANY_CHUNK)
            .map(|chunk| {
                let mut call = SCRIPTS.renew_many.prepare_invoke();
                for (i, value, ttl) in chunk {
                    call.key(self.lock_key(leases[*i].0.name))
                        .arg(value)
                        .arg(millis(*ttl));
                }
                call
            })
            .collect();
        let renewed: Vec<i64> = match self.run::<Vec<i64>>("renew", &calls).await {
            Ok(renewed) => renewed.into_iter().flatten().collect(),
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
        for ((i, _, _), r) in ours.iter().zip(renewed) {
            out[*i] = r == 1;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

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
    fn ttls_are_whole_milliseconds() {
        assert_eq!(millis(Duration::from_millis(10)), 10);
        assert_eq!(millis(Duration::from_secs(86_400)), 86_400_000);
    }
}
