//! [`Redis`]: `SET NX PX` locks with token-checked Lua renew and release.
//!
//! `scripts.rs` holds the Lua, `protocol.rs` the two lock layouts (fenced,
//! Go locker's), `connection.rs` the backend's one connection; this file
//! the public type, the `Backend` calls, and the pub/sub source of releases.

mod connection;
mod protocol;
mod scripts;
mod set_fenced;

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ::redis::RedisError;
use ::redis::aio::{PubSubSink, PubSubStream};
use deadpool_redis::Pool;
use futures_util::StreamExt;
use futures_util::future::Either;

use self::connection::{RedisLink, RedisOrigin};
use self::protocol::{GoTokens, LockProtocol, RedisInspectAnswer};
use self::scripts::{SCRIPTS, hash_slot};
use crate::backend::push::{Event, Push, Source};
use crate::backend::{Acquired, MAX_BATCH, Request};
use crate::{Acquisition, Backend, Error, Grant, LeaseInfo, Result, validate};

/// Leases as Redis keys, with fencing tokens. Expiry follows the server's clock.
///
/// # Keys
///
/// The lease `name` has the lock key [`{prefix}{{esc(name)}}`](Redis::lock_key),
/// which holds `{fencing token}:{holder}` for the ttl, and the
/// [fence key](Redis::fence_key) `{lock key}:fence`: a counter without expiry
/// that every acquisition (not an idempotent re-acquire) increases. A name
/// may also have `{lock key}:slot`, the [`once_per`](crate::Job::once_per)
/// ledger (no expiry, never goes back), and `{lock key}:value`, the value its
/// holder [proclaims](crate::Election::proclaim). `esc` percent-encodes `%`,
/// `{` and `}`, so a name's keys share a Redis Cluster hash slot and no two
/// names share a key. Renew and release compare the whole value: a late
/// request of an older acquisition never touches a newer one. A fence key
/// lost while its lock lives is restored from the lock; lost while none
/// lives, tokens start again at 1.
/// [`with_go_locker_protocol`](Redis::with_go_locker_protocol) switches to
/// the Go `lock` package's keys. [`set_fenced`](Redis::set_fenced) guards
/// the application's own keys with the fencing tokens.
///
/// # Calls and time
///
/// Each call is one script, one round trip; [`Backend::renew_many`] is one
/// script per 1,000 keys (per hash slot on a cluster). The backend takes one
/// connection out of the pool for good, shared by its clones (the pool's
/// settings and hooks apply). A call gets at most the backend's
/// [timeout](Redis::with_timeout) (5 s, then [`Error::Timeout`]), each
/// request the connection's response timeout (redis': 500 ms), and a renewal
/// the engine's `ttl/3`: choose a ttl well above three times the server's
/// worst answer time (a server with `appendfsync always` waits for its disk).
///
/// # Waiting
///
/// With [`with_pubsub`](Redis::with_pubsub) (or [`connect`](Redis::connect)),
/// waiters wake about one round trip after a release. They also poll (every
/// `ttl/10`, at most 1 s): how they learn of an expired lock (a crashed
/// holder), of a Go replica's release, and of everything without pub/sub.
///
/// # What can lose a lease
///
/// A lock is only as durable as its keys. A **restart without
/// persistence** (no AOF, or `appendfsync` other than `always`), a
/// **failover** to a replica (replication is asynchronous; this is not
/// Redlock) and **eviction** (`allkeys-*` policies; `volatile-*` ones evict
/// lock keys) lose locks and may lose fence counters: another replica may
/// acquire before the holder learns of it at its next renewal (within
/// `ttl/3`), and fencing tokens may repeat or go back. Run the instance
/// with `maxmemory-policy noeviction` (writes then fail instead) and, if
/// that matters, `appendonly yes` with `appendfsync always`.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold::{backend::Redis, deadpool_redis, Lease};
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
    link: Arc<RedisLink>,
    protocol: LockProtocol,
    prefix: Arc<str>,
    timeout: Duration,
    /// Where the subscription to releases connects; without it, waiters poll.
    pubsub: Option<Arc<::redis::Client>>,
    /// The waiters' subscription, started by the first waiter, stopped with
    /// the last clone.
    push: Arc<OnceLock<Push<RedisReleases>>>,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let origin = match self.link.origin() {
            RedisOrigin::Pool(pool) => format!("pool {:?}", pool.status()),
            RedisOrigin::Client(_) => "client".to_owned(),
            #[cfg(feature = "redis-cluster")]
            RedisOrigin::Cluster(_) => "cluster".to_owned(),
        };
        f.debug_struct("Redis")
            .field("prefix", &self.prefix)
            .field(
                "go_locker_protocol",
                &matches!(self.protocol, LockProtocol::GoLocker(_)),
            )
            .field("pubsub", &self.pubsub.is_some())
            .field("timeout", &self.timeout)
            .field("source", &origin)
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
    ///
    /// A pool cannot subscribe, so waiters poll unless you add
    /// [`with_pubsub`](Redis::with_pubsub); [`connect`](Redis::connect) does both.
    pub fn new(pool: Pool) -> Self {
        Self::from_link(RedisLink::new(RedisOrigin::Pool(pool), None))
    }

    /// A backend on the Redis server at `url` (`redis://`, `rediss://` with
    /// the TLS features of `redis`/`deadpool-redis`, `redis+unix://`): a
    /// deadpool-redis pool of its own, and [`with_pubsub`](Redis::with_pubsub)
    /// a client of the same URL. It connects once now, to fail early on a
    /// wrong address. Key prefix `lease:`, 5 s timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use leasehold::{Lease, backend::Redis};
    ///
    /// # async fn f() -> Result<(), leasehold::Error> {
    /// let lease = Lease::new(Redis::connect("redis://127.0.0.1:6379").await?);
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let client = ::redis::Client::open(url)?;
        let pool = deadpool_redis::Config::from_url(url)
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .map_err(Error::backend)?;
        let first = tokio::time::timeout(Self::DEFAULT_TIMEOUT, pool.get())
            .await
            .map_err(|_| Error::Timeout {
                operation: "connect",
                after: Self::DEFAULT_TIMEOUT,
            })??;
        drop(first); // back to the pool, open
        Ok(Self::new(pool).with_pubsub(client))
    }

    /// A backend on a [`redis::Client`](::redis::Client) the application
    /// already has: it opens its connection from it. Key prefix `lease:`, 5 s timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold::backend::Redis;
    /// use leasehold::deadpool_redis::redis;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let backend = Redis::with_client(client.clone()).with_pubsub(client);
    /// assert_eq!(backend.prefix(), "lease:");
    /// # Ok(()) }
    /// ```
    pub fn with_client(client: ::redis::Client) -> Self {
        Self::from_link(RedisLink::new(RedisOrigin::Client(Box::new(client)), None))
    }

    /// A backend on a Redis Cluster, reached through `nodes` (URLs such as
    /// `["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]`; any node will
    /// do, the client learns the others). It connects once now, to fail
    /// early on a wrong address, and keeps that connection, which sends each
    /// script to the master of its keys' hash slot and follows `MOVED`/`ASK`.
    /// Needs the feature `redis-cluster`. For failovers see [What can lose a
    /// lease](Redis#what-can-lose-a-lease).
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
        Ok(Self::from_link(RedisLink::new(
            RedisOrigin::Cluster(Box::new(client)),
            Some(connection::RedisConn::Cluster(conn)),
        )))
    }

    /// True when the backend runs on a Redis Cluster (`Redis::cluster`, feature `redis-cluster`).
    pub fn is_cluster(&self) -> bool {
        match self.link.origin() {
            #[cfg(feature = "redis-cluster")]
            RedisOrigin::Cluster(_) => true,
            _ => false,
        }
    }

    fn from_link(link: RedisLink) -> Self {
        Self {
            link: Arc::new(link),
            protocol: LockProtocol::Fenced,
            prefix: Self::DEFAULT_PREFIX.into(),
            timeout: Self::DEFAULT_TIMEOUT,
            pubsub: None,
            push: Arc::default(),
        }
    }

    /// Learn of releases as Redis pushes them, instead of polling: waiters
    /// ([`Lease::acquire`](crate::Lease::acquire), elections) subscribe to
    /// [`release_channel`](Redis::release_channel) on a connection opened
    /// from `client`, which must reach the same server (or cluster) as the
    /// calls. A pool cannot subscribe (its connections are multiplexed),
    /// hence the client: build it from the pool's URL. The backend and its
    /// clones share one subscription (see [`push`](crate::backend::push)).
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold::backend::Redis;
    /// use leasehold::deadpool_redis::{self, redis};
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
    /// Go and Rust replicas of one job exclude each other while a service
    /// migrates (with the Go services' [prefix](Redis::with_prefix)):
    ///
    /// - the lock of `name` is the key `{prefix}{name}`, exactly: no braces,
    ///   no escaping, no fence key, and **no fencing token** (grants carry
    ///   `None`);
    /// - its value is a random token (128 bits, hex) per acquisition, taken
    ///   with `SET key token NX PX ttl`; renew is `PEXPIRE` and release `DEL`,
    ///   each iff the key still holds the token. The release also publishes
    ///   the name (the Go locker's does not: Rust waiters poll for those).
    ///
    /// The tokens are kept in memory, by (name, holder), shared by clones:
    /// a backend value that did not acquire a lease cannot renew or release
    /// it, and [`inspect`](Backend::inspect) names the holder of its own
    /// acquisitions only. A re-acquire by the same holder takes a new token,
    /// so a late release of the older acquisition deletes nothing.
    ///
    /// Without a key beside the lock in its hash slot, this protocol keeps
    /// no schedule slots ([`Job::once_per`](crate::Job::once_per)) and no
    /// published values ([`Election::proclaim`](crate::Election::proclaim)):
    /// those calls answer [`Error::Unsupported`].
    ///
    /// The two layouts use different keys and do not exclude each other:
    /// switch back to the default only once no Go replica takes the lock,
    /// and on every Rust replica at once.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn pool() -> leasehold::deadpool_redis::Pool {
    /// #     leasehold::deadpool_redis::Config::from_url("redis://127.0.0.1:1")
    /// #         .create_pool(Some(leasehold::deadpool_redis::Runtime::Tokio1)).unwrap()
    /// # }
    /// use leasehold::backend::Redis;
    ///
    /// # fn main() -> Result<(), leasehold::Error> {
    /// let redis = Redis::new(pool()).with_prefix("lock:")?.with_go_locker_protocol();
    /// assert_eq!(redis.lock_key("nightly-report"), "lock:nightly-report");
    /// # Ok(()) }
    /// ```
    pub fn with_go_locker_protocol(self) -> Self {
        Self {
            protocol: LockProtocol::GoLocker(GoTokens::default()),
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
    /// connection is replaced. A zero timeout makes every call fail.
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
    /// # fn pool() -> leasehold::deadpool_redis::Pool {
    /// #     leasehold::deadpool_redis::Config::from_url("redis://127.0.0.1:1")
    /// #         .create_pool(Some(leasehold::deadpool_redis::Runtime::Tokio1)).unwrap()
    /// # }
    /// use leasehold::backend::Redis;
    ///
    /// let redis = Redis::new(pool());
    /// assert_eq!(redis.lock_key("report"), "lease:{report}");
    /// assert_eq!(redis.fence_key("report"), "lease:{report}:fence");
    /// assert_eq!(redis.lock_key("50% {off}"), "lease:{50%25 %7Boff%7D}");
    /// ```
    pub fn lock_key(&self, name: &str) -> String {
        self.protocol.lock_key(&self.prefix, name)
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

    /// [`Error::Unsupported`] in the [Go locker's
    /// protocol](Redis::with_go_locker_protocol), which has no key beside
    /// the lock in its hash slot to keep a ledger or a value in.
    fn fenced_only(&self, operation: &'static str) -> Result<(), Error> {
        match self.protocol {
            LockProtocol::Fenced => Ok(()),
            LockProtocol::GoLocker(_) => Err(Error::Unsupported { operation }),
        }
    }

    /// Release `lease` and, with `slot`, record it as run: the release script.
    async fn release_with(&self, lease: Acquisition<'_>, slot: Option<u64>) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        if slot.is_some() {
            self.fenced_only("once_per")?;
        }
        let value = self.protocol.lock_value(lease);
        if value.is_none() && slot.is_none() {
            return Ok(());
        }
        let lock_key = self.lock_key(lease.name);
        let mut call = SCRIPTS.release.key(&lock_key);
        if let LockProtocol::Fenced = self.protocol {
            call.key(format!("{lock_key}:value"));
        }
        if slot.is_some() {
            call.key(format!("{lock_key}:slot"));
        }
        // No lock value (no fencing token): matches no lock; the slot is recorded.
        call.arg(value.as_deref().unwrap_or(""))
            .arg(self.release_channel())
            .arg(lease.name);
        if let Some(slot) = slot {
            call.arg(slot);
        }
        self.run_one::<i64>("release", call).await?;
        // Deleted, or no longer ours: either way this acquisition is over.
        // (After an error it is kept: a re-acquire replaces it anyway.)
        if let Some(value) = value {
            self.protocol.forget(lease, &value);
        }
        Ok(())
    }

    /// `script` (a forced release) over the lock of `name` and, in the
    /// fenced layout, its value key (and the argument that says so).
    fn force_call(
        &self,
        script: &'static ::redis::Script,
        name: &str,
    ) -> ::redis::ScriptInvocation<'static> {
        let lock_key = self.lock_key(name);
        let mut call = script.key(&lock_key);
        call.arg(self.release_channel()).arg(name);
        if let LockProtocol::Fenced = self.protocol {
            call.key(lock_key + ":value").arg("fenced");
        }
        call
    }

    /// Send `call` alone; its one answer.
    async fn run_one<T: ::redis::FromRedisValue + Send>(
        &self,
        operation: &'static str,
        call: ::redis::ScriptInvocation<'static>,
    ) -> Result<T, Error> {
        let answers = self.link.run(operation, &[call], self.timeout).await?;
        answers
            .into_iter()
            .next()
            .ok_or_else(|| Error::Protocol(format!("the {operation} script answered no value")))
    }

    /// The renewal scripts of `leases` (index, lock key, lock value, ttl),
    /// `per_call` keys at most in each and, on a cluster, keys of one hash
    /// slot only; the order of the answers' keys.
    fn renew_calls(
        &self,
        leases: &[(usize, String, String, u32)],
        per_call: usize,
    ) -> (Vec<::redis::ScriptInvocation<'static>>, Vec<usize>) {
        let slot = |k: &usize| {
            if self.is_cluster() {
                hash_slot(&leases[*k].1)
            } else {
                0
            }
        };
        let mut order: Vec<usize> = (0..leases.len()).collect();
        order.sort_by_key(slot);
        let calls = order
            .chunk_by(|a, b| slot(a) == slot(b))
            .flat_map(|group| group.chunks(per_call))
            .map(|chunk| {
                let mut call = SCRIPTS.renew.prepare_invoke();
                for &k in chunk {
                    let (_, key, value, ttl_ms) = &leases[k];
                    call.key(key).arg(value).arg(*ttl_ms);
                }
                call
            })
            .collect();
        (calls, order)
    }
}

/// How often an idle subscription is checked with `PING`: a connection
/// that died silently (a half-open socket) is replaced within this and the
/// backend's timeout, instead of when TCP gives up.
const PING_EVERY: Duration = Duration::from_secs(30);

/// Redis pub/sub as a [`Source`] of releases: a connection of its own,
/// opened from the client given to [`Redis::with_pubsub`].
struct RedisReleases {
    client: ::redis::Client,
    channel: String,
    timeout: Duration,
}

/// A subscribed pub/sub connection.
struct RedisSubscription {
    sink: PubSubSink,
    stream: PubSubStream,
    ping: tokio::time::Interval,
    timeout: Duration,
}

impl Source for RedisReleases {
    type Subscription = RedisSubscription;
    const WHAT: &'static str = "redis SUBSCRIBE";

    async fn subscribe(&self) -> Result<RedisSubscription, Error> {
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
        Ok(RedisSubscription {
            sink,
            stream,
            ping,
            timeout: self.timeout,
        })
    }

    async fn next(s: &mut RedisSubscription) -> Event {
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
    // One script: takes the lock if it is free, or extends it if it holds
    // `holder` already (same fencing token), with the fence key's `INCR`.
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        Ok(self
            .acquire_with(Request::new(name, holder, ttl))
            .await?
            .granted())
    }

    /// The slot's clock is Redis `TIME`. [`Acquired::HeldElsewhere`]
    /// carries the lock's `PTTL`, so a waiter tries again at the expiry.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Backend::acquire); [`Error::Unsupported`] for
    /// `once_per` or a value in the [Go locker's
    /// protocol](Redis::with_go_locker_protocol).
    async fn acquire_with(&self, request: Request<'_>) -> Result<Acquired> {
        let ttl_ms = validate::request(&request)?;
        if request.once_per.is_some() {
            self.fenced_only("once_per")?;
        }
        if request.value.is_some() {
            self.fenced_only("proclaim")?;
        }
        let LockProtocol::GoLocker(tokens) = &self.protocol else {
            let call =
                LockProtocol::fenced_acquire_call(&self.lock_key(request.name), &request, ttl_ms);
            let answer: Vec<i64> = self.run_one("acquire", call).await?;
            return LockProtocol::fenced_acquired(&answer);
        };
        let (name, holder) = (request.name, request.holder);
        let send = |call| self.run_one("acquire", call);
        let grant =
            LockProtocol::go_acquire(tokens, self.lock_key(name), name, holder, ttl_ms, send)
                .await?;
        Ok(grant.map_or(
            Acquired::HeldElsewhere { expires_in: None },
            Acquired::Granted,
        ))
    }

    // `PEXPIRE lock ttl` iff the lock still holds this acquisition.
    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        let renewed = self.renew_many(&[(lease, ttl)]).await?;
        Ok(renewed.first() == Some(&true))
    }

    /// Deletes the lock and its value and publishes the name. The fence key stays.
    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.release_with(lease, None).await
    }

    /// # Errors
    ///
    /// As [`release`](Backend::release); [`Error::Unsupported`] in the [Go
    /// locker's protocol](Redis::with_go_locker_protocol).
    async fn release_ran(&self, lease: Acquisition<'_>, slot: u64) -> Result<(), Error> {
        self.release_with(lease, Some(slot)).await
    }

    /// Also publishes the name on the [release
    /// channel](Redis::release_channel), so that waiters and
    /// [`Lease::observe`](crate::Lease::observe) look again.
    ///
    /// # Errors
    ///
    /// As [`renew`](Backend::renew); [`Error::Unsupported`] in the [Go
    /// locker's protocol](Redis::with_go_locker_protocol).
    async fn publish(&self, lease: Acquisition<'_>, value: Option<&str>) -> Result<bool, Error> {
        validate::publish(&lease, value)?;
        self.fenced_only("proclaim")?;
        let (Some(fence), Some(lock_value)) =
            (lease.fencing_token, self.protocol.lock_value(lease))
        else {
            return Ok(false);
        };
        let lock_key = self.lock_key(lease.name);
        let mut call = SCRIPTS.publish.key(&lock_key);
        call.key(lock_key + ":value")
            .arg(lock_value)
            .arg(fence)
            .arg(if value.is_some() { "1" } else { "0" })
            .arg(value.unwrap_or(""))
            .arg(self.release_channel())
            .arg(lease.name);
        Ok(self.run_one::<i64>("publish", call).await? == 1)
    }

    /// The value is reported while the lock holds the acquisition that
    /// published it. A released or expired lock leaves only its fence key
    /// and ledger: `expires_in: None`, the last fencing token and an
    /// **empty** `holder`; `Ok(None)` when none of them exists. A
    /// force-released lock has an empty `holder` and is
    /// [`forced`](LeaseInfo::forced) until it expires. In the Go locker's
    /// protocol the `holder` is known only for this backend value's own
    /// acquisitions, there is no fencing token, and a released lock is
    /// `Ok(None)`.
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        validate::name(name)?;
        let call = self.protocol.inspect_call(self.lock_key(name));
        let answer: RedisInspectAnswer = self.run_one("inspect", call).await?;
        Ok(self.protocol.lease_info(name, &answer))
    }

    /// Every lease under the prefix, as [`inspect`](Backend::inspect)
    /// answers it, in the order `SCAN` (never `KEYS`) found its keys: a name
    /// is listed while its fence key (or ledger) lives, held or not. On a Redis Cluster
    /// every master is scanned (a lease whose slot moves meanwhile may be
    /// missed). In the Go locker's protocol every key under the prefix is
    /// taken for a lock: give it a prefix of its own.
    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        let pattern = self.protocol.scan_pattern(&self.prefix);
        let keys = self.link.scan(&pattern, 1000, self.timeout).await?;
        let mut seen = std::collections::HashSet::new();
        let names: Vec<String> = keys
            .iter()
            .filter_map(|key| self.protocol.name_of_key(&self.prefix, key))
            .filter(|name| seen.insert(name.clone()))
            .collect();
        let mut leases = Vec::with_capacity(names.len());
        for chunk in names.chunks(MAX_BATCH) {
            let calls: Vec<_> = chunk
                .iter()
                .map(|name| self.protocol.inspect_call(self.lock_key(name)))
                .collect();
            let answers = self
                .link
                .run::<RedisInspectAnswer>("list", &calls, self.timeout)
                .await?;
            leases.extend(
                chunk
                    .iter()
                    .zip(&answers)
                    .filter_map(|(name, answer)| self.protocol.lease_info(name, answer)),
            );
        }
        Ok(leases)
    }

    /// The lock keeps its `PTTL` and loses its holder (`{fence}:`; in the
    /// Go locker's protocol the empty string, which a Go locker's `SET NX`
    /// also fails on); its value is deleted and the name published. `Ok(false)` when there is no
    /// lock, or it was force-released already. A lock without expiry,
    /// which this backend never writes, is deleted.
    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        let call = self.force_call(&SCRIPTS.force_release, name);
        Ok(self.run_one::<i64>("force_release", call).await? == 1)
    }

    /// Deletes the lock (also one kept by
    /// [`force_release`](Backend::force_release)) and its value, and
    /// publishes the name. The fence key and the ledger stay.
    async fn force_release_now(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        let call = self.force_call(&SCRIPTS.force_release_now, name);
        Ok(self.run_one::<i64>("force_release", call).await? == 1)
    }

    /// See [Waiting](Redis#waiting).
    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        let push = self.pubsub.as_ref().map(|client| {
            self.push.get_or_init(|| {
                Push::new(RedisReleases {
                    client: (**client).clone(),
                    channel: self.release_channel(),
                    timeout: self.timeout,
                })
            })
        });
        // Either way, the time starts now, not when first polled.
        match push {
            Some(push) => Either::Left(push.released(name.to_owned(), poll)),
            None => Either::Right(tokio::time::sleep(poll)),
        }
    }

    // One script per 1,000 keys (and per hash slot on a cluster).
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        // Leases without a lock value cannot be ours: `false` without asking.
        let mut ours = Vec::with_capacity(leases.len());
        for (i, &(lease, ttl)) in leases.iter().enumerate() {
            let ttl_ms = validate::call(lease.name, lease.holder, ttl)?;
            if let Some(value) = self.protocol.lock_value(lease) {
                ours.push((i, self.lock_key(lease.name), value, ttl_ms));
            }
        }
        let mut out = vec![false; leases.len()];
        if ours.is_empty() {
            return Ok(out);
        }
        let (calls, order) = self.renew_calls(&ours, MAX_BATCH);
        let (answers, order) = match self
            .link
            .run::<Vec<i64>>("renew", &calls, self.timeout)
            .await
        {
            // A cluster that this client does not know of refuses a script
            // over several slots: one script per key, sent together.
            Err(Error::Redis(e)) if e.code() == Some("CROSSSLOT") => {
                let (calls, order) = self.renew_calls(&ours, 1);
                (self.link.run("renew", &calls, self.timeout).await?, order)
            }
            answers => (answers?, order),
        };
        let answers: Vec<i64> = answers.concat();
        if answers.len() != ours.len() {
            return Err(Error::Protocol(format!(
                "the renew script answered {} results for {} leases",
                answers.len(),
                ours.len()
            )));
        }
        for (k, answer) in order.into_iter().zip(answers) {
            let (i, _, value, _) = &ours[k];
            out[*i] = answer == 1;
            if answer != 1 {
                self.protocol.forget(leases[*i].0, value);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
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
        let empty = backend().with_prefix("").expect("empty is fine");
        assert_eq!(empty.lock_key("n"), "{n}");
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
    fn the_protocol_is_chosen_once_for_every_key() {
        let fenced = backend().with_prefix("p:").expect("valid");
        assert_eq!(fenced.lock_key("a{b}"), "p:{a%7Bb%7D}");
        assert_eq!(fenced.fence_key("a{b}"), "p:{a%7Bb%7D}:fence");
        let go = fenced.clone().with_go_locker_protocol();
        assert_eq!(go.lock_key("a{b}"), "p:a{b}");
        assert_eq!(
            backend().with_go_locker_protocol().lock_key("a{b}"),
            "lease:a{b}"
        );
        assert!(format!("{go:?}").contains("go_locker_protocol: true"));
    }

    /// A lease this backend value holds no token of cannot be ours: renew
    /// and release answer without a round trip (here: a server that is not
    /// there).
    #[tokio::test]
    async fn no_lock_value_no_round_trip() {
        let go = backend().with_go_locker_protocol();
        let lease = Acquisition::new("report", "pod", None);
        assert!(
            !go.renew(lease, Duration::from_secs(1))
                .await
                .expect("no call")
        );
        go.release(lease).await.expect("no call");
        let fenced = backend();
        assert!(
            !fenced
                .renew(lease, Duration::from_secs(1))
                .await
                .expect("no call")
        );
    }
}
