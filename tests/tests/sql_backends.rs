//! The `Backend` contract of the three table backends, checked against real
//! servers (PostgreSQL, MySQL/MariaDB) and a real SQLite file, by calling the
//! trait methods directly.
//!
//! Every property is one generic async fn, instantiated for each backend by
//! `for_each_backend!`. Lease names are unique per test run, so the tests can
//! share the default table and run in parallel. Expiry tests use short ttls and
//! sleeps with wide margins, as the servers' clocks decide.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::join_all;
use lease::backend::{MySqlTable, PgTable, SqliteTable};
use lease::{Acquisition, Backend, Error, Grant};
use lease_tests::{TempDb, unique};
use sqlx::AssertSqlSafe;

const MS: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(30);

/// What the tests need beyond `Backend`: the inherent API of the table backends.
trait Table: Backend + Clone + std::fmt::Debug + Sized {
    fn ensure_schema(&self) -> impl Future<Output = Result<(), Error>> + Send;
    fn with_table(self, table: &str) -> Result<Self, Error>;
    fn table(&self) -> &str;
    /// Drops this backend's table (to clean up tables made by a test).
    fn drop_table(&self) -> impl Future<Output = ()> + Send;
}

macro_rules! impl_table {
    ($($t:ty),*) => {$(
        impl Table for $t {
            fn ensure_schema(&self) -> impl Future<Output = Result<(), Error>> + Send {
                <$t>::ensure_schema(self)
            }
            fn with_table(self, table: &str) -> Result<Self, Error> {
                <$t>::with_table(self, table)
            }
            fn table(&self) -> &str {
                <$t>::table(self)
            }
            fn drop_table(&self) -> impl Future<Output = ()> + Send {
                // Test code: the name was validated by `with_table`.
                let sql = format!("DROP TABLE IF EXISTS {}", self.table());
                let pool = self.pool().clone();
                async move {
                    sqlx::query(AssertSqlSafe(sql)).execute(&pool).await.expect("drop table");
                }
            }
        }
    )*};
}
impl_table!(PgTable, MySqlTable, SqliteTable);

/// The backend under test, with its table created; `None` when its server is
/// not available (and `LEASE_REQUIRE_SERVICES` is not set).
async fn pg() -> Option<(PgTable, ())> {
    let table = PgTable::new(lease_tests::postgres().await?);
    table.ensure_schema().await.expect("ensure_schema");
    Some((table, ()))
}

async fn mysql() -> Option<(MySqlTable, ())> {
    let table = MySqlTable::new(lease_tests::mysql().await?);
    table.ensure_schema().await.expect("ensure_schema");
    Some((table, ()))
}

/// The SQLite file lives as long as the returned `TempDb`.
async fn sqlite() -> Option<(SqliteTable, TempDb)> {
    let db = TempDb::new("lease-sql-backends");
    let table = SqliteTable::open(db.path()).await.expect("open");
    Some((table, db))
}

/// One `#[tokio::test]` per backend and property: `pg::name`, `mysql::name`,
/// `sqlite::name`, each calling `name(backend, "name")`.
macro_rules! for_each_backend {
    ($($property:ident),* $(,)?) => {
        for_each_backend!(@backend pg: $($property),*);
        for_each_backend!(@backend mysql: $($property),*);
        for_each_backend!(@backend sqlite: $($property),*);
    };
    (@backend $backend:ident: $($property:ident),*) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $property() {
                    let Some((table, _keep)) = super::$backend().await else { return };
                    super::$property(table, stringify!($property)).await;
                }
            )*
        }
    };
}

for_each_backend!(
    first_acquire_gets_fence_1_and_reacquire_keeps_it,
    held_lease_is_not_granted_to_another_holder,
    takeover_after_expiry_increments_fence,
    release_then_reacquire_increments_fence,
    renew_extends_a_live_lease,
    renew_never_inserts,
    renew_fails_after_expiry,
    renew_fails_after_release,
    renew_and_release_by_another_holder_do_nothing,
    release_of_an_unheld_lease_is_ok,
    names_are_data_and_never_collide,
    holders_are_compared_exactly,
    invalid_input_is_rejected,
    invalid_table_is_rejected,
    ensure_schema_twice_and_concurrently,
    concurrent_acquire_of_a_new_name_has_one_winner,
    concurrent_takeover_of_an_expired_lease_has_one_winner,
);

fn fence(grant: Option<Grant>) -> Option<u64> {
    grant.map(|g| {
        g.fencing_token
            .expect("table backends always return a fence")
    })
}

/// The fencing token of the last acquisition of each (name, holder) made
/// through [`acquire`], and of each name (by anyone): [`renew`] and
/// [`release`] concern that acquisition.
static FENCES: LazyLock<Mutex<HashMap<(String, String), u64>>> = LazyLock::new(Mutex::default);

fn fences() -> MutexGuard<'static, HashMap<(String, String), u64>> {
    FENCES.lock().unwrap_or_else(|e| e.into_inner())
}

async fn acquire(b: &impl Backend, name: &str, holder: &str, ttl: Duration) -> Option<u64> {
    let f = fence(b.acquire(name, holder, ttl).await.expect("acquire"));
    if let Some(f) = f {
        let mut fences = fences();
        fences.insert((name.to_owned(), holder.to_owned()), f);
        fences.insert((name.to_owned(), String::new()), f);
    }
    f
}

/// `holder`'s last acquisition of `name`; for a holder that never acquired
/// it, the name's last acquisition by anyone (so that only the holder differs).
fn acquisition<'a>(name: &'a str, holder: &'a str) -> Acquisition<'a> {
    let fences = fences();
    let fence = fences
        .get(&(name.to_owned(), holder.to_owned()))
        .or_else(|| fences.get(&(name.to_owned(), String::new())));
    Acquisition::new(name, holder, fence.copied())
}

async fn renew(b: &impl Backend, name: &str, holder: &str, ttl: Duration) -> bool {
    b.renew(acquisition(name, holder), ttl)
        .await
        .expect("renew")
}

async fn release(b: &impl Backend, name: &str, holder: &str) {
    b.release(acquisition(name, holder)).await.expect("release");
}

async fn first_acquire_gets_fence_1_and_reacquire_keeps_it(b: impl Table, test: &str) {
    let name = unique(test);
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(1));
    assert_eq!(
        acquire(&b, &name, "a", LONG).await,
        Some(1),
        "idempotent re-acquire"
    );
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(1));
    assert!(renew(&b, &name, "a", LONG).await);
}

async fn held_lease_is_not_granted_to_another_holder(b: impl Table, test: &str) {
    let name = unique(test);
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(1));
    assert_eq!(acquire(&b, &name, "b", LONG).await, None);
    // The failed attempt changed nothing: "a" still holds it, with its fence.
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(1));
    assert_eq!(acquire(&b, &name, "b", 10 * MS).await, None);
}

async fn takeover_after_expiry_increments_fence(b: impl Table, test: &str) {
    let name = unique(test);
    assert_eq!(acquire(&b, &name, "a", 300 * MS).await, Some(1));
    assert_eq!(acquire(&b, &name, "b", LONG).await, None, "not expired yet");
    tokio::time::sleep(700 * MS).await;
    assert_eq!(acquire(&b, &name, "b", LONG).await, Some(2), "takeover");
    assert!(!renew(&b, &name, "a", LONG).await, "the old holder lost it");
    assert_eq!(acquire(&b, &name, "a", LONG).await, None);
    release(&b, &name, "a").await;
    assert_eq!(acquire(&b, &name, "b", LONG).await, Some(2), "still b's");
}

async fn release_then_reacquire_increments_fence(b: impl Table, test: &str) {
    let name = unique(test);
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(1));
    release(&b, &name, "a").await;
    assert_eq!(
        acquire(&b, &name, "a", LONG).await,
        Some(2),
        "a new acquisition"
    );
    release(&b, &name, "a").await;
    assert_eq!(acquire(&b, &name, "b", LONG).await, Some(3));
    release(&b, &name, "b").await;
    release(&b, &name, "b").await;
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(4));
}

async fn renew_extends_a_live_lease(b: impl Table, test: &str) {
    let name = unique(test);
    let ttl = 1000 * MS;
    assert_eq!(acquire(&b, &name, "a", ttl).await, Some(1));
    tokio::time::sleep(500 * MS).await;
    assert!(renew(&b, &name, "a", ttl).await);
    // 1.2 s after acquiring: the original expiry has passed, the renewed one not.
    tokio::time::sleep(700 * MS).await;
    assert_eq!(
        acquire(&b, &name, "b", LONG).await,
        None,
        "renewal extended it"
    );
    assert!(renew(&b, &name, "a", LONG).await);
    assert_eq!(
        acquire(&b, &name, "a", LONG).await,
        Some(1),
        "renewals keep the fence"
    );
}

async fn renew_never_inserts(b: impl Table, test: &str) {
    let name = unique(test);
    assert!(!renew(&b, &name, "a", LONG).await);
    assert!(!renew(&b, &name, "a", LONG).await);
    // Had renew inserted a row, "b" would be refused or get a later fence.
    assert_eq!(acquire(&b, &name, "b", LONG).await, Some(1));
}

async fn renew_fails_after_expiry(b: impl Table, test: &str) {
    let name = unique(test);
    assert_eq!(acquire(&b, &name, "a", 200 * MS).await, Some(1));
    tokio::time::sleep(600 * MS).await;
    assert!(
        !renew(&b, &name, "a", LONG).await,
        "no silent re-acquire after a gap"
    );
    assert_eq!(
        acquire(&b, &name, "b", LONG).await,
        Some(2),
        "the failed renew kept it expired"
    );
    // An expired lease re-acquired by its old holder counts as a new acquisition.
    let other = unique(test);
    assert_eq!(acquire(&b, &other, "a", 200 * MS).await, Some(1));
    tokio::time::sleep(600 * MS).await;
    assert_eq!(acquire(&b, &other, "a", LONG).await, Some(2));
}

async fn renew_fails_after_release(b: impl Table, test: &str) {
    let name = unique(test);
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(1));
    release(&b, &name, "a").await;
    assert!(!renew(&b, &name, "a", LONG).await);
    assert_eq!(
        acquire(&b, &name, "b", LONG).await,
        Some(2),
        "released means free"
    );
}

async fn renew_and_release_by_another_holder_do_nothing(b: impl Table, test: &str) {
    let name = unique(test);
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(1));
    assert!(!renew(&b, &name, "b", LONG).await);
    release(&b, &name, "b").await;
    assert_eq!(acquire(&b, &name, "b", LONG).await, None, "still held by a");
    assert!(renew(&b, &name, "a", LONG).await);
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(1));
}

async fn release_of_an_unheld_lease_is_ok(b: impl Table, test: &str) {
    let name = unique(test);
    release(&b, &name, "a").await; // never acquired
    assert_eq!(acquire(&b, &name, "a", 200 * MS).await, Some(1));
    tokio::time::sleep(600 * MS).await;
    release(&b, &name, "a").await; // expired
    assert_eq!(acquire(&b, &name, "b", LONG).await, Some(2));
}

async fn names_are_data_and_never_collide(b: impl Table, test: &str) {
    let base = unique(test);
    let pad = |s: String| {
        let fill = 255 - s.len();
        format!("{s}{}", "z".repeat(fill))
    };
    let names = [
        format!("{base}-x"),
        format!("{base}-x "),
        format!("{base}-X"),
        format!("{base}- x"),
        format!("{base}-e"),
        format!("{base}-é"),
        format!("{base}-e\u{301}"), // e + combining acute: another spelling of é
        format!("{base}-it's \"quoted\" `x`"),
        format!("{base}-100%"),
        format!("{base}-1_0"),
        format!("{base}-10"),
        format!("{base}-back\\slash"),
        format!("{base}-back\\\\slash"),
        format!("{base}-{{}}"),
        format!("{base}-{{table}}"),
        format!("{base}-'); DROP TABLE task_leases; --"),
        format!("{base}-🦀"),
        format!("{base}-🦀🦀"),
        pad(format!("{base}-")),
        pad(format!("{base}-"))[..254].to_owned(),
        format!("{}é", &pad(format!("{base}-"))[..253]),
    ];
    assert_eq!(names[names.len() - 3].len(), 255);
    assert_eq!(names[names.len() - 1].len(), 255);
    for (i, name) in names.iter().enumerate() {
        let holder = format!("holder-{i}");
        assert_eq!(
            acquire(&b, name, &holder, LONG).await,
            Some(1),
            "{name:?} is new"
        );
    }
    for (i, name) in names.iter().enumerate() {
        let holder = format!("holder-{i}");
        assert_eq!(acquire(&b, name, "intruder", LONG).await, None, "{name:?}");
        assert!(renew(&b, name, &holder, LONG).await, "{name:?}");
        release(&b, name, &holder).await;
        assert_eq!(acquire(&b, name, &holder, LONG).await, Some(2), "{name:?}");
    }
    // `%` and `_` are not wildcards: releasing one name released no other.
    assert!(renew(&b, &names[9], "holder-9", LONG).await);
}

async fn holders_are_compared_exactly(b: impl Table, test: &str) {
    let name = unique(test);
    assert_eq!(acquire(&b, &name, "pod", LONG).await, Some(1));
    for other in ["POD", "pod ", " pod", "pöd", "po", "pod\t"] {
        assert_eq!(acquire(&b, &name, other, LONG).await, None, "{other:?}");
        assert!(!renew(&b, &name, other, LONG).await, "{other:?}");
        release(&b, &name, other).await;
    }
    assert!(renew(&b, &name, "pod", LONG).await);
    assert_eq!(acquire(&b, &name, "pod", LONG).await, Some(1));
    let long = "h".repeat(255);
    let name = unique(test);
    assert_eq!(acquire(&b, &name, &long, LONG).await, Some(1));
    assert_eq!(acquire(&b, &name, &long[..254], LONG).await, None);
    assert!(renew(&b, &name, &long, LONG).await);
}

async fn invalid_input_is_rejected(b: impl Table, test: &str) {
    let name = unique(test);
    for ttl in [
        Duration::ZERO,
        9 * MS,
        Duration::from_micros(10_500),
        Duration::MAX,
    ] {
        let e = b.acquire(&name, "a", ttl).await.expect_err("bad ttl");
        assert!(matches!(e, Error::InvalidTtl { .. }), "{ttl:?}: {e:?}");
        let e = b
            .renew(acquisition(&name, "a"), ttl)
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
        .release(acquisition(&name, ""))
        .await
        .expect_err("empty holder");
    assert!(matches!(e, Error::InvalidHolder { len: 0 }), "{e:?}");
    // Nothing was stored along the way.
    assert_eq!(acquire(&b, &name, "a", LONG).await, Some(1));
    // The bounds themselves are fine (the 10 ms lease may be over by now).
    assert!(renew(&b, &name, "a", Duration::from_secs(86_400)).await);
    assert!(renew(&b, &name, "a", 10 * MS).await);
}

async fn invalid_table_is_rejected(b: impl Table, _test: &str) {
    for bad in [
        "leases; drop table x",
        "task_leases -- x",
        "a.b.c",
        "1x",
        "`x`",
        "\"x\"",
    ] {
        let e = b.clone().with_table(bad).expect_err(bad);
        assert!(
            matches!(e, Error::InvalidTable { ref table } if table == bad),
            "{e:?}"
        );
    }
    assert_eq!(b.table(), "task_leases");
}

async fn ensure_schema_twice_and_concurrently(b: impl Table, test: &str) {
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
    let name = unique(test);
    assert_eq!(acquire(&fresh, &name, "a", LONG).await, Some(1));
    assert_eq!(acquire(&fresh, &name, "b", LONG).await, None);
    assert_eq!(
        acquire(&b, &name, "b", LONG).await,
        Some(1),
        "another table"
    );
    fresh.drop_table().await;
}

/// `n` holders race for `name` at once; returns the grants, one per holder.
async fn race(b: &impl Table, name: &str, n: usize, ttl: Duration) -> Vec<Option<u64>> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
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
            fence(
                r.expect("task")
                    .expect("acquire must not fail under contention"),
            )
        })
        .collect()
}

async fn concurrent_acquire_of_a_new_name_has_one_winner(b: impl Table, test: &str) {
    for round in 0..5 {
        let name = unique(test);
        let grants = race(&b, &name, 16, LONG).await;
        let winners: Vec<_> = grants.iter().flatten().collect();
        assert_eq!(winners, [&1], "round {round}: {grants:?}");
    }
}

async fn concurrent_takeover_of_an_expired_lease_has_one_winner(b: impl Table, test: &str) {
    let name = unique(test);
    assert_eq!(acquire(&b, &name, "first", 100 * MS).await, Some(1));
    tokio::time::sleep(400 * MS).await;
    let grants = race(&b, &name, 16, LONG).await;
    let winners: Vec<_> = grants.iter().flatten().collect();
    assert_eq!(winners, [&2], "{grants:?}");
}

// Backend-specific checks.

#[tokio::test]
async fn pg_schema_qualified_table() {
    let Some(pool) = lease_tests::postgres().await else {
        return;
    };
    // CREATE SCHEMA IF NOT EXISTS can itself race with another process.
    if let Err(e) = sqlx::query("CREATE SCHEMA IF NOT EXISTS my_schema")
        .execute(&pool)
        .await
    {
        let unique_violation = e
            .as_database_error()
            .is_some_and(|e| e.is_unique_violation());
        assert!(unique_violation, "create schema: {e}");
    }
    let table = PgTable::new(pool.clone())
        .with_table("my_schema.leases")
        .expect("valid");
    assert_eq!(table.table(), "my_schema.leases");
    table.ensure_schema().await.expect("ensure_schema");
    let name = unique("pg_schema_qualified_table");
    assert_eq!(acquire(&table, &name, "a", LONG).await, Some(1));
    let (holder, fence): (String, i64) =
        sqlx::query_as("SELECT holder, fence FROM my_schema.leases WHERE name = $1")
            .bind(&name)
            .fetch_one(&pool)
            .await
            .expect("row in my_schema.leases");
    assert_eq!((holder.as_str(), fence), ("a", 1));
}

#[tokio::test]
async fn mysql_schema_qualified_table() {
    let Some(pool) = lease_tests::mysql().await else {
        return;
    };
    sqlx::query("CREATE DATABASE IF NOT EXISTS my_schema")
        .execute(&pool)
        .await
        .expect("create database");
    let table = MySqlTable::new(pool.clone())
        .with_table("my_schema.leases")
        .expect("valid");
    table.ensure_schema().await.expect("ensure_schema");
    let name = unique("mysql_schema_qualified_table");
    assert_eq!(acquire(&table, &name, "a", LONG).await, Some(1));
    let (holder, fence): (Vec<u8>, i64) =
        sqlx::query_as("SELECT holder, fence FROM my_schema.leases WHERE name = ?")
            .bind(name.as_bytes())
            .fetch_one(&pool)
            .await
            .expect("row in my_schema.leases");
    assert_eq!((holder.as_slice(), fence), (&b"a"[..], 1));
}

#[tokio::test]
async fn sqlite_schema_qualified_table() {
    let db = TempDb::new("lease-sqlite-qualified");
    let table = SqliteTable::open(db.path()).await.expect("open");
    let pool = table.pool().clone();
    let table = table.with_table("main.leases").expect("valid");
    table.ensure_schema().await.expect("ensure_schema");
    assert_eq!(acquire(&table, "job", "a", LONG).await, Some(1));
    let fence: i64 = sqlx::query_scalar("SELECT fence FROM leases WHERE name = 'job'")
        .fetch_one(&pool)
        .await
        .expect("row in main.leases");
    assert_eq!(fence, 1);
}

/// Stored values are what the column docs promise: expiry by the server's
/// clock, release keeps the row and expires it.
#[tokio::test]
async fn pg_rows_follow_the_server_clock_and_release_keeps_them() {
    let Some((table, ())) = pg().await else {
        return;
    };
    let name = unique("pg_rows");
    assert_eq!(acquire(&table, &name, "a", 60_000 * MS).await, Some(1));
    let left: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8 \
         FROM task_leases WHERE name = $1",
    )
    .bind(&name)
    .fetch_one(table.pool())
    .await
    .expect("row");
    assert!((59.0..=60.0).contains(&left), "{left}");
    release(&table, &name, "a").await;
    let (expired, fence): (bool, i64) = sqlx::query_as(
        "SELECT expires_at <= clock_timestamp(), fence FROM task_leases WHERE name = $1",
    )
    .bind(&name)
    .fetch_one(table.pool())
    .await
    .expect("release keeps the row");
    assert!(expired);
    assert_eq!(fence, 1);
}

#[tokio::test]
async fn mysql_rows_follow_the_server_clock_and_release_keeps_them() {
    let Some((table, ())) = mysql().await else {
        return;
    };
    let name = unique("mysql_rows");
    assert_eq!(acquire(&table, &name, "a", 60_000 * MS).await, Some(1));
    let left: i64 = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
         FROM task_leases WHERE name = ?",
    )
    .bind(name.as_bytes())
    .fetch_one(table.pool())
    .await
    .expect("row");
    assert!((59_000_000..=60_000_000).contains(&left), "{left}");
    release(&table, &name, "a").await;
    let (expired, fence): (i64, i64) = sqlx::query_as(
        "SELECT expires_at <= UTC_TIMESTAMP(6), fence FROM task_leases WHERE name = ?",
    )
    .bind(name.as_bytes())
    .fetch_one(table.pool())
    .await
    .expect("release keeps the row");
    assert_eq!((expired, fence), (1, 1));
}

#[tokio::test]
async fn sqlite_rows_follow_the_host_clock_and_release_keeps_them() {
    let Some((table, _db)) = sqlite().await else {
        return;
    };
    assert_eq!(acquire(&table, "job", "a", 60_000 * MS).await, Some(1));
    let expires_at: i64 = sqlx::query_scalar("SELECT expires_at FROM task_leases")
        .fetch_one(table.pool())
        .await
        .expect("row");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64;
    assert!(
        (59_000..=60_000).contains(&(expires_at - now)),
        "{}",
        expires_at - now
    );
    release(&table, "job", "a").await;
    let (expires_at, fence): (i64, i64) =
        sqlx::query_as("SELECT expires_at, fence FROM task_leases WHERE name = 'job'")
            .fetch_one(table.pool())
            .await
            .expect("release keeps the row");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64;
    assert!(expires_at <= now, "{expires_at} > {now}");
    assert_eq!(fence, 1);
}

/// Several processes share one file: here, several pools opening the same new
/// file at once (each `open` switches it to WAL and creates the table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_open_concurrently_on_a_new_file() {
    let db = TempDb::new("lease-sqlite-open");
    let opens = join_all((0..8).map(|_| {
        let path = db.path().to_owned();
        tokio::spawn(async move { SqliteTable::open(path).await })
    }))
    .await;
    let tables: Vec<SqliteTable> = opens
        .into_iter()
        .map(|r| r.expect("task").expect("concurrent open"))
        .collect();
    let grants = join_all(
        tables
            .iter()
            .enumerate()
            .map(|(i, t)| async move { acquire(t, "job", &format!("pod-{i}"), LONG).await }),
    )
    .await;
    assert_eq!(
        grants.iter().flatten().collect::<Vec<_>>(),
        [&1],
        "{grants:?}"
    );
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(tables[0].pool())
        .await
        .expect("pragma");
    assert_eq!(mode, "wal");
}

/// A writer that cannot get the lock in time is a transient error, never
/// "held elsewhere": here the lock is another connection's open write
/// transaction, as another process's would be.
#[tokio::test]
async fn sqlite_busy_is_an_error_not_held_elsewhere() {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

    let db = TempDb::new("lease-sqlite-busy");
    let table = SqliteTable::open(db.path()).await.expect("open");
    assert_eq!(acquire(&table, "job", "a", LONG).await, Some(1));

    let options = SqliteConnectOptions::new().filename(db.path());
    let other = SqlitePoolOptions::new()
        .connect_with(options.clone())
        .await
        .expect("other");
    let mut writer = other.acquire().await.expect("connection");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *writer)
        .await
        .expect("take the write lock");

    let impatient = options.busy_timeout(100 * MS);
    let impatient = SqlitePoolOptions::new()
        .connect_with(impatient)
        .await
        .expect("impatient");
    let impatient = SqliteTable::new(impatient);
    let busy = |e: Error| match e {
        Error::Database(e) => e
            .as_database_error()
            .and_then(|e| e.code())
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| code & 0xff == 5), // SQLITE_BUSY and its extended codes
        _ => false,
    };
    let e = impatient.acquire("job", "b", LONG).await.expect_err("busy");
    assert!(busy(e));
    let e = impatient
        .acquire("new-job", "b", LONG)
        .await
        .expect_err("busy");
    assert!(busy(e));
    let e = impatient
        .renew(acquisition("job", "a"), LONG)
        .await
        .expect_err("busy");
    assert!(busy(e));
    let e = impatient
        .release(acquisition("job", "a"))
        .await
        .expect_err("busy");
    assert!(busy(e));

    sqlx::query("COMMIT")
        .execute(&mut *writer)
        .await
        .expect("commit");
    assert!(renew(&impatient, "job", "a", LONG).await);
    assert_eq!(acquire(&impatient, "new-job", "b", LONG).await, Some(1));
}

/// InnoDB lock wait timeouts (1205) are retried inside the backend: a row
/// lock held a little longer than the wait timeout is waited out, one held
/// for good ends in an error after a few attempts, never in "held elsewhere".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_lock_wait_timeouts_are_retried_then_returned() {
    use sqlx::Executor;
    use sqlx::mysql::{MySqlDatabaseError, MySqlPoolOptions};

    let Some(pool) = lease_tests::mysql().await else {
        return;
    };
    // The backend's sessions give up on a row lock after 1 s (the minimum).
    let impatient = MySqlPoolOptions::new()
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION innodb_lock_wait_timeout = 1")
                    .await?;
                Ok(())
            })
        })
        .connect(&lease_tests::mysql_url())
        .await
        .expect("connect");
    let table = MySqlTable::new(impatient);
    table.ensure_schema().await.expect("ensure_schema");
    let name = unique("mysql_lock_wait");
    assert_eq!(acquire(&table, &name, "a", LONG).await, Some(1));
    let lock_row = || async {
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("SELECT fence FROM task_leases WHERE name = ? FOR UPDATE")
            .bind(name.as_bytes())
            .execute(&mut *tx)
            .await
            .expect("lock the row");
        tx
    };

    // Held for 1.5 s: the first attempt times out after 1 s, a retry gets it.
    let tx = lock_row().await;
    let unlock = tokio::spawn(async move {
        tokio::time::sleep(1500 * MS).await;
        tx.rollback().await.expect("rollback");
    });
    let started = std::time::Instant::now();
    assert_eq!(acquire(&table, &name, "a", LONG).await, Some(1));
    assert!(
        started.elapsed() >= 1400 * MS,
        "it waited: {:?}",
        started.elapsed()
    );
    unlock.await.expect("task");

    // Held for good: an error once the attempts are used up.
    let tx = lock_row().await;
    let started = std::time::Instant::now();
    let e = table
        .acquire(&name, "b", LONG)
        .await
        .expect_err("lock wait timeout");
    let number = match &e {
        Error::Database(e) => e
            .as_database_error()
            .and_then(|e| e.try_downcast_ref::<MySqlDatabaseError>())
            .map(MySqlDatabaseError::number),
        _ => None,
    };
    assert_eq!(number, Some(1205), "{e:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "6 attempts of 1 s: {:?}",
        started.elapsed()
    );
    tx.rollback().await.expect("rollback");
    assert!(renew(&table, &name, "a", LONG).await);
}
