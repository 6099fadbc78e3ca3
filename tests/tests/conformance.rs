//! The conformance suite: every property of a backend, written once, run
//! against every backend.
//!
//! Each property is a generic `async fn` over a [`Subject`] (a backend plus
//! the few test-only powers the suite needs, such as rewriting a lease behind
//! the holder's back). The `conformance!` macro at the bottom instantiates
//! each property as a `#[tokio::test]` per backend, `<backend>::<property>`,
//! so a new backend gets every check by adding one `conformance!` line and a
//! `Subject` impl.
//!
//! Backends differ in a few ways, and each difference is a capability:
//!
//! - **Fencing and expiry** ([`Caps`]). The `every` group of properties
//!   runs on every backend; where a backend lacks one of these, the property
//!   asserts what that backend does instead rather than skipping. Today that is `PgAdvisory`:
//!   it has no fencing token (unless `with_fencing`: the `pg_advisory_fenced`
//!   subject), and no server-side expiry — a lock that nobody
//!   renews stays held for as long as its holder's session lives, and is
//!   taken over once that session ends ([`Subject::end_session`], used by
//!   [`lapse`]).
//! - **Waking waiters and naming holders** ([`Caps`]). Where the server
//!   pushes releases (PostgreSQL `NOTIFY`, Redis `PUBLISH` — the Redis
//!   subjects subscribe, `Redis::with_pubsub`), a waiter must have a
//!   released lease about one round trip after the release, faster than
//!   any poll; elsewhere within a poll. What an election's `Following {
//!   leader }` shows is what the backend's `inspect` can name.
//! - **Tables** ([`TableBackend`]: `with_table`, `ensure_schema`, input
//!   checks on direct calls). The `tables` group of properties needs them,
//!   and the macro instantiates it for the table backends only.
//! - **Thousands of leases at once.** The `many_leases` group holds more
//!   leases than one batched statement takes; the macro leaves it out for
//!   `PgAdvisory`, which holds one pool connection per lease.
//!
//! What only one backend or server does (SQLite's busy handling, MySQL's
//! lock wait timeouts, rows as stored) is checked in `sql_backends.rs` and
//! `lock_backends.rs`.

// The properties are test code called by the generated `#[tokio::test]`s,
// which `allow-unwrap-in-tests` (clippy.toml) does not see as tests.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::{StreamExt, stream};
use lease::backend::{Etcd, Memory, MySqlTable, PgAdvisory, PgTable, Redis, SqliteTable};
use lease::{Acquisition, Backend, Election, Error, Grant, Leadership, Lease, Outcome, Skip};
use lease_tests::{TempDb, unique};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

/// How a backend's guarantees differ from the table backends'.
#[derive(Debug, Clone, Copy)]
struct Caps {
    /// Acquisitions carry a fencing token: 1 for the first acquisition of a
    /// name, one more for each later one, unchanged by an idempotent
    /// re-acquire. When false (`PgAdvisory`), every token is `None`, and
    /// renew and release match name and holder only.
    fencing: bool,
    /// The server expires a lease that is not renewed within its ttl. When
    /// false (`PgAdvisory`), a lease lives as long as its holder's session
    /// and ends when that session does ([`Subject::end_session`]).
    expires: bool,
    /// The server pushes releases to waiters ([`Backend::released`]): a
    /// waiter has a released lease about one round trip after the
    /// release. When false, waiters poll (every `ttl/10`, at most 1 s).
    pushes: bool,
    /// Whom `Backend::inspect` names as the holder of a live lease, which
    /// is what an election's `Leadership::Following { leader }` shows.
    leader: Naming,
}

/// Whom `Backend::inspect` names as the holder of a live lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// The holder, whoever took it.
    Holder,
    /// The holder if it acquired through this backend value (or a clone),
    /// else nobody: in the Go locker's protocol the lock's value is a
    /// random token, which only the acquiring backend value can map back.
    OwnHolders,
    /// The server session that holds it (`PgAdvisory`: `... (pid N)`).
    Session,
}

/// Memory, SQLite and MySQL: fencing, expiry, polling waiters.
const TABLE_LIKE: Caps = Caps {
    fencing: true,
    expires: true,
    pushes: false,
    leader: Naming::Holder,
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

    /// How long after an acquisition with `ttl` (not renewed) the server
    /// may still hold the lease: `ttl` where the server expires exactly
    /// (give or take its clock), longer where it rounds the ttl up (etcd:
    /// whole seconds, and an expiry check every 500 ms).
    fn expiry(&self, ttl: Duration) -> Duration {
        ttl
    }

    /// The thief of [`steal`](Subject::steal) lets the lease go: by
    /// default it releases it through the backend, as a holder would.
    fn let_go(&self, name: &str, thief: &str) -> impl Future<Output = ()> + Send {
        let (b, name, thief) = (self.backend(), name.to_owned(), thief.to_owned());
        async move { release_as(&b, &name, &thief).await }
    }

    /// For backends without expiry: end the session of whoever holds `name`
    /// (as a crash or `pg_terminate_backend` would), and return once the
    /// server has freed the name.
    fn end_session(&self, name: &str) -> impl Future<Output = ()> + Send {
        let _ = name;
        async { panic!("only a backend without expiry has sessions to end") }
    }
}

/// What the `tables` properties need beyond `Backend`: the inherent API of
/// the table backends.
trait TableBackend: Backend + Clone + std::fmt::Debug {
    fn with_table(self, table: &str) -> Result<Self, Error>;
    fn table(&self) -> &str;
    fn ensure_schema(&self) -> impl Future<Output = Result<(), Error>> + Send;
    /// Drops this backend's table (to clean up tables made by a test).
    fn drop_table(&self) -> impl Future<Output = ()> + Send;
    /// The clock the backend's statements read (the database server's; the
    /// host's for SQLite), now, in microseconds since the Unix epoch — read
    /// the way the statements read it.
    fn server_now_us(&self) -> impl Future<Output = i64> + Send;
    /// `expires_at` of `name`'s row, in microseconds since the Unix epoch.
    fn expires_at_us(&self, name: &str) -> impl Future<Output = i64> + Send;
}

/// `table_backend!(type, now, expires_at)`: `now` reads the backend's
/// clock, `expires_at` a row's expiry (binding the name), both in
/// microseconds since the Unix epoch.
macro_rules! table_backend {
    ($($t:ty, $now:expr, $expires_at:expr;)*) => {$(
        impl TableBackend for $t {
            fn with_table(self, table: &str) -> Result<Self, Error> {
                <$t>::with_table(self, table)
            }
            fn table(&self) -> &str {
                <$t>::table(self)
            }
            fn ensure_schema(&self) -> impl Future<Output = Result<(), Error>> + Send {
                <$t>::ensure_schema(self)
            }
            fn drop_table(&self) -> impl Future<Output = ()> + Send {
                // Test code: the name was validated by `with_table`.
                let sql = format!("DROP TABLE IF EXISTS {}", self.table());
                let pool = self.pool().clone();
                async move {
                    sqlx::query(AssertSqlSafe(sql)).execute(&pool).await.expect("drop table");
                }
            }
            fn server_now_us(&self) -> impl Future<Output = i64> + Send {
                let pool = self.pool().clone();
                async move {
                    sqlx::query_scalar::<_, i64>($now)
                        .fetch_one(&pool)
                        .await
                        .expect("read the server's clock")
                }
            }
            fn expires_at_us(&self, name: &str) -> impl Future<Output = i64> + Send {
                // Test code: the name was validated by `with_table`.
                let sql = format!($expires_at, table = self.table());
                let (pool, name) = (self.pool().clone(), name.to_owned());
                async move {
                    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                        .bind(name)
                        .fetch_one(&pool)
                        .await
                        .expect("read expires_at")
                }
            }
        }
    )*};
}
table_backend!(
    PgTable,
    "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::int8",
    "SELECT (EXTRACT(EPOCH FROM expires_at) * 1000000)::int8 FROM {table} WHERE name = $1";
    // A `DATETIME(6)` column in UTC (`ensure_schema`), written with `UTC_TIMESTAMP(6)`.
    MySqlTable,
    "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
    "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at) \
     FROM {table} WHERE name = ?";
    // Milliseconds of the host's clock, read by SQLite as the statements do.
    SqliteTable,
    "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000",
    "SELECT expires_at * 1000 FROM {table} WHERE name = ?1";
);

/// Release `name` as `holder`, with the fencing token `inspect` shows:
/// what a holder that did not keep its grant would do.
async fn release_as(b: &impl Backend, name: &str, holder: &str) {
    let info = b.inspect(name).await.expect("inspect");
    let fence = info.and_then(|i| i.fencing_token);
    b.release(Acquisition::new(name, holder, fence))
        .await
        .unwrap_or_else(|e| panic!("{holder}'s release of {name:?}: {e}"));
}

/// The acquisition `grant` was for.
fn acq<'a>(name: &'a str, holder: &'a str, grant: &Grant) -> Acquisition<'a> {
    Acquisition::new(name, holder, grant.fencing_token)
}

fn lease<S: Subject>(s: &S, holder: &str) -> Lease {
    Lease::with_holder(s.backend(), holder)
}

/// The fencing token of the `n`th acquisition of a name on `s`: `n`, or
/// `None` without fencing.
fn fence<S: Subject>(s: &S, n: u64) -> Option<u64> {
    s.caps().fencing.then_some(n)
}

/// `b.acquire`: `None` when another holder has the lease, else the fencing
/// token of the grant.
async fn acquire(b: &impl Backend, name: &str, holder: &str, ttl: Duration) -> Option<Option<u64>> {
    let grant = b
        .acquire(name, holder, ttl)
        .await
        .unwrap_or_else(|e| panic!("acquire {name:?} for {holder:?}: {e}"));
    grant.map(|g| g.fencing_token)
}

/// [`acquire`] of a lease that must be free; its fencing token.
async fn acquired(b: &impl Backend, name: &str, holder: &str, ttl: Duration) -> Option<u64> {
    acquire(b, name, holder, ttl)
        .await
        .unwrap_or_else(|| panic!("{holder} could not acquire {name}"))
}

/// `b.renew` of the acquisition of `name` by `holder` that got `fence`.
async fn renew(
    b: &impl Backend,
    name: &str,
    holder: &str,
    fence: Option<u64>,
    ttl: Duration,
) -> bool {
    b.renew(Acquisition::new(name, holder, fence), ttl)
        .await
        .expect("renew")
}

/// `b.release` of the acquisition of `name` by `holder` that got `fence`.
async fn release(b: &impl Backend, name: &str, holder: &str, fence: Option<u64>) {
    b.release(Acquisition::new(name, holder, fence))
        .await
        .expect("release");
}

const TTL: Duration = Duration::from_secs(2);
const LONG: Duration = Duration::from_secs(30);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Let the lease `holder` has on `name` (acquired with `ttl`, not renewed)
/// lapse, so that another holder can take it over.
///
/// With expiry: wait out the ttl, with a wide margin (the server's clock
/// decides). Without (`PgAdvisory`): the difference is that the lease
/// outlives its ttl — after the same wait it is still held and still
/// renewable by `holder` — and it is the end of the holder's session that
/// frees it.
async fn lapse<S: Subject>(s: &S, lease: Acquisition<'_>, ttl: Duration) {
    sleep(s.expiry(ttl) + ms(400)).await; // nobody renews
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

// ------------------------------------------------- properties of every backend

async fn exclusive_between_two_holders<S: Subject>(s: &S) {
    let name = unique("exclusive");
    let (a, b) = (lease(s, "holder-a"), lease(s, "holder-b"));
    let guard = a
        .try_acquire(&name, TTL)
        .await
        .unwrap()
        .expect("free lease");
    assert_eq!(guard.fencing_token(), fence(s, 1));
    assert!(
        b.try_acquire(&name, TTL).await.unwrap().is_none(),
        "b acquired a held lease"
    );
    let skipped = b.with_lease(&name, TTL, |_| async { "b ran" }).await;
    assert!(
        matches!(skipped, Outcome::Skipped(Skip::HeldElsewhere)),
        "{skipped:?}"
    );
    // Asked of the backend directly, whatever the ttl: refused too. The
    // failed attempts changed nothing: a still holds it, with its fence.
    let backend = s.backend();
    assert_eq!(acquire(&backend, &name, "holder-b", LONG).await, None);
    assert_eq!(acquire(&backend, &name, "holder-b", ms(10)).await, None);
    assert_eq!(
        acquire(&backend, &name, "holder-a", TTL).await,
        Some(fence(s, 1))
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
    assert_eq!(
        first.fencing_token,
        fence(s, 1),
        "a name's first acquisition"
    );
    for _ in 0..2 {
        let again = b
            .acquire(&name, "holder-a", TTL)
            .await
            .unwrap()
            .expect("same holder re-acquires");
        assert_eq!(first.fencing_token, again.fencing_token);
    }
    assert!(
        b.renew(acq(&name, "holder-a", &first), TTL).await.unwrap(),
        "re-acquires keep the acquisition"
    );
    assert!(b.acquire(&name, "holder-b", TTL).await.unwrap().is_none());
    b.release(acq(&name, "holder-a", &first)).await.unwrap();
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
    assert!(
        b.acquire(&name, "holder-b", LONG).await.unwrap().is_none(),
        "not expired yet"
    );
    lapse(s, acq(&name, "holder-a", &first), ttl).await;
    let second = b
        .acquire(&name, "holder-b", LONG)
        .await
        .unwrap()
        .expect("expired lease is free");
    assert_eq!(second.fencing_token, fence(s, 2));
    if s.caps().fencing {
        assert!(second.fencing_token.unwrap() > first.fencing_token.unwrap());
    }
    // The old holder lost it: it can neither renew, re-acquire nor release it.
    assert!(
        !b.renew(acq(&name, "holder-a", &first), LONG).await.unwrap(),
        "the old holder lost it"
    );
    assert_eq!(acquire(&b, &name, "holder-a", LONG).await, None);
    b.release(acq(&name, "holder-a", &first)).await.unwrap();
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 2)),
        "still b's"
    );
    b.release(acq(&name, "holder-b", &second)).await.unwrap();
}

async fn release_then_reacquire_increments_fence<S: Subject>(s: &S) {
    let name = unique("release-reacquire");
    let b = s.backend();
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 1))
    );
    release(&b, &name, "holder-a", fence(s, 1)).await;
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 2)),
        "a new acquisition"
    );
    release(&b, &name, "holder-a", fence(s, 2)).await;
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 3))
    );
    release(&b, &name, "holder-b", fence(s, 3)).await;
    release(&b, &name, "holder-b", fence(s, 3)).await; // twice: a no-op
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 4))
    );
}

/// Without expiry (`PgAdvisory`) the lease outlives its ttl anyway (see
/// [`lapse`]); the renewals must still succeed and keep the acquisition.
async fn renew_extends_a_live_lease<S: Subject>(s: &S) {
    let name = unique("renew-extends");
    let b = s.backend();
    let ttl = TTL;
    assert_eq!(acquire(&b, &name, "holder-a", ttl).await, Some(fence(s, 1)));
    sleep(ttl / 2).await;
    assert!(renew(&b, &name, "holder-a", fence(s, 1), ttl).await);
    // 1.2 ttls after acquiring: the original expiry has passed, the renewed
    // one not (0.3 ttls to spare).
    sleep(ttl * 7 / 10).await;
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        None,
        "renewal extended it"
    );
    assert!(renew(&b, &name, "holder-a", fence(s, 1), LONG).await);
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 1)),
        "renewals keep the fence"
    );
}

async fn renew_never_inserts<S: Subject>(s: &S) {
    let name = unique("renew-insert");
    let b = s.backend();
    for fence in [None, Some(1)] {
        let lease = Acquisition::new(&name, "holder-a", fence);
        assert!(!b.renew(lease, TTL).await.unwrap());
    }
    // Had renew inserted a lease, "b" would be refused or get a later fence.
    let g = b
        .acquire(&name, "holder-b", TTL)
        .await
        .unwrap()
        .expect("renew must not have created a lease");
    assert_eq!(g.fencing_token, fence(s, 1));
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
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 2)),
        "released means free"
    );

    let name = unique("renew-expiry");
    let a = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    let a = acq(&name, "holder-a", &a);
    lapse(s, a, ttl).await;
    assert!(
        !b.renew(a, TTL).await.unwrap(),
        "renewed an expired lease: no silent re-acquire after a gap"
    );
    // ...and the failed renewal did not bring it back.
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 2)),
        "the failed renew kept it expired"
    );

    // An expired lease re-acquired by its old holder is a new acquisition.
    let name = unique("reacquire-expired");
    let a = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    lapse(s, acq(&name, "holder-a", &a), ttl).await;
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 2))
    );
}

/// Renewing or releasing a lease one does not hold — held by another
/// holder, never acquired, or expired — changes nothing.
async fn renew_and_release_by_a_non_holder_do_nothing<S: Subject>(s: &S) {
    let name = unique("non-holder");
    let b = s.backend();
    let a = b
        .acquire(&name, "holder-a", LONG)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(a.fencing_token, fence(s, 1));
    // Another holder, with the fence of a's acquisition: only the holder differs.
    assert!(!b.renew(acq(&name, "holder-b", &a), LONG).await.unwrap());
    b.release(acq(&name, "holder-b", &a)).await.unwrap();
    // A name nobody ever acquired.
    b.release(Acquisition::new(&unique("never-seen"), "holder-b", Some(1)))
        .await
        .unwrap();
    b.release(Acquisition::new(&unique("never-seen"), "holder-b", None))
        .await
        .unwrap();
    assert!(
        b.acquire(&name, "holder-b", TTL).await.unwrap().is_none(),
        "a stranger released our lease"
    );
    assert!(b.renew(acq(&name, "holder-a", &a), TTL).await.unwrap());
    assert_eq!(
        acquire(&b, &name, "holder-a", LONG).await,
        Some(fence(s, 1)),
        "still a's acquisition"
    );

    // An expired lease: its old holder's release is a no-op too.
    let name = unique("release-expired");
    let ttl = ms(300);
    let a = b
        .acquire(&name, "holder-a", ttl)
        .await
        .unwrap()
        .expect("free");
    lapse(s, acq(&name, "holder-a", &a), ttl).await;
    match b.release(acq(&name, "holder-a", &a)).await {
        Ok(()) => {}
        // Without expiry the lease ended with its holder's session, and
        // `PgAdvisory` unlocks on that session's connection: it reports the
        // session's end ("terminating connection") as a database error.
        Err(Error::Database(_)) if !s.caps().expires => {}
        Err(e) => panic!("release of an expired lease: {e}"),
    }
    assert_eq!(
        acquire(&b, &name, "holder-b", LONG).await,
        Some(fence(s, 2))
    );
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
        // Quotes, SQL, `LIKE` wildcards, escapes, format braces, key separators.
        "it's",
        "it''s",
        "\"quoted\"",
        "it's \"quoted\" `x`",
        "'; drop table task_leases; --",
        "'); DROP TABLE task_leases; --",
        "100%",
        "100_",
        "1000",
        "1_0",
        "10",
        "%_",
        "a\\b",
        "a\\\\b",
        "back\\slash",
        "back\\\\slash",
        "{braces}",
        "{",
        "}x",
        "{}",
        "{table}",
        "x:fence",
        // Case, whitespace, Unicode (é, and e + combining acute: another
        // spelling of é).
        "Case",
        "case",
        "x",
        "X",
        "x ",
        " x",
        "trailing ",
        "trailing",
        "e",
        "é",
        "e\u{301}",
        "🦀",
        "🦀🦀",
        "🦀 crab",
    ]
    .iter()
    .map(|n| format!("{tag}-{n}"))
    .collect();
    // Exactly 255 bytes, ending in a 4-byte character.
    let mut long = format!("{tag}-");
    while long.len() < 251 {
        long.push('x');
    }
    long.push('🦀');
    assert_eq!(long.len(), 255);
    names.push(long);
    // 255 bytes, the same less its last byte, and the same first 253 bytes
    // followed by a 2-byte character: a server that truncated names would
    // make them collide.
    let mut padded = format!("{tag}-");
    while padded.len() < 255 {
        padded.push('z');
    }
    names.push(padded[..254].to_owned());
    names.push(format!("{}é", &padded[..253]));
    names.push(padded);

    // Every name held at once, each by a holder of its own: two names that
    // collided would refuse one holder, or hand it a later fence.
    let b = s.backend();
    let holders: Vec<String> = (0..names.len()).map(|i| format!("holder-{i}")).collect();
    for (name, holder) in names.iter().zip(&holders) {
        assert_eq!(
            acquire(&b, name, holder, LONG).await,
            Some(fence(s, 1)),
            "{name:?} is new"
        );
    }
    for (name, holder) in names.iter().zip(&holders) {
        assert_eq!(acquire(&b, name, "intruder", LONG).await, None, "{name:?}");
        assert!(renew(&b, name, holder, fence(s, 1), LONG).await, "{name:?}");
        release(&b, name, holder, fence(s, 1)).await;
        assert_eq!(
            acquire(&b, name, holder, LONG).await,
            Some(fence(s, 2)),
            "{name:?}"
        );
    }
    // Releasing one name released no other (`%` and `_` are no wildcards).
    for (name, holder) in names.iter().zip(&holders) {
        assert!(renew(&b, name, holder, fence(s, 2), LONG).await, "{name:?}");
        release(&b, name, holder, fence(s, 2)).await;
    }

    // The same names through `Lease`.
    let a = lease(s, "holder-a");
    let b = lease(s, "holder-b");
    let mut guards = Vec::new();
    for name in &names {
        let g = a
            .try_acquire(name, TTL)
            .await
            .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        guards.push(g.unwrap_or_else(|| panic!("{name:?} was not released")));
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

async fn holders_are_compared_exactly<S: Subject>(s: &S) {
    let b = s.backend();
    let name = unique("holders");
    assert_eq!(acquire(&b, &name, "pod", LONG).await, Some(fence(s, 1)));
    for other in ["POD", "pod ", " pod", "pöd", "po", "pod\t"] {
        assert_eq!(acquire(&b, &name, other, LONG).await, None, "{other:?}");
        assert!(
            !renew(&b, &name, other, fence(s, 1), LONG).await,
            "{other:?}"
        );
        release(&b, &name, other, fence(s, 1)).await;
    }
    assert!(renew(&b, &name, "pod", fence(s, 1), LONG).await);
    assert_eq!(acquire(&b, &name, "pod", LONG).await, Some(fence(s, 1)));
    let long = "h".repeat(255);
    let name = unique("holders-long");
    assert_eq!(acquire(&b, &name, &long, LONG).await, Some(fence(s, 1)));
    assert_eq!(acquire(&b, &name, &long[..254], LONG).await, None);
    assert!(renew(&b, &name, &long, fence(s, 1), LONG).await);
}

/// Through [`Lease`], which checks its input before calling any backend.
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

/// `n` holders race for `name` at once; the grants, one per holder.
async fn race<B: Backend + Clone>(
    b: &B,
    name: &str,
    n: usize,
    ttl: Duration,
) -> Vec<Option<Option<u64>>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks = (0..n).map(|i| {
        let (b, name, barrier) = (b.clone(), name.to_owned(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            b.acquire(&name, &format!("racer-{i}"), ttl).await
        })
    });
    join_all(tasks)
        .await
        .into_iter()
        .map(|r| {
            let grant = r
                .expect("task")
                .expect("acquire must not fail under contention");
            grant.map(|g| g.fencing_token)
        })
        .collect()
}

async fn concurrent_acquire_of_a_new_name_has_one_winner<S: Subject>(s: &S) {
    let b = s.backend();
    for round in 0..5 {
        let name = unique("new-name-race");
        let grants = race(&b, &name, 16, LONG).await;
        let winners: Vec<_> = grants.iter().flatten().collect();
        assert_eq!(winners, [&fence(s, 1)], "round {round}: {grants:?}");
    }
}

async fn concurrent_takeover_of_an_expired_lease_has_one_winner<S: Subject>(s: &S) {
    let b = s.backend();
    let name = unique("takeover-race");
    let ttl = ms(100);
    let first = acquired(&b, &name, "first", ttl).await;
    assert_eq!(first, fence(s, 1));
    lapse(s, Acquisition::new(&name, "first", first), ttl).await;
    let grants = race(&b, &name, 16, LONG).await;
    let winners: Vec<_> = grants.iter().flatten().collect();
    assert_eq!(winners, [&fence(s, 2)], "{grants:?}");
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
    let ttl = TTL;
    let a = lease(s, "holder-a");
    let b = &lease(s, "holder-b");
    let name = &name;
    let out = a
        .with_lease(name, ttl, |token| async move {
            sleep(ttl * 3 / 2).await;
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

/// `Backend::renew_many` with one batch that mixes live, expired, stolen,
/// released, superseded and never-existing names: which acquisitions are
/// current and live must come back `true`, in order, and only those must be
/// extended; nothing is inserted.
async fn each_lease_learns_its_own_fate<S: Subject>(s: &S) {
    let b = s.backend();
    let holder = unique("holder");
    let thief = unique("thief");
    // `live_short` must still be held when the batch is sent, and expire
    // (but for the batch) soon after.
    let short = TTL.max(s.expiry(ms(50)) * 2);
    let name = |what: &str| unique(&format!("renew-many-{what}"));
    let (live, live_short, other_ttl) = (name("live"), name("live-short"), name("other-ttl"));
    let (expired, stolen, released, never, superseded) = (
        name("expired"),
        name("stolen"),
        name("released"),
        name("never"),
        name("superseded"),
    );
    let f_live = acquired(&b, &live, &holder, LONG).await;
    let t_live_short = Instant::now();
    let f_live_short = acquired(&b, &live_short, &holder, short).await;
    let f_other_ttl = acquired(&b, &other_ttl, &holder, LONG).await;
    let f_expired = acquired(&b, &expired, &holder, ms(50)).await;
    let f_stolen = acquired(&b, &stolen, &holder, ms(50)).await;
    let f_released = acquired(&b, &released, &holder, LONG).await;
    release(&b, &released, &holder, f_released).await;
    // An older acquisition of a name the same holder holds again.
    let f_old = acquired(&b, &superseded, &holder, LONG).await;
    release(&b, &superseded, &holder, f_old).await;
    let f_new = acquired(&b, &superseded, &holder, LONG).await;
    sleep(s.expiry(ms(50)) + ms(150)).await; // `expired` and `stolen` expire
    if !s.caps().expires {
        // No expiry: they end with their sessions instead (see `lapse`).
        s.end_session(&expired).await;
        s.end_session(&stolen).await;
    }
    acquired(&b, &stolen, &thief, LONG).await;

    let batch = [
        (Acquisition::new(&live, &holder, f_live), LONG),
        (Acquisition::new(&expired, &holder, f_expired), LONG),
        (Acquisition::new(&live_short, &holder, f_live_short), LONG),
        (Acquisition::new(&stolen, &holder, f_stolen), LONG),
        (Acquisition::new(&never, &holder, f_live), LONG),
        (
            Acquisition::new(&other_ttl, &holder, f_other_ttl),
            ms(20_000),
        ),
        (Acquisition::new(&released, &holder, f_released), LONG),
        (Acquisition::new(&superseded, &holder, f_old), LONG),
    ];
    // Without fencing tokens, an older acquisition of a name its holder
    // holds again cannot be told from the newer one: name and holder match.
    let superseded_renewed = !s.caps().fencing;
    let expected = [
        true,
        false,
        true,
        false,
        false,
        true,
        false,
        superseded_renewed,
    ];
    let renewed = b.renew_many(&batch).await.unwrap();
    assert_eq!(renewed, expected);
    // The newer acquisition is still the current one.
    assert!(renew(&b, &superseded, &holder, f_new, LONG).await);

    // `live_short` was extended past its first ttl.
    tokio::time::sleep_until(t_live_short + s.expiry(short) + ms(200)).await;
    assert_eq!(
        acquire(&b, &live_short, &thief, LONG).await,
        None,
        "renew_many must have extended the lease"
    );
    // Nothing was renewed for the thief or inserted for us.
    assert_eq!(acquire(&b, &stolen, &holder, LONG).await, None);
    acquired(&b, &never, &thief, LONG).await;
    acquired(&b, &expired, &thief, LONG).await;
    acquired(&b, &released, &thief, LONG).await;
    // The holder's answers stay per lease on the next batch too.
    let renewed = b.renew_many(&batch).await.unwrap();
    assert_eq!(renewed, expected);
    assert_eq!(b.renew_many(&[]).await.unwrap(), Vec::<bool>::new());
    // All ours and live (MySQL answers from the matched-row count alone).
    let all_ours = [
        (Acquisition::new(&live, &holder, f_live), LONG),
        (Acquisition::new(&other_ttl, &holder, f_other_ttl), LONG),
    ];
    assert_eq!(b.renew_many(&all_ours).await.unwrap(), [true, true]);
}

// ------------------------------------------ properties of fenced backends

/// A late copy of the release of an older acquisition (the network
/// delivered it after the same holder acquired the name again) must not end
/// the newer acquisition: release concerns one acquisition, told apart by
/// its fencing token. (Backends without fencing tokens cannot tell the two
/// acquisitions of one holder apart; `late_release.rs` plays the story
/// through a fault proxy on the servers.)
async fn a_late_release_leaves_a_newer_acquisition<S: Subject>(s: &S) {
    assert!(s.caps().fencing, "for backends with fencing tokens");
    let b = s.backend();
    let name = unique("late-release");
    let first = acquired(&b, &name, "holder-a", LONG).await;
    release(&b, &name, "holder-a", first).await;
    let second = acquired(&b, &name, "holder-a", LONG).await;
    assert_ne!(first, second);
    release(&b, &name, "holder-a", first).await; // the late copy
    assert!(
        renew(&b, &name, "holder-a", second, LONG).await,
        "the newer acquisition must still be held"
    );
    assert_eq!(acquire(&b, &name, "holder-b", LONG).await, None);
    release(&b, &name, "holder-a", second).await;
    acquired(&b, &name, "holder-b", LONG).await;
}

// ------------------------------------------------- waiting and elections

/// How long a waiter has waited when the holder lets go, in the hand-over
/// properties: long enough to have tried once and gone to sleep.
const WAITED: Duration = Duration::from_millis(200);

/// A hand-over faster than this came from a push. A polling waiter sleeps
/// at least 0.8 of its poll (1 s for [`LONG`]) from before its first
/// attempt, so it would have the lease 0.6 s after the release at the
/// earliest ([`WAITED`] of its sleep was over).
const PUSHED: Duration = Duration::from_millis(400);

/// Slack for a loaded machine, on top of a poll.
const SLACK: Duration = Duration::from_secs(1);

/// The longest poll of a waiter for `ttl` (`Lease::acquire`: `ttl/10`,
/// from 10 ms to 1 s, +20% at most).
fn poll_max(ttl: Duration) -> Duration {
    (ttl / 10).clamp(ms(10), ms(1_000)) * 6 / 5
}

/// How soon after a release (after [`WAITED`]) a waiter for `ttl` must
/// have the lease on `s`: faster than any poll where the server pushes,
/// else within a poll plus [`SLACK`] — a small part of the ttl either way.
fn hand_over_bound<S: Subject>(s: &S, ttl: Duration) -> Duration {
    if s.caps().pushes {
        PUSHED
    } else {
        poll_max(ttl) + SLACK
    }
}

/// What a hand-over's bound stands for, for the failure message.
fn hand_over_kind<S: Subject>(s: &S) -> &'static str {
    if s.caps().pushes {
        "the server pushes releases: a polling waiter would take 0.6 s or more"
    } else {
        "about a poll"
    }
}

/// Where the server pushes releases, have the subject's backend subscribe
/// (one wait for a held lease, which answers `None`), so that the
/// hand-overs after it are timed against a subscription that is up. A
/// backend subscribes when its first waiter waits, and keeps the
/// subscription until 10 s after its last one; a release while it is
/// still connecting reaches the waiters when it is up (it wakes every
/// waiter once) — on a loaded machine that can be a few hundred ms, which
/// is the connect's time, not the hand-over's.
async fn subscribe<S: Subject>(s: &S) {
    if !s.caps().pushes {
        return;
    }
    let name = unique("subscribe");
    let held = lease(s, "holder-x")
        .try_acquire(&name, LONG)
        .await
        .unwrap()
        .expect("free");
    let waited = lease(s, "holder-y")
        .acquire(&name, LONG, ms(300))
        .await
        .unwrap();
    assert!(waited.is_none(), "got a held lease");
    held.release().await.unwrap();
}

/// `state` is `Following` and names `holder` as far as the backend can
/// ([`Naming`]); `own`: `holder` acquired through the subject's backend.
fn assert_follows<S: Subject>(s: &S, state: &Leadership, holder: &str, own: bool) {
    let Leadership::Following { leader } = state else {
        panic!("not following: {state:?}");
    };
    match s.caps().leader {
        Naming::Holder => assert_eq!(leader.as_deref(), Some(holder), "{state:?}"),
        Naming::OwnHolders if own => assert_eq!(leader.as_deref(), Some(holder), "{state:?}"),
        Naming::OwnHolders => assert_eq!(*leader, None, "{state:?}"),
        Naming::Session => assert!(
            leader.as_deref().is_some_and(|l| l.contains("pid ")),
            "the holding session: {state:?}"
        ),
    }
}

/// Whether `state` follows `holder` as [`assert_follows`] requires. An
/// election that could not ask who leads (an `inspect` that failed or timed
/// out, on a loaded machine) follows `None` until its next attempt asks
/// again: tests wait for this, then assert.
fn follows_as_named<S: Subject>(s: &S, state: &Leadership, holder: &str, own: bool) -> bool {
    let Leadership::Following { leader } = state else {
        return false;
    };
    match s.caps().leader {
        Naming::Holder => leader.as_deref() == Some(holder),
        Naming::OwnHolders if own => leader.as_deref() == Some(holder),
        Naming::OwnHolders => leader.is_none(),
        Naming::Session => leader.as_deref().is_some_and(|l| l.contains("pid ")),
    }
}

/// Watches two elections of one name until both have stopped; ends with
/// an error the first time it sees both `Leading` (a stopped election's
/// last state counts). A state is read again after the other one, so that
/// a hand-over between the two reads is not taken for an overlap.
fn never_two_leaders(a: &Election, b: &Election) -> JoinHandle<Result<(), String>> {
    let (mut a, mut b) = (a.watch(), b.watch());
    tokio::spawn(async move {
        let leading = |s: &Leadership| matches!(s, Leadership::Leading { .. });
        let (mut a_runs, mut b_runs) = (true, true);
        while a_runs || b_runs {
            let first = a.borrow_and_update().clone();
            let second = b.borrow_and_update().clone();
            if leading(&first) && leading(&second) && *a.borrow() == first {
                return Err(format!("both lead: {first:?} and {second:?}"));
            }
            tokio::select! {
                changed = a.changed(), if a_runs => a_runs = changed.is_ok(),
                changed = b.changed(), if b_runs => b_runs = changed.is_ok(),
            }
        }
        Ok(())
    })
}

/// The verdict of [`never_two_leaders`], once both elections have stopped.
async fn check_one_leader(monitor: JoinHandle<Result<(), String>>) {
    let verdict = timeout(SLACK, monitor)
        .await
        .expect("the elections stop after resigning");
    verdict.unwrap().unwrap();
}

/// A waiter in `Lease::acquire` has a released lease at once: about one
/// round trip after the release where the server pushes it, within a poll
/// elsewhere — long before the ttl (30 s) would have freed it. Both ways
/// between two holders.
async fn a_waiter_has_a_released_lease_at_once<S: Subject>(s: &S) {
    let name = unique("wait-hand-over");
    let (a, b) = (lease(s, "holder-a"), lease(s, "holder-b"));
    let bound = hand_over_bound(s, LONG);
    subscribe(s).await;
    let mut held = a.try_acquire(&name, LONG).await.unwrap().expect("free");
    for (round, waiter) in [b, a].into_iter().enumerate() {
        let wanted = name.clone();
        let waiting = tokio::spawn(async move {
            let got = waiter.acquire(&wanted, LONG, LONG / 2).await;
            (got, Instant::now())
        });
        sleep(WAITED).await;
        assert!(!waiting.is_finished(), "round {round}: got a held lease");
        let before = held.fencing_token();
        held.release().await.unwrap();
        let released = Instant::now();
        let (got, at) = waiting.await.unwrap();
        held = got
            .unwrap()
            .expect("the waiter has the lease within its wait");
        let took = at.saturating_duration_since(released);
        eprintln!("round {round}: hand-over in {took:?}");
        assert!(
            took < bound,
            "round {round}: the hand-over took {took:?}, not under {bound:?} ({})",
            hand_over_kind(s)
        );
        if s.caps().fencing {
            assert!(held.fencing_token() > before, "a new acquisition");
        }
    }
    held.release().await.unwrap();
}

/// A wait that runs out while another holds the lease answers `None` after
/// the wait, and changes nothing; a wait that is dropped leaves nothing
/// behind.
async fn a_wait_runs_out_while_another_holds<S: Subject>(s: &S) {
    let name = unique("wait-timeout");
    let (a, b) = (lease(s, "holder-a"), lease(s, "holder-b"));
    let held = a.try_acquire(&name, LONG).await.unwrap().expect("free");
    let wait = ms(700);
    let started = Instant::now();
    assert!(b.acquire(&name, LONG, wait).await.unwrap().is_none());
    let took = started.elapsed();
    assert!(took >= wait, "gave up after {took:?}, before its wait");
    assert!(
        took < wait + SLACK,
        "gave up {took:?} after a wait of {wait:?}"
    );
    // A zero wait is one attempt.
    assert!(
        b.acquire(&name, LONG, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert!(held.is_valid() && !held.token().is_cancelled());
    assert!(
        timeout(ms(200), b.acquire(&name, LONG, LONG))
            .await
            .is_err()
    );
    held.release().await.unwrap();
    let c = lease(s, "holder-c");
    let g = c
        .try_acquire(&name, LONG)
        .await
        .unwrap()
        .expect("the waits left the lease to its holder, and nothing after its release");
    if s.caps().fencing {
        assert_eq!(g.fencing_token(), fence(s, 2));
    }
    g.release().await.unwrap();
}

/// A holder that crashed (it acquired, and nothing renews or releases its
/// lease) blocks a waiter until its lease ends — at the ttl, or, without
/// expiry, with its session — and the waiter has it about a poll later.
async fn a_waiter_takes_over_from_a_crashed_holder<S: Subject>(s: &S) {
    let name = unique("wait-crash");
    let ttl = TTL; // a poll of 200 ms ± 20%
    let b = s.backend();
    let sent = Instant::now();
    let crashed = acquired(&b, &name, "crashed", ttl).await;
    let survivor = lease(s, "survivor");
    let ((got, at), (earliest, freed)) = tokio::join!(
        async {
            let got = survivor.acquire(&name, ttl, ms(10_000)).await;
            (got, Instant::now())
        },
        async {
            if s.caps().expires {
                // The server's expiry: its time of the request plus the ttl.
                (sent + ttl, sent + ttl)
            } else {
                // Outlives its ttl; free once its session ends.
                sleep(ttl + ms(400)).await;
                let ending = Instant::now();
                s.end_session(&name).await;
                (ending, Instant::now())
            }
        }
    );
    let guard = got.unwrap().expect("taken over within the wait");
    let early = ms(20); // clocks that round to the millisecond
    assert!(
        at + early >= earliest,
        "taken {:?} before the lease ended",
        earliest.saturating_duration_since(at)
    );
    let late = at.saturating_duration_since(freed);
    let bound = poll_max(ttl) + SLACK;
    eprintln!("taken {late:?} after the lease ended");
    assert!(
        late < bound,
        "taken {late:?} after the lease ended, not within a poll (+{SLACK:?})"
    );
    if s.caps().fencing {
        assert!(guard.fencing_token() > crashed, "a larger fence");
    }
    guard.release().await.unwrap();
}

/// Two elections of one name: the first leads, the second follows it
/// (naming it where the backend can), and has the lease at once when the
/// leader resigns (`resign`) or is dropped; never do both lead.
async fn an_election_hands_over<S: Subject>(s: &S, resign: bool) {
    let name = unique("elect-hand-over");
    subscribe(s).await;
    let first = lease(s, "leader-a").elect(&name, LONG);
    let term = timeout(LONG, first.leading())
        .await
        .expect("the first leads");
    let second = lease(s, "leader-b").elect(&name, LONG);
    let monitor = never_two_leaders(&first, &second);
    let following = timeout(
        LONG,
        second
            .watch()
            .wait_for(|l| matches!(l, Leadership::Following { .. })),
    )
    .await
    .expect("the second follows")
    .unwrap()
    .clone();
    assert_follows(s, &following, "leader-a", true);
    assert!(first.is_leader() && !second.is_leader());
    sleep(WAITED).await;
    assert!(!second.is_leader(), "the second leads while the first does");
    let stepped_down = Instant::now();
    if resign {
        first.resign().await.unwrap();
        assert!(term.token().is_cancelled() && !term.is_valid());
    } else {
        drop(first); // releases in the background
    }
    let bound = hand_over_bound(s, LONG);
    let next = timeout(LONG / 2, second.leading())
        .await
        .expect("the second leads once the first has stepped down");
    let took = stepped_down.elapsed();
    eprintln!("led {took:?} after the first stepped down");
    assert!(
        took < bound,
        "led {took:?} after the first stepped down, not under {bound:?} ({})",
        hand_over_kind(s)
    );
    assert!(
        term.token().is_cancelled() && !term.is_valid(),
        "the first term ended"
    );
    assert_eq!(
        *second.watch().borrow(),
        Leadership::Leading {
            fencing_token: next.fencing_token()
        }
    );
    if s.caps().fencing {
        assert!(next.fencing_token() > term.fencing_token());
    }
    second.resign().await.unwrap();
    check_one_leader(monitor).await;
}

async fn an_election_hands_over_on_resign<S: Subject>(s: &S) {
    an_election_hands_over(s, true).await;
}

async fn an_election_hands_over_on_drop<S: Subject>(s: &S) {
    an_election_hands_over(s, false).await;
}

/// A leader whose lease is stolen: its term's token fires, it stops
/// leading and follows the thief; it contends again, and leads again
/// (with a larger fence) about a poll after the thief lets go.
async fn an_election_contends_again_after_a_steal<S: Subject>(s: &S) {
    let name = unique("elect-steal");
    let ttl = ms(1_500); // renewed every 500 ms; a poll of 150 ms ± 20%
    let election = lease(s, "leader-a").elect(&name, ttl);
    let term = timeout(LONG, election.leading()).await.expect("leads");
    let mut state = election.watch();
    sleep(ms(100)).await;
    s.steal(&name, "thief").await;
    // Noticed at the next renewal, as `a_stolen_lease_cancels_the_token`.
    let bound = ttl / 3 + ms(500);
    timeout(bound, term.token().cancelled())
        .await
        .unwrap_or_else(|_| panic!("the term did not end within {bound:?} of the steal"));
    assert!(!term.is_valid() && !election.is_leader());
    // Followed as named within a few polls (each attempt asks again).
    // (The answer is a read guard of the state: dropped at once, or the
    // election could not publish its next state.)
    let named = timeout(
        SLACK + poll_max(ttl) * 3,
        state.wait_for(|l| follows_as_named(s, l, "thief", false)),
    )
    .await
    .is_ok_and(|seen| seen.is_ok());
    let following = election.watch().borrow().clone();
    assert!(named, "does not follow the thief as named: {following:?}");
    assert_follows(s, &following, "thief", false);
    // The thief keeps it: no term.
    sleep(poll_max(ttl) * 2).await;
    assert!(
        !election.is_leader(),
        "leads while the thief holds the lease"
    );
    let stolen = s
        .backend()
        .inspect(&name)
        .await
        .unwrap()
        .and_then(|i| i.fencing_token);
    let freed = Instant::now();
    s.let_go(&name, "thief").await;
    let bound = poll_max(ttl) + SLACK;
    let next = timeout(bound, election.leading())
        .await
        .unwrap_or_else(|_| panic!("did not lead again within {bound:?} of the thief letting go"));
    eprintln!("led again {:?} after the thief let go", freed.elapsed());
    assert!(next.is_valid() && !next.token().is_cancelled());
    if s.caps().fencing {
        assert!(next.fencing_token() > stolen && stolen > term.fencing_token());
    }
    election.resign().await.unwrap();
}

// ------------------------------------------ properties of many leases at once

/// `Backend::renew_many` with more leases than one statement (or script)
/// takes: 2,345 leases, every seventh taken over by another holder, every
/// eleventh never acquired.
async fn a_batch_larger_than_a_chunk<S: Subject>(s: &S) {
    let b = s.backend();
    let holder = unique("holder");
    let thief = unique("thief");
    let prefix = unique("renew-many-big");
    let names: Vec<String> = (0..2345).map(|i| format!("{prefix}-{i}")).collect();
    let expected: Vec<bool> = (0..names.len())
        .map(|i| i % 7 != 3 && i % 11 != 5)
        .collect();
    // A few acquisitions in flight at a time, as an application would: all
    // 2,345 at once made a queue of thousands of consensus writes on the
    // etcd cluster, where the last waited past the backend's time limit on
    // a loaded machine; what is tested here is the batch renewal.
    let fences: Vec<Option<u64>> = stream::iter(names.iter().enumerate().map(|(i, name)| {
        let (b, holder, thief) = (&b, &holder, &thief);
        async move {
            if i % 11 == 5 {
                return Some(1);
            }
            if i % 7 == 3 {
                acquired(b, name, thief, LONG).await
            } else {
                acquired(b, name, holder, LONG).await
            }
        }
    }))
    .buffered(32)
    .collect()
    .await;
    let batch: Vec<(Acquisition<'_>, Duration)> = names
        .iter()
        .zip(fences)
        .map(|(n, f)| (Acquisition::new(n, &holder, f), LONG))
        .collect();
    let renewed = b.renew_many(&batch).await.unwrap();
    assert_eq!(renewed.len(), names.len());
    let wrong: Vec<usize> = (0..names.len())
        .filter(|&i| renewed[i] != expected[i])
        .collect();
    assert!(wrong.is_empty(), "wrong answers at {wrong:?}");
}

// ------------------------------------------- properties of the table backends

async fn table_names_are_validated<S: Subject>(s: &S)
where
    S::B: TableBackend,
{
    let b = s.backend();
    assert_eq!(b.table(), "task_leases", "the default table");
    for bad in [
        "leases; drop table x",
        "task_leases -- x",
        "",
        "1x",
        "a.b.c",
        "x-y",
        "`x`",
        "\"x\"",
    ] {
        let e = b.clone().with_table(bad).expect_err(bad);
        assert!(
            matches!(e, Error::InvalidTable { ref table } if table == bad),
            "{bad:?}: {e:?}"
        );
    }
    let qualified = b
        .clone()
        .with_table("my_schema.leases")
        .expect("schema-qualified");
    assert_eq!(qualified.table(), "my_schema.leases");
}

/// The table backends check their input on direct calls too (not only
/// through [`Lease`]): an over-long name must never be truncated by a
/// lenient server into another name, nor a huge ttl overflow the SQL.
async fn backend_calls_reject_invalid_input<S: Subject>(s: &S)
where
    S::B: TableBackend,
{
    let b = s.backend();
    let name = unique("direct-input");
    for ttl in [
        Duration::ZERO,
        ms(9),
        Duration::from_micros(10_500),
        Duration::MAX,
    ] {
        let e = b.acquire(&name, "a", ttl).await.expect_err("bad ttl");
        assert!(matches!(e, Error::InvalidTtl { .. }), "{ttl:?}: {e:?}");
        let e = b
            .renew(Acquisition::new(&name, "a", None), ttl)
            .await
            .expect_err("bad ttl");
        assert!(matches!(e, Error::InvalidTtl { .. }), "{ttl:?}: {e:?}");
    }
    let long = "n".repeat(256);
    let e = b.acquire(&long, "a", LONG).await.expect_err("long name");
    assert!(matches!(e, Error::InvalidName { len: 256 }), "{e:?}");
    let e = b.acquire("", "a", LONG).await.expect_err("empty name");
    assert!(matches!(e, Error::InvalidName { len: 0 }), "{e:?}");
    let e = b
        .release(Acquisition::new(&name, "", None))
        .await
        .expect_err("empty holder");
    assert!(matches!(e, Error::InvalidHolder { len: 0 }), "{e:?}");
    // Nothing was stored along the way.
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(Some(1)));
    // The bounds themselves are fine (the 10 ms lease may be over by now).
    assert!(renew(&b, &name, "a", Some(1), Duration::from_secs(86_400)).await);
    assert!(renew(&b, &name, "a", Some(1), ms(10)).await);
}

/// The rule the engine's deadline rests on (`t_send + ttl - margin`, see
/// `docs/ARCHITECTURE.md`): every statement that sets an expiry — a new
/// name, a re-acquire by the holder, a renewal, a batch of renewals, a
/// takeover — sets it to at least the server's time before the request plus
/// the ttl, exactly (to the microsecond; the millisecond for SQLite — the
/// engine's margin is for clock rates, not for the statements), and to at
/// most the server's time after the request plus the ttl. How small an
/// error the lower bound catches depends on how soon after the first
/// reading the statement runs (a millisecond or so); an error the size of
/// the margin (602 ms at 60 s) it always catches.
async fn expiry_is_the_server_time_of_the_request_plus_the_ttl<S: Subject>(s: &S)
where
    S::B: TableBackend,
{
    let b = s.backend();
    let (name, other) = (unique("expiry"), unique("expiry-other"));
    let secs = Duration::from_secs;

    let grant =
        within_ttl_of_the_request(&b, "acquire of a new name", &[(&name, secs(60))], async {
            acquired(&b, &name, "holder-a", secs(60)).await
        })
        .await;
    let again = within_ttl_of_the_request(
        &b,
        "re-acquire by the holder",
        &[(&name, secs(61))],
        async { acquired(&b, &name, "holder-a", secs(61)).await },
    )
    .await;
    assert_eq!(grant, again);
    within_ttl_of_the_request(&b, "renew", &[(&name, secs(62))], async {
        assert!(renew(&b, &name, "holder-a", grant, secs(62)).await);
    })
    .await;
    let other_fence = acquired(&b, &other, "holder-a", secs(60)).await;
    let batch = [
        (Acquisition::new(&name, "holder-a", grant), secs(63)),
        (Acquisition::new(&other, "holder-a", other_fence), secs(64)),
    ];
    within_ttl_of_the_request(
        &b,
        "renew_many",
        &[(&name, secs(63)), (&other, secs(64))],
        async { assert_eq!(b.renew_many(&batch).await.unwrap(), [true, true]) },
    )
    .await;
    release(&b, &name, "holder-a", grant).await;
    let taken = within_ttl_of_the_request(
        &b,
        "acquire of a released name",
        &[(&name, secs(65))],
        async { acquired(&b, &name, "holder-b", secs(65)).await },
    )
    .await;
    assert_eq!(taken, Some(2));
}

/// Run `request` between two readings of the backend's clock; then each
/// `(name, ttl)` must expire between the first reading + ttl and the second
/// + ttl.
async fn within_ttl_of_the_request<B: TableBackend, T>(
    b: &B,
    what: &str,
    expiries: &[(&str, Duration)],
    request: impl Future<Output = T>,
) -> T {
    let before = b.server_now_us().await;
    let value = request.await;
    let after = b.server_now_us().await;
    for &(name, ttl) in expiries {
        let expires_at = b.expires_at_us(name).await;
        let ttl = i64::try_from(ttl.as_micros()).unwrap();
        assert!(
            expires_at >= before + ttl,
            "{what}: {name} expires {} µs before the server's time before the request + {ttl} µs",
            before + ttl - expires_at
        );
        assert!(
            expires_at <= after + ttl,
            "{what}: {name} expires {} µs after the server's time after the request + {ttl} µs",
            expires_at - after - ttl
        );
    }
    value
}

async fn ensure_schema_twice_and_concurrently<S: Subject>(s: &S)
where
    S::B: TableBackend,
{
    let b = s.backend();
    b.ensure_schema().await.expect("default table, again");
    b.ensure_schema().await.expect("default table, again");
    // A table that does not exist yet, created by 8 tasks at once.
    let fresh = b
        .clone()
        .with_table(&unique("ensure").replace('-', "_"))
        .expect("valid");
    let results = join_all((0..8).map(|_| {
        let t = fresh.clone();
        tokio::spawn(async move { t.ensure_schema().await })
    }))
    .await;
    for r in results {
        r.expect("task").expect("concurrent ensure_schema");
    }
    fresh.ensure_schema().await.expect("again");
    let name = unique("ensure-schema");
    assert_eq!(acquire(&fresh, &name, "a", LONG).await, Some(Some(1)));
    assert_eq!(acquire(&fresh, &name, "b", LONG).await, None);
    assert_eq!(
        acquire(&b, &name, "b", LONG).await,
        Some(Some(1)),
        "another table"
    );
    fresh.drop_table().await;
}

// ------------------------------- properties of operating: list, force_release

/// `force_release` ends a held lease whoever holds it: the holder's token
/// is cancelled at its next renewal, the next acquisition gets a larger
/// fencing token (the counter is kept), and a free name answers `false`.
async fn force_release_evicts_the_holder_and_keeps_the_fence<S: Subject>(s: &S) {
    let name = unique("forced");
    let ttl = ms(1_500);
    let holder = lease(s, "holder-a");
    let guard = holder.try_acquire(&name, ttl).await.unwrap().expect("free");
    let evicted = guard.fencing_token();
    let b = s.backend();
    assert!(
        b.force_release(&name).await.expect("force_release"),
        "it was held"
    );
    let forced_at = Instant::now();
    // Noticed at the next renewal: within ttl/3 plus slack for a loaded machine.
    let bound = ttl / 3 + ms(500);
    timeout(bound, guard.token().cancelled())
        .await
        .unwrap_or_else(|_| panic!("token not cancelled within {bound:?} of the eviction"));
    eprintln!("eviction noticed after {:?}", forced_at.elapsed());
    assert!(!guard.is_valid());
    assert!(
        !b.force_release(&name).await.expect("force_release"),
        "nothing left to release"
    );
    let next = acquired(&b, &name, "holder-b", LONG).await;
    if s.caps().fencing {
        assert!(
            next > evicted,
            "fence {next:?} after {evicted:?}: the counter restarted"
        );
    }
    // The evicted holder's release does not end the new holder's lease.
    guard.release().await.unwrap();
    assert!(acquire(&b, &name, "holder-c", TTL).await.is_none());
    assert!(b.force_release(&name).await.expect("force_release"));
    let never = unique("forced-never");
    assert!(!b.force_release(&never).await.expect("force_release"));
    assert!(matches!(
        b.force_release("").await,
        Err(Error::InvalidName { .. })
    ));
}

/// `list` shows every held lease with its holder; a backend that keeps
/// released leases (with expiry and fencing) lists them as not held.
async fn list_shows_held_and_released_leases<S: Subject>(s: &S) {
    let (kept, freed) = (unique("listed-held"), unique("listed-freed"));
    let b = s.backend();
    let kept_fence = acquired(&b, &kept, "holder-a", LONG).await;
    let freed_fence = acquired(&b, &freed, "holder-b", LONG).await;
    release(&b, &freed, "holder-b", freed_fence).await;
    let listed = b.list().await.expect("list");
    let find = |name: &str| listed.iter().find(|l| l.name == name);
    let held = find(&kept).unwrap_or_else(|| panic!("{kept} not listed"));
    assert!(held.is_held(), "{held:?}");
    assert_eq!(held.fencing_token, kept_fence);
    if s.caps().leader == Naming::Holder {
        // `PgAdvisory` names the session instead of the holder.
        assert_eq!(held.holder, "holder-a");
    }
    let inspected = b.inspect(&kept).await.expect("inspect").expect("a record");
    assert_eq!(
        (
            &inspected.holder,
            inspected.fencing_token,
            inspected.is_held()
        ),
        (&held.holder, held.fencing_token, true),
        "list and inspect agree"
    );
    match find(&freed) {
        Some(info) => assert!(!info.is_held(), "{info:?}"),
        None => assert!(
            !(s.caps().fencing && s.caps().expires),
            "{freed}: a backend that keeps fences keeps released leases"
        ),
    }
    release(&b, &kept, "holder-a", kept_fence).await;
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

async fn sqlite() -> Option<TableSubject<SqliteTable>> {
    let file = TempDb::new("conformance");
    let table = SqliteTable::open(file.path())
        .await
        .expect("open sqlite file");
    let steal = "UPDATE {table} SET holder = ?2, fence = fence + 1, \
                 expires_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 60000 \
                 WHERE name = ?1";
    Some(TableSubject::new(table, steal, TABLE_LIKE, Some(file)))
}

async fn postgres() -> Option<TableSubject<PgTable>> {
    let table = PgTable::new(lease_tests::postgres().await?);
    table.ensure_schema().await.expect("ensure_schema");
    let steal = "UPDATE {table} SET holder = $2, fence = fence + 1, \
                 expires_at = clock_timestamp() + interval '1 minute' WHERE name = $1";
    // Releases are pushed (`NOTIFY`).
    let caps = Caps {
        pushes: true,
        ..TABLE_LIKE
    };
    Some(TableSubject::new(table, steal, caps, None))
}

async fn mysql() -> Option<TableSubject<MySqlTable>> {
    let table = MySqlTable::new(lease_tests::mysql().await?);
    table.ensure_schema().await.expect("ensure_schema");
    let steal = "UPDATE {table} SET fence = fence + 1, holder = ?, \
                 expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE WHERE name = ?";
    Some(TableSubject::new(table, steal, TABLE_LIKE, None))
}

/// `PgAdvisory`: no fencing token (unless `with_fencing`) and no expiry
/// (see [`Caps`]). The only way to take an advisory lock from its holder is
/// to end the holder's session, so `end_session` terminates it (found in
/// `pg_locks`) from another connection, and `steal` does so once the
/// thief's connection waits for the lock (`pg_advisory_lock`): the server
/// hands it to the thief before anyone else can try. With fencing, the
/// thief then bumps the name's counter, as a fenced acquisition does.
struct PgAdvisorySubject {
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
        Caps {
            fencing: self.backend.fence_table().is_some(),
            expires: false,
            pushes: true,
            leader: Naming::Session,
        }
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

async fn pg_advisory() -> Option<PgAdvisorySubject> {
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
async fn pg_advisory_unwatched() -> Option<PgAdvisorySubject> {
    let mut subject = pg_advisory().await?;
    subject.backend = subject.backend.with_watch(false);
    Some(subject)
}

/// `PgAdvisory::with_fencing` on `lease_fences`: every property with
/// fencing tokens (each test's names are its own, so the table is shared).
async fn pg_advisory_fenced() -> Option<PgAdvisorySubject> {
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
            expires: true,
            // Subscribed (`Redis::with_pubsub`): the release script publishes.
            pushes: true,
            leader: if self.go {
                Naming::OwnHolders
            } else {
                Naming::Holder
            },
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
fn pubsub() -> ::redis::Client {
    ::redis::Client::open(lease_tests::redis_url()).expect("redis url")
}

async fn redis() -> Option<RedisSubject> {
    let pool = lease_tests::redis().await?;
    Some(RedisSubject {
        backend: Redis::new(pool.clone()).with_pubsub(pubsub()),
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
struct EtcdSubject {
    backend: Ordinal<Etcd>,
    client: lease::etcd_client::Client,
}

/// A backend whose fencing tokens are those of `B` ranked per name: the
/// `n`th distinct token `B` handed out for a name is `n`. Panics if `B`
/// hands out a token below the largest it handed out for that name (and
/// for a token it never handed out in a renew or release).
#[derive(Clone)]
struct Ordinal<B> {
    inner: B,
    /// Per name, the tokens of `B` in the order they were seen (ascending).
    seen: Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<u64>>>>,
}

impl<B> Ordinal<B> {
    fn new(inner: B) -> Self {
        Self {
            inner,
            seen: Arc::default(),
        }
    }

    /// The rank of `raw` among the tokens of `name`, recording it if new.
    fn rank(&self, name: &str, raw: u64) -> u64 {
        let mut seen = self.seen.lock().unwrap();
        let tokens = seen.entry(name.to_owned()).or_default();
        if let Some(i) = tokens.iter().position(|&t| t == raw) {
            return i as u64 + 1;
        }
        if let Some(&last) = tokens.last() {
            assert!(
                raw > last,
                "{name:?}: fencing token {raw} after {last}: tokens must strictly grow"
            );
        }
        tokens.push(raw);
        tokens.len() as u64
    }

    /// The token of `B` whose rank is `rank` (none for an unknown rank: such
    /// a token was never handed out, and matches nothing).
    fn raw(&self, lease: Acquisition<'_>) -> Option<u64> {
        let rank = usize::try_from(lease.fencing_token?).ok()?;
        let seen = self.seen.lock().unwrap();
        let tokens = seen.get(lease.name)?;
        rank.checked_sub(1).and_then(|i| tokens.get(i)).copied()
    }

    fn unranked<'a>(&self, lease: Acquisition<'a>) -> Acquisition<'a> {
        // An unknown rank becomes a token no acquisition has (0).
        let raw = self.raw(lease).or(lease.fencing_token.map(|_| 0));
        Acquisition::new(lease.name, lease.holder, raw)
    }
}

impl<B: Backend + Clone> Backend for Ordinal<B> {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        let grant = self.inner.acquire(name, holder, ttl).await?;
        Ok(grant.map(|g| Grant::new(g.fencing_token.map(|raw| self.rank(name, raw)))))
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        self.inner.renew(self.unranked(lease), ttl).await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.inner.release(self.unranked(lease)).await
    }

    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        let leases: Vec<_> = leases
            .iter()
            .map(|&(lease, ttl)| (self.unranked(lease), ttl))
            .collect();
        self.inner.renew_many(&leases).await
    }

    async fn inspect(&self, name: &str) -> Result<Option<lease::LeaseInfo>, Error> {
        let info = self.inner.inspect(name).await?;
        Ok(info.map(|i| {
            let rank = i.fencing_token.map(|raw| self.rank(name, raw));
            lease::LeaseInfo::new(i.name, i.holder, i.expires_in, rank)
        }))
    }

    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.inner.released(name, poll)
    }
}

impl Subject for EtcdSubject {
    type B = Ordinal<Etcd>;

    fn backend(&self) -> Ordinal<Etcd> {
        self.backend.clone()
    }

    /// etcd rounds a ttl up to whole seconds (at least 1 s on the test
    /// cluster) and checks for expired leases every 500 ms.
    fn expiry(&self, ttl: Duration) -> Duration {
        Duration::from_secs(Etcd::lease_ttl_secs(ttl).unsigned_abs()) + ms(700)
    }

    async fn steal(&self, name: &str, thief: &str) {
        use lease::etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
        let mut client = self.client.clone();
        let key = self.backend.inner.key(name);
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

async fn etcd() -> Option<EtcdSubject> {
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
struct RedisClusterSubject {
    backend: Redis,
    client: ::redis::cluster::ClusterClient,
}

impl Subject for RedisClusterSubject {
    type B = Redis;

    fn backend(&self) -> Redis {
        self.backend.clone()
    }

    fn caps(&self) -> Caps {
        Caps {
            // Subscribed (`Redis::with_pubsub`, to one node): `PUBLISH`
            // reaches subscribers on every node of the cluster.
            pushes: true,
            ..TABLE_LIKE
        }
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

async fn redis_cluster() -> Option<RedisClusterSubject> {
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

// ---------------------------------------------------------------- the matrix

/// `conformance!(module, subject, [groups])`: a module of `#[tokio::test]`s,
/// one per property of each group, each calling `property(&subject)`.
/// Groups: `every` (every backend), `fenced` (backends with fencing
/// tokens), `many_leases` (thousands of leases held
/// at once), `tables` (needs [`TableBackend`]).
macro_rules! conformance {
    ($backend:ident, $subject:expr, [$($group:ident),+ $(,)?]) => {
        mod $backend {
            $(conformance!(@$group $subject);)+
        }
    };
    (@every $subject:expr) => {
        conformance!(@tests $subject, [
            exclusive_between_two_holders,
            idempotent_reacquire_keeps_the_fence,
            takeover_after_expiry_has_a_larger_fence,
            release_then_reacquire_increments_fence,
            renew_extends_a_live_lease,
            renew_never_inserts,
            renew_fails_after_takeover_release_and_expiry,
            renew_and_release_by_a_non_holder_do_nothing,
            fences_strictly_increase,
            names_are_data,
            holders_are_compared_exactly,
            invalid_input_is_rejected,
            one_winner_among_sixteen_contenders,
            concurrent_acquire_of_a_new_name_has_one_winner,
            concurrent_takeover_of_an_expired_lease_has_one_winner,
            one_runner_among_sixteen_with_lease,
            a_stolen_lease_cancels_the_token,
            a_dropped_guard_frees_the_lease,
            a_held_lease_is_renewed_past_its_ttl,
            each_lease_learns_its_own_fate,
            a_waiter_has_a_released_lease_at_once,
            a_wait_runs_out_while_another_holds,
            a_waiter_takes_over_from_a_crashed_holder,
            an_election_hands_over_on_resign,
            an_election_hands_over_on_drop,
            an_election_contends_again_after_a_steal,
        ]);
    };
    (@fenced $subject:expr) => {
        conformance!(@tests $subject, [a_late_release_leaves_a_newer_acquisition]);
    };
    (@many_leases $subject:expr) => {
        conformance!(@tests $subject, [a_batch_larger_than_a_chunk]);
    };
    (@tables $subject:expr) => {
        conformance!(@tests $subject, [
            table_names_are_validated,
            backend_calls_reject_invalid_input,
            expiry_is_the_server_time_of_the_request_plus_the_ttl,
            ensure_schema_twice_and_concurrently,
        ]);
    };
    (@operating $subject:expr) => {
        conformance!(@tests $subject, [
            force_release_evicts_the_holder_and_keeps_the_fence,
            list_shows_held_and_released_leases,
        ]);
    };
    (@tests $subject:expr, [$($property:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $property() {
                lease_tests::init_tracing();
                if let Some(subject) = $subject.await {
                    super::$property(&subject).await;
                }
            }
        )*
    };
}

conformance!(memory, super::memory(), [every, many_leases]);
conformance!(sqlite, super::sqlite(), [every, many_leases, tables]);
conformance!(postgres, super::postgres(), [every, many_leases, tables]);
conformance!(mysql, super::mysql(), [every, many_leases, tables]);
// No `many_leases`: PgAdvisory holds one pool connection (one server
// session) per lease, so thousands of leases at once are not what it is for.
conformance!(pg_advisory, super::pg_advisory(), [every]);
// Without the watch of the holding connection (the plain connection path).
conformance!(
    pg_advisory_unwatched,
    super::pg_advisory_unwatched(),
    [every]
);
// With fencing tokens: the `fenced` group too.
conformance!(
    pg_advisory_fenced,
    super::pg_advisory_fenced(),
    [every, fenced]
);
conformance!(redis, super::redis(), [every, many_leases]);
// The Go locker's protocol on Redis: no fencing tokens.
conformance!(
    redis_go_locker,
    super::redis_go_locker(),
    [every, many_leases]
);

// `Backend::list` and `Backend::force_release` (the `lease` command's
// `list` and `release --force`).
conformance!(memory_operating, super::memory(), [operating]);
conformance!(sqlite_operating, super::sqlite(), [operating]);
conformance!(postgres_operating, super::postgres(), [operating]);
conformance!(mysql_operating, super::mysql(), [operating]);
conformance!(pg_advisory_operating, super::pg_advisory(), [operating]);
conformance!(
    pg_advisory_fenced_operating,
    super::pg_advisory_fenced(),
    [operating]
);
conformance!(redis_operating, super::redis(), [operating]);
conformance!(
    redis_go_locker_operating,
    super::redis_go_locker(),
    [operating]
);
// etcd on a 3-member cluster started by this test binary.
conformance!(etcd, super::etcd(), [every, fenced, many_leases]);
// Redis on a 3-master Redis Cluster started by this test binary.
conformance!(
    redis_cluster,
    super::redis_cluster(),
    [every, fenced, many_leases]
);
