//! What only one table backend, or its server, does: schema-qualified
//! tables, the rows as stored (and whose clock they follow), SQLite's file
//! sharing and busy handling, MySQL's lock wait timeouts; and on every
//! table backend, its statements for schedule slots, published values,
//! forced releases and guarded writes (`check_in`), a table without the
//! columns they need, and a check-in on another database.
//!
//! What every table backend does is a property of the conformance suite
//! (`conformance.rs`: the properties of every backend, and its `tables`
//! group for `with_table` and `ensure_schema`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, join_all};
use lease_tests::{TempDb, unique};
use leasehold::backend::{Memory, MySqlTable, PgTable, SqliteTable};
use leasehold::{
    Acquired, Acquisition, Backend, Error, Grant, Lease, LeaseGuard, LeaseInfo, OncePer, Outcome,
    Request, Skip, Term,
};
use sqlx::AssertSqlSafe;

mod slots_values_check_ins;

const MS: Duration = Duration::from_millis(1);
const LONG: Duration = Duration::from_secs(30);

/// `b.acquire`: `None` when another holder has the lease, else the grant's
/// fencing token (which a table backend always gives).
async fn acquire(b: &impl Backend, name: &str, holder: &str, ttl: Duration) -> Option<u64> {
    let grant = b.acquire(name, holder, ttl).await.expect("acquire");
    grant.map(|g| {
        g.fencing_token
            .expect("table backends always return a fence")
    })
}

/// The acquisition of `name` by `holder` that got fencing token `fence`.
fn acquisition<'a>(name: &'a str, holder: &'a str, fence: u64) -> Acquisition<'a> {
    Acquisition::new(name, holder, Some(fence))
}

async fn renew(b: &impl Backend, name: &str, holder: &str, fence: u64) -> bool {
    b.renew(acquisition(name, holder, fence), LONG)
        .await
        .expect("renew")
}

async fn release(b: &impl Backend, name: &str, holder: &str, fence: u64) {
    b.release(acquisition(name, holder, fence))
        .await
        .expect("release");
}

async fn pg() -> Option<PgTable> {
    let table = PgTable::new(lease_tests::postgres().await?);
    table.ensure_schema().await.expect("ensure_schema");
    Some(table)
}

async fn mysql() -> Option<MySqlTable> {
    let table = MySqlTable::new(lease_tests::mysql().await?);
    table.ensure_schema().await.expect("ensure_schema");
    Some(table)
}

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
    let Some(table) = pg().await else {
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
    release(&table, &name, "a", 1).await;
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

/// A process whose lease table grows (one lease per tenant, tenants added)
/// keeps renewing in time. A connection that sent `renew_many` a few times
/// while the table held a few dozen rows had PostgreSQL keep a generic plan
/// for it: a nested loop that reads every row of the table once per lease
/// renewed. Once the process held 100,000 leases, a batch of 1,000 took
/// about 20 s (in the benchmark's 100,000-lease scale run renewals ran past
/// their window, holding row locks, and releases timed out behind them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_renewals_keep_up_when_the_table_grows() {
    // One connection: the one whose plans the first renewals settle.
    let options = sqlx::postgres::PgPoolOptions::new().max_connections(1);
    let Some(pool) = lease_tests::postgres_with(options).await else {
        return;
    };
    let table = PgTable::new(pool.clone())
        .with_table(&unique("grown").replace('-', "_"))
        .expect("a valid table name");
    table.ensure_schema().await.expect("ensure_schema");
    let t = table.table().to_owned();
    let small: Vec<String> = (0..50).map(|i| format!("tenant-{i}")).collect();
    let mut fences = vec![];
    for name in &small {
        fences.push(acquire(&table, name, "a", LONG).await.expect("free"));
    }
    let leases: Vec<_> = small
        .iter()
        .zip(&fences)
        .map(|(name, &fence)| (acquisition(name, "a", fence), LONG))
        .collect();
    for _ in 0..10 {
        let renewed = table.renew_many(&leases).await.expect("renew_many");
        assert!(renewed.iter().all(|&r| r));
    }
    // The table grows: 100,000 more leases of this holder's.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {t} (name, holder, expires_at, fence) \
         SELECT 'new-tenant-' || i, 'a', clock_timestamp() + interval '1 minute', i \
         FROM generate_series(1, 100000) i"
    )))
    .execute(&pool)
    .await
    .expect("insert");
    let names: Vec<String> = (1..=1000).map(|i| format!("new-tenant-{i}")).collect();
    let leases: Vec<_> = names
        .iter()
        .zip(1..)
        .map(|(name, fence)| (acquisition(name, "a", fence), LONG))
        .collect();
    let started = std::time::Instant::now();
    let renewed = table.renew_many(&leases).await.expect("renew_many");
    let took = started.elapsed();
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {t}")))
        .execute(&pool)
        .await
        .expect("drop");
    assert!(renewed.iter().all(|&r| r));
    // The engine gives a renewal its renewal period, ttl/3: 10 s for
    // leases of 30 s. (About 0.05 s on the test machine.)
    assert!(
        took < LONG / 3,
        "renewing 1,000 leases of a grown table took {took:?}"
    );
}

/// A renewal of one lease on MySQL/MariaDB reads its row by the primary
/// key, whatever the table holds. MariaDB plans an `UPDATE` whose row
/// comparison `(name, fence) IN (..)` has one element as a scan of the whole
/// index (with two or more, a range of it): each renewal of one lease read
/// every row, ~0.1 s on a table of 200,000, and the benchmark's 10,000
/// leases renewed one by one lost a third of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_renewal_of_one_lease_reads_one_row() {
    let Some(pool) = lease_tests::mysql().await else {
        return;
    };
    let table = MySqlTable::new(pool.clone())
        .with_table(&unique("big").replace('-', "_"))
        .expect("a valid table name");
    table.ensure_schema().await.expect("ensure_schema");
    let t = table.table().to_owned();
    // Other holders' leases: MariaDB's sequence engine (the test servers').
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {t} (name, holder, expires_at, fence) \
         SELECT concat('other-', seq), 'b', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 1 \
         FROM seq_1_to_300000"
    )))
    .execute(&pool)
    .await
    .expect("insert");
    let names: Vec<String> = (0..100).map(|i| format!("mine-{i}")).collect();
    let mut fences = vec![];
    for name in &names {
        fences.push(acquire(&table, name, "a", LONG).await.expect("free"));
    }
    let started = std::time::Instant::now();
    for (name, &fence) in names.iter().zip(&fences) {
        assert!(renew(&table, name, "a", fence).await, "{name} renewed");
    }
    let took = started.elapsed();
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {t}")))
        .execute(&pool)
        .await
        .expect("drop");
    // A few ms each; reading every row, ~0.18 s each on the test machine.
    assert!(
        took < Duration::from_secs(5),
        "100 renewals of one lease took {took:?}"
    );
}

#[tokio::test]
async fn mysql_rows_follow_the_server_clock_and_release_keeps_them() {
    let Some(table) = mysql().await else {
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
    release(&table, &name, "a", 1).await;
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
    let db = TempDb::new("lease-sql-backends");
    let table = SqliteTable::open(db.path()).await.expect("open");
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
    release(&table, "job", "a", 1).await;
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
        .renew(acquisition("job", "a", 1), LONG)
        .await
        .expect_err("busy");
    assert!(busy(e));
    let e = impatient
        .release(acquisition("job", "a", 1))
        .await
        .expect_err("busy");
    assert!(busy(e));

    sqlx::query("COMMIT")
        .execute(&mut *writer)
        .await
        .expect("commit");
    assert!(renew(&impatient, "job", "a", 1).await);
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
    assert!(renew(&table, &name, "a", 1).await);
}

/// A server's error reads in the server's words with its SQLSTATE, not
/// sqlx's PostgreSQL form, which ends in " at line N" (the line of
/// PostgreSQL's own source that raised it).
#[tokio::test]
async fn server_errors_show_the_servers_message_and_sqlstate() {
    if let Some(pool) = lease_tests::postgres().await {
        let error = sqlx::query("SELECT * FROM no_such_table_here")
            .execute(&pool)
            .await
            .unwrap_err();
        let text = Error::from(error).chain().to_string();
        assert_eq!(
            text,
            "database error: error returned from database: \
             relation \"no_such_table_here\" does not exist (SQLSTATE 42P01)"
        );
    }
    if let Some(pool) = lease_tests::mysql().await {
        let error = sqlx::query("SELECT * FROM no_such_table_here")
            .execute(&pool)
            .await
            .unwrap_err();
        let text = Error::from(error).chain().to_string();
        assert!(
            text.starts_with("database error: error returned from database: Table '")
                && text.ends_with("no_such_table_here' doesn't exist (SQLSTATE 42S02)"),
            "{text}"
        );
    }
}
