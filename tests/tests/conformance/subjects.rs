//! The subjects: each backend, with the test-only powers of [`Subject`].

use super::*;

pub(crate) struct MemorySubject(Memory);

impl Subject for MemorySubject {
    type B = Memory;

    fn backend(&self) -> Memory {
        self.0.clone()
    }

    async fn steal(&self, name: &str, thief: &str) {
        self.0.expire(name);
        self.0
            .acquire(name, thief, Duration::from_secs(60))
            .await
            .unwrap()
            .expect("expired");
    }
}

pub(crate) async fn memory() -> Option<MemorySubject> {
    lease_tests::init_tracing();
    Some(MemorySubject(Memory::new()))
}

/// A table backend; `steal` rewrites its row with SQL, as an operator would.
pub(crate) struct TableSubject<B> {
    backend: B,
    /// `UPDATE` that makes the thief the holder of the name with the next
    /// fence, for a minute; binds name then thief, or thief then name.
    steal_sql: String,
    thief_first: bool,
    caps: Caps,
    /// Keeps the SQLite file alive for the test.
    _file: Option<TempDb>,
}

impl<B: TableBackend> TableSubject<B> {
    fn new(backend: B, steal_template: &str, caps: Caps, file: Option<TempDb>) -> Self {
        let thief_first = !steal_template.contains("$1") && !steal_template.contains("?1");
        Self {
            steal_sql: steal_template.replace("{table}", backend.table()),
            backend,
            thief_first,
            caps,
            _file: file,
        }
    }
}

macro_rules! table_subject {
    ($backend:ty) => {
        impl Subject for TableSubject<$backend> {
            type B = $backend;

            fn backend(&self) -> $backend {
                self.backend.clone()
            }

            fn caps(&self) -> Caps {
                self.caps
            }

            async fn steal(&self, name: &str, thief: &str) {
                let (first, second) = if self.thief_first {
                    (thief, name)
                } else {
                    (name, thief)
                };
                let done = sqlx::query(AssertSqlSafe(self.steal_sql.clone()))
                    .bind(first)
                    .bind(second)
                    .execute(self.backend.pool())
                    .await
                    .expect("steal");
                assert_eq!(done.rows_affected(), 1, "no row to steal");
            }
        }
    };
}
table_subject!(PgTable);
table_subject!(MySqlTable);
table_subject!(SqliteTable);

pub(crate) async fn sqlite() -> Option<TableSubject<SqliteTable>> {
    lease_tests::init_tracing();
    let file = TempDb::new("conformance");
    let table = SqliteTable::open(file.path())
        .await
        .expect("open sqlite file");
    let steal = "UPDATE {table} SET holder = ?2, fence = fence + 1, \
                 expires_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 60000 \
                 WHERE name = ?1";
    Some(TableSubject::new(table, steal, Caps::new(), Some(file)))
}

pub(crate) async fn postgres() -> Option<TableSubject<PgTable>> {
    lease_tests::init_tracing();
    let table = PgTable::new(lease_tests::postgres().await?);
    table.ensure_schema().await.expect("ensure_schema");
    let steal = "UPDATE {table} SET holder = $2, fence = fence + 1, \
                 expires_at = clock_timestamp() + interval '1 minute' WHERE name = $1";
    // Releases are pushed (`NOTIFY`).
    let caps = Caps::new().with_pushes(true);
    Some(TableSubject::new(table, steal, caps, None))
}

pub(crate) async fn mysql() -> Option<TableSubject<MySqlTable>> {
    lease_tests::init_tracing();
    let table = MySqlTable::new(lease_tests::mysql().await?);
    table.ensure_schema().await.expect("ensure_schema");
    let steal = "UPDATE {table} SET fence = fence + 1, holder = ?, \
                 expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE WHERE name = ?";
    Some(TableSubject::new(table, steal, Caps::new(), None))
}

/// `PgAdvisory`: no fencing token (unless `with_fencing`) and no expiry
/// (see [`Caps`]). The only way to take an advisory lock from its holder is
/// to end the holder's session, so `end_session` terminates it (found in
/// `pg_locks`) from another connection, and `steal` does so once the
/// thief's connection waits for the lock (`pg_advisory_lock`): the server
/// hands it to the thief before anyone else can try. With fencing, the
/// thief then bumps the name's counter, as a fenced acquisition does.
pub(crate) struct PgAdvisorySubject {
    backend: PgAdvisory,
    /// A pool of its own, to look at and terminate the backend's sessions.
    admin: sqlx::PgPool,
    /// The thieves' connections, by name: each holds its stolen lock.
    thieves: std::sync::Mutex<std::collections::HashMap<String, sqlx::PgConnection>>,
}

impl PgAdvisorySubject {
    /// Pids of the sessions holding (`granted`) or waiting for the advisory
    /// lock of `name`.
    async fn sessions(&self, name: &str, granted: bool) -> Vec<i32> {
        sqlx::query_scalar(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted = $2 \
             AND objsubid = 1 AND classid::int8 = (($1::int8 >> 32) & 4294967295) \
             AND objid::int8 = ($1::int8 & 4294967295)",
        )
        .bind(PgAdvisory::key(name))
        .bind(granted)
        .fetch_all(&self.admin)
        .await
        .expect("query pg_locks")
    }

    /// Terminate the sessions holding `name`'s lock but `keep`, and return
    /// once they are gone.
    async fn terminate_holders(&self, name: &str, keep: Option<i32>) {
        let pids: Vec<i32> = self
            .sessions(name, true)
            .await
            .into_iter()
            .filter(|&pid| Some(pid) != keep)
            .collect();
        assert!(!pids.is_empty(), "nobody holds {name:?}");
        for &pid in &pids {
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&self.admin)
                .await
                .expect("pg_terminate_backend");
        }
        let deadline = Instant::now() + ms(5_000);
        while self
            .sessions(name, true)
            .await
            .iter()
            .any(|pid| pids.contains(pid))
        {
            assert!(
                Instant::now() < deadline,
                "terminated session kept its lock"
            );
            sleep(ms(10)).await;
        }
    }
}

impl Subject for PgAdvisorySubject {
    type B = PgAdvisory;

    fn backend(&self) -> PgAdvisory {
        self.backend.clone()
    }

    fn caps(&self) -> Caps {
        Caps::new()
            .with_fencing(self.backend.fence_table().is_some())
            .with_expires(false)
            .with_pushes(true)
            .with_leader(Naming::Session)
            // No slot ledger, no values; no lock delay (the lock ends with
            // its session): only `force_release_now`, which ends it.
            .with_once_per(false)
            .with_values(false)
            .with_lock_delay(false)
    }

    async fn steal(&self, name: &str, thief: &str) {
        let mut conn = self.admin.acquire().await.expect("connection").detach();
        sqlx::query("SELECT set_config('application_name', $1, false)")
            .bind(thief)
            .execute(&mut conn)
            .await
            .expect("name the thief's session");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .expect("pid");
        let key = PgAdvisory::key(name);
        let locking = tokio::spawn(async move {
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(key)
                .execute(&mut conn)
                .await
                .expect("the thief's lock");
            conn
        });
        let deadline = Instant::now() + ms(5_000);
        while !self.sessions(name, false).await.contains(&pid) {
            assert!(
                Instant::now() < deadline,
                "the thief does not wait for the lock"
            );
            sleep(ms(10)).await;
        }
        self.terminate_holders(name, Some(pid)).await;
        let mut conn = timeout(ms(5_000), locking)
            .await
            .expect("the thief has the lock once its holder's session ended")
            .unwrap();
        if let Some(table) = self.backend.fence_table() {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} AS f (name, fence) VALUES ($1, 1) \
                 ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1"
            )))
            .bind(name)
            .execute(&mut conn)
            .await
            .expect("the thief's fence");
        }
        self.thieves.lock().unwrap().insert(name.to_owned(), conn);
    }

    /// The thief closes its session.
    async fn let_go(&self, name: &str, _thief: &str) {
        let conn = self.thieves.lock().unwrap().remove(name).expect("a thief");
        sqlx::Connection::close(conn)
            .await
            .expect("close the thief's session");
    }

    async fn end_session(&self, name: &str) {
        self.terminate_holders(name, None).await;
    }
}

pub(crate) async fn pg_advisory() -> Option<PgAdvisorySubject> {
    lease_tests::init_tracing();
    let admin = lease_tests::postgres().await?;
    // One connection per held lock: room for 16 contenders, and for the 40
    // names `names_are_data` holds at once plus an intruder's attempt.
    let pool = lease_tests::postgres_with(PgPoolOptions::new().max_connections(45)).await?;
    Some(PgAdvisorySubject {
        backend: PgAdvisory::new(pool),
        admin,
        thieves: Default::default(),
    })
}

/// `PgAdvisory::with_watch(false)`: the holding connections are plain pool
/// connections, not watched; a lost session is noticed by the heartbeat.
pub(crate) async fn pg_advisory_unwatched() -> Option<PgAdvisorySubject> {
    let mut subject = pg_advisory().await?;
    subject.backend = subject.backend.with_watch(false);
    Some(subject)
}

/// `PgAdvisory::with_fencing` on `lease_fences`: every property with
/// fencing tokens (each test's names are its own, so the table is shared).
pub(crate) async fn pg_advisory_fenced() -> Option<PgAdvisorySubject> {
    let mut subject = pg_advisory().await?;
    subject.backend = subject
        .backend
        .with_fencing("lease_fences")
        .expect("a valid table name");
    subject
        .backend
        .ensure_schema()
        .await
        .expect("ensure_schema");
    Some(subject)
}

/// `Redis`, subscribed for releases (`with_pubsub`): `steal` bumps the
/// fence counter and writes the thief with the new fence into the lock key;
/// in the Go locker's protocol (`go`), it overwrites the lock key's token.
pub(crate) struct RedisSubject {
    backend: Redis,
    pool: leasehold::deadpool_redis::Pool,
    go: bool,
}

impl Subject for RedisSubject {
    type B = Redis;

    fn backend(&self) -> Redis {
        self.backend.clone()
    }

    fn caps(&self) -> Caps {
        let leader = if self.go {
            Naming::OwnHolders
        } else {
            Naming::Holder
        };
        Caps::new()
            .with_fencing(!self.go)
            // Subscribed (`Redis::with_pubsub`): the release script publishes.
            .with_pushes(true)
            .with_leader(leader)
            // The Go locker's protocol has no room for a slot or a value
            // (`Error::Unsupported`); both force releases work on it.
            .with_once_per(!self.go)
            .with_values(!self.go)
    }

    async fn steal(&self, name: &str, thief: &str) {
        let mut conn = self.pool.get().await.expect("redis connection");
        if self.go {
            let () = ::redis::cmd("SET")
                .arg(self.backend.lock_key(name))
                .arg(thief)
                .arg("PX")
                .arg(60_000)
                .query_async(&mut conn)
                .await
                .expect("steal");
            return;
        }
        // The next fence and the thief, as the acquire script writes them.
        let _fence: i64 = ::redis::cmd("EVAL")
            .arg(
                "local f = redis.call('INCR', KEYS[2]) \
                 redis.call('SET', KEYS[1], f .. ':' .. ARGV[1], 'PX', 60000) return f",
            )
            .arg(2)
            .arg(self.backend.lock_key(name))
            .arg(self.backend.fence_key(name))
            .arg(thief)
            .query_async(&mut conn)
            .await
            .expect("steal");
    }

    /// In the Go locker's protocol only the acquiring backend value knows
    /// the token to release with: the thief's lock goes as if it expired.
    async fn let_go(&self, name: &str, thief: &str) {
        if !self.go {
            return release_as(&self.backend, name, thief).await;
        }
        let mut conn = self.pool.get().await.expect("redis connection");
        let deleted: i64 = ::redis::cmd("DEL")
            .arg(self.backend.lock_key(name))
            .query_async(&mut conn)
            .await
            .expect("delete the thief's lock");
        assert_eq!(deleted, 1, "no lock to let go");
    }
}

/// A client for the waiters' subscription (`Redis::with_pubsub`).
pub(crate) fn pubsub() -> ::redis::Client {
    ::redis::Client::open(lease_tests::redis_url()).expect("redis url")
}

pub(crate) async fn redis() -> Option<RedisSubject> {
    lease_tests::init_tracing();
    let pool = lease_tests::redis().await?;
    Some(RedisSubject {
        backend: Redis::new(pool.clone()).with_pubsub(pubsub()),
        pool,
        go: false,
    })
}

/// `Redis` in the Go locker's protocol, with a prefix of its own.
pub(crate) async fn redis_go_locker() -> Option<RedisSubject> {
    lease_tests::init_tracing();
    let pool = lease_tests::redis().await?;
    let backend = Redis::new(pool.clone())
        .with_prefix("lease-go-locker:")
        .expect("valid")
        .with_go_locker_protocol()
        .with_pubsub(pubsub());
    Some(RedisSubject {
        backend,
        pool,
        go: true,
    })
}

/// `Etcd` on the 3-member cluster of this test binary
/// ([`lease_tests::clusters::etcd_cluster`]).
///
/// The suite counts fencing tokens per name (1 for the first acquisition,
/// one more for each later one); etcd's tokens are the key's
/// `create_revision`, which grows with every write to the cluster. So the
/// subject's backend is [`Ordinal`]: it passes etcd's tokens through as
/// their rank among the tokens seen for that name, and asserts on the way
/// that etcd's own tokens strictly grow with each acquisition. `steal`
/// revokes the holder's etcd lease and puts the thief in the key with a
/// lease of its own, as another client would.
pub(crate) struct EtcdSubject {
    backend: Ordinal<Etcd>,
    client: leasehold::etcd_client::Client,
}

impl Subject for EtcdSubject {
    type B = Ordinal<Etcd>;

    fn backend(&self) -> Ordinal<Etcd> {
        self.backend.clone()
    }

    /// Waiters learn of a release through the backend's watch.
    fn caps(&self) -> Caps {
        Caps::new().with_pushes(true)
    }

    /// etcd rounds a ttl up to whole seconds (at least 1 s on the test
    /// cluster) and checks for expired leases every 500 ms.
    fn expiry(&self, ttl: Duration) -> Duration {
        Duration::from_secs(Etcd::lease_ttl_secs(ttl).unsigned_abs()) + ms(700)
    }

    /// The fencing tokens are revisions, which grow without a record: a
    /// released key is deleted.
    fn keeps_released(&self) -> bool {
        false
    }

    async fn steal(&self, name: &str, thief: &str) {
        use leasehold::etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
        let mut client = self.client.clone();
        let key = self.backend.inner().key(name);
        let held = client.get(key.clone(), None).await.expect("get");
        for kv in held.kvs() {
            client.lease_revoke(kv.lease()).await.expect("revoke");
        }
        let lease = client.lease_grant(60, None).await.expect("grant").id();
        let put = client
            .txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key,
                        thief,
                        Some(PutOptions::new().with_lease(lease)),
                    )]),
            )
            .await
            .expect("put");
        assert!(put.succeeded(), "the key was not free after the revoke");
        let revision = put.header().expect("header").revision();
        self.backend.rank(name, revision.unsigned_abs());
    }
}

pub(crate) async fn etcd() -> Option<EtcdSubject> {
    lease_tests::init_tracing();
    let cluster = lease_tests::clusters::etcd_cluster()?;
    let backend = Etcd::connect(cluster.endpoints())
        .await
        .expect("connect to the etcd cluster")
        .with_prefix("lease-conformance/")
        .expect("valid");
    Some(EtcdSubject {
        client: backend.client().clone(),
        backend: Ordinal::new(backend),
    })
}

/// `Redis` on the 3-master Redis Cluster of this test binary
/// ([`lease_tests::clusters::redis_cluster`]), through [`Redis::cluster`];
/// `steal` writes the lock and bumps the fence in one `MULTI` on the node of
/// their (shared) hash slot.
pub(crate) struct RedisClusterSubject {
    backend: Redis,
    client: ::redis::cluster::ClusterClient,
}

impl Subject for RedisClusterSubject {
    type B = Redis;

    fn backend(&self) -> Redis {
        self.backend.clone()
    }

    fn caps(&self) -> Caps {
        // Subscribed (`Redis::with_pubsub`, to one node): `PUBLISH`
        // reaches subscribers on every node of the cluster.
        Caps::new().with_pushes(true)
    }

    async fn steal(&self, name: &str, thief: &str) {
        let mut conn = self
            .client
            .get_async_connection()
            .await
            .expect("cluster connection");
        // The next fence and the thief, as the acquire script writes them
        // (the script's keys share a slot: it runs on that slot's master).
        let _fence: i64 = ::redis::cmd("EVAL")
            .arg(
                "local f = redis.call('INCR', KEYS[2]) \
                 redis.call('SET', KEYS[1], f .. ':' .. ARGV[1], 'PX', 60000) return f",
            )
            .arg(2)
            .arg(self.backend.lock_key(name))
            .arg(self.backend.fence_key(name))
            .arg(thief)
            .query_async(&mut conn)
            .await
            .expect("steal");
    }
}

pub(crate) async fn redis_cluster() -> Option<RedisClusterSubject> {
    lease_tests::init_tracing();
    let cluster = lease_tests::clusters::redis_cluster()?;
    let nodes = cluster.nodes();
    let backend = Redis::cluster(&nodes)
        .await
        .expect("connect to the redis cluster")
        .with_pubsub(::redis::Client::open(nodes[0].as_str()).expect("node url"));
    Some(RedisClusterSubject {
        backend,
        client: ::redis::cluster::ClusterClient::new(cluster.nodes()).expect("client"),
    })
}
