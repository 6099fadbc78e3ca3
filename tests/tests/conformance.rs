//! The conformance suite: every property, written once, run against every backend.
//!
//! Each property is a generic `async fn` over a [`Subject`] (a backend plus the
//! few test-only powers the suite needs, such as rewriting a lease behind the
//! holder's back). The `conformance!` macro at the bottom instantiates every
//! property as a `#[tokio::test]` for each backend, so a new backend gets every
//! check by adding one `conformance!` line and a `Subject` impl.
//!
//! Where a backend's guarantee differs from the table backends' (see
//! [`Caps`]), the property states the difference and asserts what that backend
//! actually does instead of skipping. Today that is `PgAdvisory`: it has no
//! fencing token, and no server-side expiry — a lock that nobody renews stays
//! held for as long as its holder's session lives, and is taken over once
//! that session ends (see [`lapse`]).

// The properties are test code called by the generated `#[tokio::test]`s,
// which `allow-unwrap-in-tests` (clippy.toml) does not see as tests.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use lease::backend::{Memory, MySqlTable, PgAdvisory, PgTable, Redis, SqliteTable};
use lease::{Acquisition, Backend, Error, Grant, Lease, Outcome, Skip};
use lease_tests::{TempDb, unique};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPoolOptions;
use tokio::time::{Instant, sleep, timeout};

/// How a backend's guarantees differ from the table backends'.
#[derive(Debug, Clone, Copy)]
struct Caps {
    /// Acquisitions carry an increasing fencing token.
    fencing: bool,
    /// The server expires a lease that is not renewed within its ttl. When
    /// false (`PgAdvisory`), a lease lives as long as its holder's session
    /// and ends when that session does ([`Subject::end_session`]).
    expires: bool,
}

const TABLE_LIKE: Caps = Caps {
    fencing: true,
    expires: true,
};

/// A backend under test.
trait Subject: Send + Sync + 'static {
    type B: Backend + Clone;

    fn backend(&self) -> Self::B;

    fn caps(&self) -> Caps {
        TABLE_LIKE
    }

    /// Behind the holder's back, make `thief` the holder of `name` with a
    /// larger fence, as an operator or a buggy peer rewriting the row would.
    fn steal(&self, name: &str, thief: &str) -> impl Future<Output = ()> + Send;

    /// For table backends: `with_table` of the backend, as `Some(result)`;
    /// `None` for backends without tables.
    fn with_table(&self, table: &str) -> Option<Result<Self::B, Error>>;

    /// For backends without expiry: end the session of whoever holds `name`
    /// (as a crash or `pg_terminate_backend` would), and return once the
    /// server has freed the name.
    fn end_session(&self, name: &str) -> impl Future<Output = ()> + Send {
        let _ = name;
        async { panic!("only a backend without expiry has sessions to end") }
    }
}

/// The acquisition `grant` was for.
fn acq<'a>(name: &'a str, holder: &'a str, grant: &Grant) -> Acquisition<'a> {
    Acquisition::new(name, holder, grant.fencing_token)
}

fn lease<S: Subject>(s: &S, holder: &str) -> Lease {
    Lease::with_holder(s.backend(), holder)
}

const TTL: Duration = Duration::from_secs(2);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Let the lease `holder` has on `name` (acquired with `ttl`, not renewed)
/// lapse, so that another holder can take it over.
///
/// With expiry: wait out the ttl. Without (`PgAdvisory`): the difference is
/// that the lease outlives its ttl — after the same wait it is still held
/// and still renewable by `holder` — and it is the end of the holder's
/// session that frees it.
async fn lapse<S: Subject>(s: &S, lease: Acquisition<'_>, ttl: Duration) {
    sleep(ttl + ms(200)).await; // nobody renews
    if !s.caps().expires {
        let (b, name) = (s.backend(), lease.name);
        assert!(
            b.acquire(name, "holder-probe", TTL)
                .await
                .expect("acquire")
                .is_none(),
            "no expiry: the lease must still be held after its ttl"
        );
        assert!(
            b.renew(lease, ttl).await.expect("renew"),
            "no expiry: the holder can still renew after its ttl"
        );
        s.end_session(name).await;
    }
}

// ---------------------------------------------------------------- properties

async fn exclusive_between_two_holders<S: Subject>(s: &S) {
    let name = unique("exclusive");
    let (a, b) = (lease(s, "holder-a"), lease(s, "holder-b"));
    let guard = a
        .try_acquire(&name, TTL)
        .await
        .unwrap()
        .expect("free lease");
    assert!(
        b.try_acquire(&name, TTL).await.unwrap().is_none(),
        "b acquired a held lease"
    );
    let skipped = b.with_lease(&name, TTL, |_| async { "b ran" }).await;
    assert!(
        matches!(skipped, Outcome::Skipped(Skip::HeldElsewhere)),
        "{skipped:?}"
    );
    guard.release().await.unwrap();
    let out = b.with_lease(&name, TTL, |_| async { "b ran" }).await;
    assert_eq!(out.into_result().unwrap(), Some("b ran"));
}

async fn idempotent_reacquire_keeps_the_fence<S: Subject>(s: &S) {
    let name = unique("idempotent");
    let b = s.backend();
    let first = b
        .acquire(&name, "holder-a", TTL)
        .await
        .unwrap()
        .expect("free");
    let again = b
        .acquire(&name, "holder-a", TTL)
        .await
        .unwrap()
        .expect("same holder re-acquires");
    assert_eq!(first.fencing_token, again.fencing_token);
    assert!(b.acquire(&name, "holder-b", TTL).await.unwrap().is_none());
    b.release(acq(&name, "holder-a", &again)).await.unwrap();
    // A Lease with the same holder (say, a restarted process that kept its
    // identity) re-acquires a live lease idempotently too.
    let g = b
        .acquire(&name, "holder-a", TTL)
        .await
        .unwrap()
        .expect("free after release");
    let twin = lease(s, "holder-a")
        .try_acquire(&name, TTL)
        .await
        .unwrap()
        .expect("same holder");
    assert_eq!(twin.fencing_token(), g.fencing_token);
    if s.caps().fencing {
        assert!(
            g.fencing_token > first.fencing_token,
            "release then re-acquire is a new acquisition"
        );
    }
    twin.release().await.unwrap();
}

async fn takeover_after_expiry_has_a_larger_fence<S: Subject>(s: &S) {
    let name = unique("takeover");
    let b = s.backend();
    let ttl = ms(300);
    let first = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    assert!(b.acquire(&name, "holder-b", ttl).await.unwrap().is_none());
    lapse(s, acq(&name, "holder-a", &first), ttl).await;
    let second = b
        .acquire(&name, "holder-b", TTL)
        .await
        .unwrap()
        .expect("expired lease is free");
    if s.caps().fencing {
        assert!(second.fencing_token.unwrap() > first.fencing_token.unwrap());
    }
    b.release(acq(&name, "holder-b", &second)).await.unwrap();
}

async fn renew_fails_after_takeover_release_and_expiry<S: Subject>(s: &S) {
    let b = s.backend();
    let ttl = ms(300);

    let name = unique("renew-takeover");
    let a = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    let a = acq(&name, "holder-a", &a);
    assert!(b.renew(a, ttl).await.unwrap());
    lapse(s, a, ttl).await;
    let taken = b
        .acquire(&name, "holder-b", TTL)
        .await
        .unwrap()
        .expect("expired lease is free");
    assert!(
        !b.renew(a, ttl).await.unwrap(),
        "renewed someone else's lease"
    );
    assert!(b.renew(acq(&name, "holder-b", &taken), TTL).await.unwrap());

    let name = unique("renew-release");
    let a = b
        .acquire(&name, "holder-a", TTL)
        .await
        .unwrap()
        .expect("free");
    let a = acq(&name, "holder-a", &a);
    b.release(a).await.unwrap();
    assert!(!b.renew(a, TTL).await.unwrap(), "renewed a released lease");

    let name = unique("renew-expiry");
    let a = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    let a = acq(&name, "holder-a", &a);
    lapse(s, a, ttl).await;
    assert!(!b.renew(a, TTL).await.unwrap(), "renewed an expired lease");
    // ...and the failed renewals did not bring it back.
    assert!(b.acquire(&name, "holder-b", TTL).await.unwrap().is_some());
}

async fn renew_never_inserts<S: Subject>(s: &S) {
    let name = unique("renew-insert");
    let b = s.backend();
    for fence in [None, Some(1)] {
        let lease = Acquisition::new(&name, "holder-a", fence);
        assert!(!b.renew(lease, TTL).await.unwrap());
    }
    let g = b
        .acquire(&name, "holder-b", TTL)
        .await
        .unwrap()
        .expect("renew must not have created a lease");
    if s.caps().fencing {
        assert_eq!(g.fencing_token, Some(1));
    }
}

async fn release_by_a_non_holder_is_a_no_op<S: Subject>(s: &S) {
    let name = unique("release-other");
    let b = s.backend();
    let a = b
        .acquire(&name, "holder-a", TTL)
        .await
        .unwrap()
        .expect("free");
    b.release(acq(&name, "holder-b", &a)).await.unwrap();
    b.release(Acquisition::new(&unique("never-seen"), "holder-b", Some(1)))
        .await
        .unwrap();
    assert!(
        b.acquire(&name, "holder-b", TTL).await.unwrap().is_none(),
        "a stranger released our lease"
    );
    assert!(b.renew(acq(&name, "holder-a", &a), TTL).await.unwrap());
}

async fn fences_strictly_increase<S: Subject>(s: &S) {
    let name = unique("fences");
    let holders = [lease(s, "holder-a"), lease(s, "holder-b")];
    let mut last = None;
    for i in 0..100 {
        let guard = holders[i % 2]
            .try_acquire(&name, TTL)
            .await
            .unwrap()
            .expect("released lease is free");
        let fence = guard.fencing_token();
        if s.caps().fencing {
            let fence = fence.expect("fencing backend gave no token");
            if let Some(last) = last {
                assert!(fence > last, "acquisition {i}: fence {fence} after {last}");
            }
            last = Some(fence);
        } else {
            assert_eq!(fence, None);
        }
        guard.release().await.unwrap();
    }
}

async fn names_are_data<S: Subject>(s: &S) {
    let tag = unique("n");
    let mut names: Vec<String> = [
        "it's",
        "it''s",
        "\"quoted\"",
        "100%",
        "100_",
        "1000",
        "a\\b",
        "a\\\\b",
        "{braces}",
        "{",
        "}x",
        "x:fence",
        "🦀 crab",
        "Case",
        "case",
        "trailing ",
        "trailing",
        "%_",
        "'; drop table task_leases; --",
    ]
    .iter()
    .map(|n| format!("{tag}{n}"))
    .collect();
    // Exactly 255 bytes, ending in a 4-byte character.
    let mut long = format!("{tag}-");
    while long.len() < 251 {
        long.push('x');
    }
    long.push('🦀');
    assert_eq!(long.len(), 255);
    names.push(long);

    let a = lease(s, "holder-a");
    let b = lease(s, "holder-b");
    let mut guards = Vec::new();
    for name in &names {
        let g = a
            .try_acquire(name, TTL)
            .await
            .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        guards.push(g.unwrap_or_else(|| panic!("{name:?} collided with another name")));
    }
    for name in &names {
        assert!(
            b.try_acquire(name, TTL).await.unwrap().is_none(),
            "{name:?} not held"
        );
    }
    for g in guards {
        assert!(g.is_valid());
        g.release().await.unwrap();
    }
    for name in &names {
        assert!(
            b.try_acquire(name, TTL).await.unwrap().is_some(),
            "{name:?} not released"
        );
    }
}

async fn invalid_input_is_rejected<S: Subject>(s: &S) {
    let a = lease(s, "holder-a");
    assert!(matches!(
        a.try_acquire("", TTL).await,
        Err(Error::InvalidName { len: 0 })
    ));
    let long = "x".repeat(256);
    assert!(matches!(
        a.try_acquire(&long, TTL).await,
        Err(Error::InvalidName { len: 256 })
    ));
    let name = unique("ttl");
    for ttl in [
        Duration::ZERO,
        ms(9),
        Duration::from_secs(86_400) + ms(1),
        Duration::from_micros(20_500),
    ] {
        assert!(
            matches!(
                a.try_acquire(&name, ttl).await,
                Err(Error::InvalidTtl { .. })
            ),
            "{ttl:?}"
        );
    }
    // Both bounds are accepted (inclusive). A 10 ms ttl leaves the acquire
    // 7.9 ms (ttl - margin) and the release 10 ms, which a loaded machine
    // can miss: a timeout there is not a rejection of the ttl. Each bound
    // gets a name of its own, so that a timed-out acquire cannot leave the
    // other one's name taken.
    for ttl in [ms(10), Duration::from_secs(86_400)] {
        let tolerate_timeout = ttl == ms(10);
        match a.try_acquire(&unique("ttl-bound"), ttl).await {
            Ok(Some(g)) => match g.release().await {
                Ok(()) => {}
                Err(Error::Timeout { .. }) if tolerate_timeout => {}
                Err(e) => panic!("{ttl:?}: release failed: {e}"),
            },
            Err(Error::Timeout { .. }) if tolerate_timeout => {}
            other => panic!("{ttl:?}: bounds are inclusive, got {other:?}"),
        }
    }
    let out = a.with_lease("", TTL, |_| async {}).await;
    assert!(matches!(
        out,
        Outcome::Skipped(Skip::Error(Error::InvalidName { .. }))
    ));
}

async fn table_names_are_validated<S: Subject>(s: &S) {
    let Some(bad) = s.with_table("leases; drop table x") else {
        // Not a table backend: there is no table name to validate.
        return;
    };
    assert!(matches!(bad, Err(Error::InvalidTable { .. })));
    for bad in ["", "1x", "a.b.c", "\"x\"", "x-y"] {
        assert!(
            matches!(s.with_table(bad), Some(Err(Error::InvalidTable { .. }))),
            "{bad:?}"
        );
    }
    assert!(matches!(s.with_table("my_schema.leases"), Some(Ok(_))));
}

async fn one_winner_among_sixteen_contenders<S: Subject>(s: &S) {
    let name = unique("contenders");
    let pods: Vec<Lease> = (0..16).map(|i| lease(s, &format!("pod-{i:02}"))).collect();
    let mut last_fence = None;
    for round in 0..200 {
        let results = join_all(pods.iter().map(|p| p.try_acquire(&name, TTL))).await;
        let mut winners = Vec::new();
        for r in results {
            match r {
                Ok(Some(g)) => winners.push(g),
                Ok(None) => {}
                Err(e) => panic!("round {round}: acquisition failed: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        let winner = winners.pop().expect("one winner");
        if s.caps().fencing {
            let fence = winner.fencing_token();
            assert!(
                fence > last_fence,
                "round {round}: fence {fence:?} after {last_fence:?}"
            );
            last_fence = fence;
        }
        winner.release().await.unwrap();
    }
}

async fn one_runner_among_sixteen_with_lease<S: Subject>(s: &S) {
    let name = unique("with-lease");
    let running = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..10 {
        let pods: Vec<Lease> = (0..16).map(|i| lease(s, &format!("pod-{i:02}"))).collect();
        let outs = join_all(pods.iter().map(|p| {
            let (running, ran) = (running.clone(), ran.clone());
            p.with_lease(&name, TTL, move |_| async move {
                assert_eq!(
                    running.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two pods ran at once"
                );
                sleep(ms(50)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                ran.fetch_add(1, Ordering::SeqCst);
            })
        }))
        .await;
        for out in outs {
            assert!(!matches!(out, Outcome::Skipped(Skip::Error(_))), "{out:?}");
        }
    }
    assert!(
        ran.load(Ordering::SeqCst) >= 10,
        "every round ran on one pod"
    );
}

async fn a_stolen_lease_cancels_the_token<S: Subject>(s: &S) {
    let name = unique("stolen");
    let ttl = ms(1_500);
    let holder = lease(s, "holder-a");
    let guard = holder.try_acquire(&name, ttl).await.unwrap().expect("free");
    sleep(ms(100)).await;
    let stolen_at = Instant::now();
    s.steal(&name, "thief").await;
    // Noticed at the next renewal: within ttl/3 plus slack for a loaded machine.
    let bound = ttl / 3 + ms(500);
    timeout(bound, guard.token().cancelled())
        .await
        .unwrap_or_else(|_| panic!("token not cancelled within {bound:?} of the steal"));
    let noticed = stolen_at.elapsed();
    assert!(!guard.is_valid());
    eprintln!(
        "stolen lease noticed after {noticed:?} (ttl/3 = {:?})",
        ttl / 3
    );
    // Releasing after a takeover does not free the thief's lease.
    guard.release().await.unwrap();
    assert!(
        lease(s, "holder-b")
            .try_acquire(&name, ttl)
            .await
            .unwrap()
            .is_none()
    );
}

async fn a_dropped_guard_frees_the_lease<S: Subject>(s: &S) {
    let name = unique("dropped");
    let a = lease(s, "holder-a");
    let b = lease(s, "holder-b");
    drop(a.try_acquire(&name, TTL).await.unwrap().expect("free"));
    // Released in the background: poll for a little while.
    let deadline = Instant::now() + ms(1_000);
    loop {
        if let Some(g) = b.try_acquire(&name, TTL).await.unwrap() {
            g.release().await.unwrap();
            break;
        }
        assert!(Instant::now() < deadline, "dropped guard did not release");
        sleep(ms(10)).await;
    }
}

async fn a_held_lease_is_renewed_past_its_ttl<S: Subject>(s: &S) {
    let name = unique("renewed");
    let ttl = ms(600);
    let a = lease(s, "holder-a");
    let b = &lease(s, "holder-b");
    let name = &name;
    let out = a
        .with_lease(name, ttl, |token| async move {
            sleep(ttl * 3).await;
            let other = b.try_acquire(name, ttl).await.unwrap();
            (token.is_cancelled(), other.is_some())
        })
        .await;
    assert_eq!(
        out.ran(),
        Some((false, false)),
        "lease must be renewed and stay exclusive"
    );
}

// ---------------------------------------------------------------- subjects

struct MemorySubject(Memory);

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

    fn with_table(&self, _table: &str) -> Option<Result<Memory, Error>> {
        None
    }
}

async fn memory() -> Option<MemorySubject> {
    Some(MemorySubject(Memory::new()))
}

/// A table backend; `steal` rewrites its row with SQL, as an operator would.
struct TableSubject<B> {
    backend: B,
    /// `UPDATE` that makes the thief the holder of the name with the next
    /// fence, for a minute; binds name then thief, or thief then name.
    steal_sql: String,
    thief_first: bool,
    /// Keeps the SQLite file alive for the test.
    _file: Option<TempDb>,
}

impl<B: Backend + Clone> TableSubject<B> {
    fn new(backend: B, table: &str, steal_template: &str, file: Option<TempDb>) -> Self {
        let thief_first = !steal_template.contains("$1") && !steal_template.contains("?1");
        Self {
            backend,
            steal_sql: steal_template.replace("{table}", table),
            thief_first,
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

            fn with_table(&self, table: &str) -> Option<Result<$backend, Error>> {
                Some(self.backend.clone().with_table(table))
            }
        }
    };
}
table_subject!(PgTable);
table_subject!(MySqlTable);
table_subject!(SqliteTable);

async fn sqlite() -> Option<TableSubject<SqliteTable>> {
    let file = TempDb::new("conformance");
    let table = SqliteTable::open(file.path())
        .await
        .expect("open sqlite file");
    let steal = "UPDATE {table} SET holder = ?2, fence = fence + 1, \
                 expires_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 60000 \
                 WHERE name = ?1";
    Some(TableSubject::new(
        table.clone(),
        table.table(),
        steal,
        Some(file),
    ))
}

async fn postgres() -> Option<TableSubject<PgTable>> {
    let table = PgTable::new(lease_tests::postgres().await?);
    table.ensure_schema().await.expect("ensure_schema");
    let steal = "UPDATE {table} SET holder = $2, fence = fence + 1, \
                 expires_at = clock_timestamp() + interval '1 minute' WHERE name = $1";
    Some(TableSubject::new(table.clone(), table.table(), steal, None))
}

async fn mysql() -> Option<TableSubject<MySqlTable>> {
    let table = MySqlTable::new(lease_tests::mysql().await?);
    table.ensure_schema().await.expect("ensure_schema");
    let steal = "UPDATE {table} SET fence = fence + 1, holder = ?, \
                 expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE WHERE name = ?";
    Some(TableSubject::new(table.clone(), table.table(), steal, None))
}

/// `PgAdvisory`: no fencing token and no expiry (see [`Caps`]). The only way
/// to take an advisory lock from its holder is to end the holder's session,
/// so `steal` and `end_session` terminate it (found in `pg_locks`) from
/// another connection.
struct PgAdvisorySubject {
    backend: PgAdvisory,
    /// A pool of its own, to look at and terminate the backend's sessions.
    admin: sqlx::PgPool,
}

impl PgAdvisorySubject {
    /// Pids of the sessions holding the advisory lock of `name`.
    async fn holders(&self, name: &str) -> Vec<i32> {
        sqlx::query_scalar(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
             AND classid::int8 = (($1::int8 >> 32) & 4294967295) \
             AND objid::int8 = ($1::int8 & 4294967295)",
        )
        .bind(PgAdvisory::sqlx_key(name))
        .fetch_all(&self.admin)
        .await
        .expect("query pg_locks")
    }
}

impl Subject for PgAdvisorySubject {
    type B = PgAdvisory;

    fn backend(&self) -> PgAdvisory {
        self.backend.clone()
    }

    fn caps(&self) -> Caps {
        Caps {
            fencing: false,
            expires: false,
        }
    }

    async fn steal(&self, name: &str, thief: &str) {
        self.end_session(name).await;
        self.backend
            .acquire(name, thief, Duration::from_secs(60))
            .await
            .expect("acquire")
            .expect("free once its session ended");
    }

    fn with_table(&self, _table: &str) -> Option<Result<PgAdvisory, Error>> {
        None
    }

    async fn end_session(&self, name: &str) {
        let pids = self.holders(name).await;
        assert!(!pids.is_empty(), "nobody holds {name:?}");
        for pid in pids {
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&self.admin)
                .await
                .expect("pg_terminate_backend");
        }
        let deadline = Instant::now() + ms(5_000);
        while !self.holders(name).await.is_empty() {
            assert!(
                Instant::now() < deadline,
                "terminated session kept its lock"
            );
            sleep(ms(10)).await;
        }
    }
}

async fn pg_advisory() -> Option<PgAdvisorySubject> {
    let admin = lease_tests::postgres().await?;
    // One connection per held lock: room for 16 contenders and `names_are_data`.
    let pool = lease_tests::postgres_with(PgPoolOptions::new().max_connections(40)).await?;
    Some(PgAdvisorySubject {
        backend: PgAdvisory::new(pool),
        admin,
    })
}

/// `Redis`: `steal` overwrites the lock key and bumps the fence counter;
/// in the Go locker's protocol (`go`), it overwrites the lock key's token.
struct RedisSubject {
    backend: Redis,
    pool: lease::deadpool_redis::Pool,
    go: bool,
}

impl Subject for RedisSubject {
    type B = Redis;

    fn backend(&self) -> Redis {
        self.backend.clone()
    }

    fn caps(&self) -> Caps {
        Caps {
            fencing: !self.go,
            ..TABLE_LIKE
        }
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
        let () = ::redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(self.backend.lock_key(name))
            .arg(thief)
            .arg("PX")
            .arg(60_000)
            .ignore()
            .cmd("INCR")
            .arg(self.backend.fence_key(name))
            .ignore()
            .query_async(&mut conn)
            .await
            .expect("steal");
    }

    fn with_table(&self, _table: &str) -> Option<Result<Redis, Error>> {
        None
    }
}

async fn redis() -> Option<RedisSubject> {
    let pool = lease_tests::redis().await?;
    Some(RedisSubject {
        backend: Redis::new(pool.clone()),
        pool,
        go: false,
    })
}

/// `Redis` in the Go locker's protocol, with a prefix of its own.
async fn redis_go_locker() -> Option<RedisSubject> {
    let pool = lease_tests::redis().await?;
    let backend = Redis::new(pool.clone())
        .with_prefix("lease-go-locker:")
        .expect("valid")
        .with_go_locker_protocol();
    Some(RedisSubject {
        backend,
        pool,
        go: true,
    })
}

// ---------------------------------------------------------------- the matrix

macro_rules! conformance {
    ($backend:ident, $subject:expr, [$($property:ident),* $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $property() {
                    lease_tests::init_tracing();
                    if let Some(subject) = $subject.await {
                        super::$property(&subject).await;
                    }
                }
            )*
        }
    };
    ($backend:ident, $subject:expr) => {
        conformance!($backend, $subject, [
            exclusive_between_two_holders,
            idempotent_reacquire_keeps_the_fence,
            takeover_after_expiry_has_a_larger_fence,
            renew_fails_after_takeover_release_and_expiry,
            renew_never_inserts,
            release_by_a_non_holder_is_a_no_op,
            fences_strictly_increase,
            names_are_data,
            invalid_input_is_rejected,
            table_names_are_validated,
            one_winner_among_sixteen_contenders,
            one_runner_among_sixteen_with_lease,
            a_stolen_lease_cancels_the_token,
            a_dropped_guard_frees_the_lease,
            a_held_lease_is_renewed_past_its_ttl,
        ]);
    };
}

conformance!(memory, super::memory());
conformance!(sqlite, super::sqlite());
conformance!(postgres, super::postgres());
conformance!(mysql, super::mysql());
conformance!(pg_advisory, super::pg_advisory());
conformance!(redis, super::redis());
conformance!(redis_go_locker, super::redis_go_locker());
