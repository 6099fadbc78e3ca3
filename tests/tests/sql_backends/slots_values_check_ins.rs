//! Schedule slots, values, forced releases, check-ins.
//!
//! Each property runs on a table of its own (`fresh`), on PostgreSQL,
//! MariaDB and SQLite, whose sessions use a time zone other than UTC (the
//! slot is the server's epoch milliseconds, whatever the session's zone).

use super::*;

/// A table backend on a table of its own, and what these tests do on its
/// pool besides `Backend`: raw SQL, transactions, the statements' clock.
trait Sql: Backend + Clone {
    /// The statements' clock, as SQL: microseconds since the Unix epoch.
    const NOW_US: &'static str;
    /// `migrations/<database>/`: the file that creates `task_leases`, and
    /// the one that adds `last_slot` and `value` to it.
    const CREATE: &'static str;
    const ADD_COLUMNS: &'static str;
    fn on(&self, table: &str) -> Self;
    fn table(&self) -> &str;
    fn create(&self) -> BoxFuture<'_, Result<(), Error>>;
    /// Runs `sql` (statements without binds) on the pool.
    fn exec(&self, sql: String) -> BoxFuture<'_, ()>;
    /// The first column of the first row of `sql`.
    fn number(&self, sql: String) -> BoxFuture<'_, i64>;
    fn begin(&self) -> BoxFuture<'_, Box<dyn Tx>>;
}

/// A transaction of a table's pool.
trait Tx: Send {
    fn check_in<'a>(&'a mut self, guard: &'a LeaseGuard) -> BoxFuture<'a, Result<(), Error>>;
    fn check_in_term<'a>(&'a mut self, term: &'a Term) -> BoxFuture<'a, Result<(), Error>>;
    fn exec(&mut self, sql: String) -> BoxFuture<'_, ()>;
    fn commit(self: Box<Self>) -> BoxFuture<'static, ()>;
}

impl<DB> Tx for sqlx::Transaction<'static, DB>
where
    DB: sqlx::Database,
    DB::Connection: leasehold::CheckIn,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    fn check_in<'a>(&'a mut self, guard: &'a LeaseGuard) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(guard.check_in(&mut **self))
    }
    fn check_in_term<'a>(&'a mut self, term: &'a Term) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(term.check_in(&mut **self))
    }
    fn exec(&mut self, sql: String) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let done = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut **self).await;
            done.expect("a statement in the transaction");
        })
    }
    fn commit(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move { (*self).commit().await.expect("commit") })
    }
}

/// `sql!(type, now_us, dialect folder, file that adds the columns)`.
macro_rules! sql {
    ($($t:ty, $now:expr, $dir:literal, $columns:literal;)*) => {$(
        impl Sql for $t {
            const NOW_US: &'static str = $now;
            const CREATE: &'static str =
                include_str!(concat!("../../../migrations/", $dir, "/0001_task_leases.sql"));
            const ADD_COLUMNS: &'static str =
                include_str!(concat!("../../../migrations/", $dir, "/", $columns));
            fn on(&self, table: &str) -> Self {
                self.clone().with_table(table).expect("a valid table name")
            }
            fn table(&self) -> &str {
                <$t>::table(self)
            }
            fn create(&self) -> BoxFuture<'_, Result<(), Error>> {
                Box::pin(self.ensure_schema())
            }
            fn exec(&self, sql: String) -> BoxFuture<'_, ()> {
                Box::pin(async move {
                    let done = sqlx::raw_sql(AssertSqlSafe(sql)).execute(self.pool()).await;
                    done.expect("a statement");
                })
            }
            fn number(&self, sql: String) -> BoxFuture<'_, i64> {
                Box::pin(async move {
                    let query = sqlx::query_scalar(AssertSqlSafe(sql));
                    query.fetch_one(self.pool()).await.expect("a number")
                })
            }
            fn begin(&self) -> BoxFuture<'_, Box<dyn Tx>> {
                Box::pin(async move {
                    Box::new(self.pool().begin().await.expect("begin")) as Box<dyn Tx>
                })
            }
        }
    )*};
}
sql!(
    PgTable, "(extract(epoch FROM clock_timestamp()) * 1000000)::int8", "postgres",
    "0003_add_last_slot_and_value.sql";
    MySqlTable, "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))", "mysql",
    "0002_add_last_slot_and_value.sql";
    SqliteTable, "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000",
    "sqlite", "0002_add_last_slot_and_value.sql";
);

/// `migration` (a file of `task_leases`) on `table`, statement by statement.
fn on_table(migration: &str, table: &str) -> Vec<String> {
    let lines = migration.replace(" task_leases ", &format!(" {table} "));
    lines
        .split(";\n")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A table name no other test uses.
fn table_name(prefix: &str) -> String {
    unique(prefix).replace('-', "_")
}

/// A backend on a new table of `base`'s database, made by `ensure_schema`.
async fn fresh<B: Sql>(base: B) -> B {
    let table = base.on(&table_name("leases"));
    table.create().await.expect("ensure_schema");
    table
}

async fn drop_table<B: Sql>(b: &B) {
    b.exec(format!("DROP TABLE {}", b.table())).await;
}

/// The test pools' sessions use a time zone other than UTC.
async fn pg_elsewhere() -> Option<PgTable> {
    use sqlx::Executor;
    let options = sqlx::postgres::PgPoolOptions::new().after_connect(|conn, _| {
        Box::pin(async move {
            conn.execute("SET TIME ZONE 'Asia/Kolkata'").await?;
            Ok(())
        })
    });
    Some(PgTable::new(lease_tests::postgres_with(options).await?))
}

async fn mysql_elsewhere() -> Option<MySqlTable> {
    use sqlx::Executor;
    lease_tests::mysql().await?;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET time_zone = '+05:30'").await?;
                Ok(())
            })
        })
        .connect(&lease_tests::mysql_url())
        .await
        .expect("connect");
    Some(MySqlTable::new(pool))
}

/// What `b` knows of `name`, which it has a row of.
async fn row(b: &impl Backend, name: &str) -> LeaseInfo {
    let info = b.inspect(name).await.expect("inspect");
    info.expect("a row")
}

/// `b`'s answer to `request`.
async fn claim(b: &impl Backend, request: Request<'_>) -> Acquired {
    b.acquire_with(request).await.expect("acquire_with")
}

const YEAR: Duration = Duration::from_secs(366 * 24 * 3600);

/// The slot is `floor(server clock / period)` by the server's clock (in
/// UTC whatever the session's time zone); a slot at or below the one
/// recorded is refused whoever holds the lease, and the record outlives
/// the release.
async fn a_slot_is_claimed_once_by_the_server_clock<B: Sql>(b: &B) {
    let minute = OncePer::new(Duration::from_secs(60));
    let (name, other) = (unique("slot"), unique("slot"));
    let before = b.number(format!("SELECT {}", B::NOW_US)).await / 60_000_000;
    let granted = claim(b, Request::new(&name, "a", LONG).once_per(minute)).await;
    let after = b.number(format!("SELECT {}", B::NOW_US)).await / 60_000_000;
    let Acquired::Granted(grant) = granted else {
        panic!("{granted:?}")
    };
    let slot = grant.slot.expect("a slot") as i64;
    assert!(
        (before..=after).contains(&slot),
        "{before} <= {slot} <= {after}"
    );
    assert_eq!((grant.fencing_token, grant.last_slot), (Some(1), None));
    assert_eq!(row(b, &name).await.slot, Some(slot as u64));

    let year = OncePer::new(YEAR);
    let first = claim(b, Request::new(&other, "a", LONG).once_per(year)).await;
    let Acquired::Granted(Grant {
        slot: Some(slot), ..
    }) = first
    else {
        panic!("{first:?}")
    };
    let ran = Acquired::AlreadyRan { slot };
    for holder in ["a", "b"] {
        let again = claim(b, Request::new(&other, holder, LONG).once_per(year)).await;
        assert_eq!(again, ran, "{holder}, while a holds the lease");
    }
    release(b, &other, "a", 1).await;
    assert_eq!(
        claim(b, Request::new(&other, "b", LONG).once_per(year)).await,
        ran
    );
    assert_eq!(
        acquire(b, &other, "b", LONG).await,
        Some(2),
        "a plain lease"
    );
    release(b, &other, "b", 2).await;
    let job = Lease::with_holder(b.clone(), "c");
    let skipped = job
        .job(&other, LONG)
        .once_per(YEAR)
        .run(|_, _| async {})
        .await;
    assert!(matches!(skipped, Outcome::Skipped(Skip::AlreadyRan { slot: s }) if s == slot));
}

/// With `retry_failed` the grant records nothing; `release_ran` records the
/// slot as it releases, whoever holds the lease by then, and never lowers it.
async fn retry_failed_records_the_slot_at_release_ran<B: Sql>(b: &B) {
    let name = unique("retry");
    let once = OncePer::new(YEAR).retry_failed(true);
    let first = claim(b, Request::new(&name, "a", LONG).once_per(once)).await;
    let Acquired::Granted(Grant {
        slot: Some(slot), ..
    }) = first
    else {
        panic!("{first:?}")
    };
    assert_eq!(row(b, &name).await.slot, None);
    let held = claim(b, Request::new(&name, "b", LONG).once_per(once)).await;
    assert!(
        matches!(held, Acquired::HeldElsewhere { expires_in: Some(left) } if left <= LONG),
        "{held:?}"
    );
    release(b, &name, "a", 1).await; // the run failed
    let second = claim(b, Request::new(&name, "b", LONG).once_per(once)).await;
    assert!(
        matches!(second, Acquired::Granted(g) if g.slot == Some(slot) && g.fencing_token == Some(2)),
        "{second:?}"
    );
    b.release_ran(acquisition(&name, "b", 2), slot)
        .await
        .expect("release_ran");
    let info = row(b, &name).await;
    assert_eq!((info.slot, info.is_held()), (Some(slot), false));
    let ran = claim(b, Request::new(&name, "a", LONG).once_per(once)).await;
    assert_eq!(ran, Acquired::AlreadyRan { slot });

    assert_eq!(acquire(b, &name, "c", LONG).await, Some(3));
    b.release_ran(acquisition(&name, "c", 3), slot - 1)
        .await
        .expect("release_ran");
    let info = row(b, &name).await;
    assert_eq!(
        (info.slot, info.is_held()),
        (Some(slot), false),
        "never lowered"
    );
    assert_eq!(acquire(b, &name, "d", LONG).await, Some(4));
    b.release_ran(acquisition(&name, "c", 3), slot + 5)
        .await
        .expect("release_ran");
    assert_eq!(row(b, &name).await.slot, Some(slot + 5));
    assert!(
        renew(b, &name, "d", 4).await,
        "d's lease is not c's to release"
    );
}

/// A value is stored with the grant and by `publish` of the current
/// acquisition, shown while held, and gone with a release, and with an
/// acquisition without one (a take-over after the holder crashed).
async fn values_are_published_while_held<B: Sql>(b: &B) {
    let name = unique("value");
    let granted = claim(b, Request::new(&name, "a", LONG).value("10.0.0.7:8080")).await;
    assert!(matches!(granted, Acquired::Granted(g) if g.fencing_token == Some(1)));
    assert_eq!(row(b, &name).await.value.as_deref(), Some("10.0.0.7:8080"));
    let wide = "ü".repeat(leasehold::MAX_VALUE_LEN / 2); // 4 KiB of UTF-8
    assert!(
        b.publish(acquisition(&name, "a", 1), Some(&wide))
            .await
            .expect("publish")
    );
    assert_eq!(row(b, &name).await.value, Some(wide.clone()));
    assert!(
        !b.publish(acquisition(&name, "a", 2), Some("x"))
            .await
            .expect("publish"),
        "not a's"
    );
    let held = claim(b, Request::new(&name, "b", LONG).value("x")).await;
    assert!(
        matches!(
            held,
            Acquired::HeldElsewhere {
                expires_in: Some(_)
            }
        ),
        "{held:?}"
    );
    assert_eq!(row(b, &name).await.value, Some(wide));
    assert!(
        b.publish(acquisition(&name, "a", 1), None)
            .await
            .expect("publish")
    );
    assert_eq!(row(b, &name).await.value, None);
    assert!(
        b.publish(acquisition(&name, "a", 1), Some("y"))
            .await
            .expect("publish")
    );
    release(b, &name, "a", 1).await;
    assert_eq!(acquire(b, &name, "b", LONG).await, Some(2));
    assert_eq!(row(b, &name).await.value, None, "released with a's lease");

    let crashed = unique("value-crashed");
    let short = Duration::from_millis(200);
    let granted = claim(b, Request::new(&crashed, "a", short).value("a's")).await;
    assert!(matches!(granted, Acquired::Granted(_)), "{granted:?}");
    tokio::time::sleep(short + 100 * MS).await;
    assert_eq!(acquire(b, &crashed, "b", LONG).await, Some(2));
    assert_eq!(row(b, &crashed).await.value, None, "a's is gone");
}

/// `force_release` takes the lease from its holder (renewals fail) and
/// keeps it from everyone until the expiry it had; `force_release_now`
/// frees it at once. The fence goes on.
async fn force_release_keeps_the_lock_delay<B: Sql>(b: &B) {
    let name = unique("forced");
    let ttl = Duration::from_millis(1_500);
    let asked = std::time::Instant::now();
    assert_eq!(acquire(b, &name, "a", ttl).await, Some(1));
    assert!(
        b.publish(acquisition(&name, "a", 1), Some("v"))
            .await
            .expect("publish")
    );
    assert!(b.force_release(&name).await.expect("force_release"));
    let info = row(b, &name).await;
    assert!(info.forced && info.is_held(), "{info:?}");
    assert_eq!((info.holder.as_str(), info.value), ("", None));
    assert!(
        !renew(b, &name, "a", 1).await,
        "the evicted holder's renewal fails"
    );
    release(b, &name, "a", 1).await; // a no-op
    assert!(row(b, &name).await.forced);
    assert_eq!(acquire(b, &name, "b", ttl).await, None);
    let held = claim(b, Request::new(&name, "b", ttl).value("v")).await;
    assert!(
        matches!(held, Acquired::HeldElsewhere { expires_in: Some(left) } if left <= ttl),
        "{held:?}"
    );
    assert!(
        !b.force_release(&name).await.expect("force_release"),
        "held by nobody"
    );
    let taken = loop {
        if acquire(b, &name, "b", LONG).await.is_some() {
            break asked.elapsed();
        }
        tokio::time::sleep(20 * MS).await;
    };
    // The host's clocks, wall and monotonic, may differ by a little.
    assert!(
        taken >= ttl - 20 * MS,
        "granted {taken:?} after a's request"
    );
    assert_eq!(row(b, &name).await.fencing_token, Some(2));

    assert!(b.force_release_now(&name).await.expect("force_release_now"));
    assert_eq!(acquire(b, &name, "c", LONG).await, Some(3), "free at once");
    assert!(b.force_release(&name).await.expect("force_release"));
    assert!(
        b.force_release_now(&name).await.expect("force_release_now"),
        "a forced lease too"
    );
    assert_eq!(acquire(b, &name, "d", LONG).await, Some(4));
}

/// A table made before `last_slot` and `value` (`0001` only, like the Go
/// services' with a fence) serves plain leases; a call that needs a
/// column it lacks fails with `Error::Schema` naming the `ALTER TABLE` of
/// the migration file; once the file has run, the same backend uses them.
async fn a_table_without_the_new_columns_serves_plain_leases<B: Sql>(b: &B) {
    let old = b.on(&table_name("old_leases"));
    for statement in on_table(B::CREATE, old.table()) {
        old.exec(statement).await;
    }
    let name = unique("old");
    assert_eq!(acquire(&old, &name, "a", LONG).await, Some(1));
    assert!(renew(&old, &name, "a", 1).await);
    let info = row(&old, &name).await;
    assert_eq!((info.value, info.slot, info.forced), (None, None, false));
    assert!(old.force_release(&name).await.expect("force_release"));
    assert!(
        old.force_release_now(&name)
            .await
            .expect("force_release_now")
    );
    assert_eq!(old.list().await.expect("list").len(), 1);

    let alters = on_table(B::ADD_COLUMNS, old.table());
    let refused = |e: Error, names: &[&String]| match e {
        Error::Schema { fix, .. } => {
            for statement in &alters {
                let named = fix.contains(&format!("`{statement}`"));
                assert_eq!(named, names.contains(&statement), "{statement} in {fix}");
            }
        }
        e => panic!("{e:?}"),
    };
    let once = Request::new(&name, "b", LONG).once_per(OncePer::new(YEAR));
    refused(
        old.acquire_with(once).await.expect_err("refused"),
        &[&alters[0], &alters[1]],
    );
    let proclaim = Request::new(&name, "b", LONG).value("v");
    refused(
        old.acquire_with(proclaim).await.expect_err("refused"),
        &[&alters[0], &alters[1]],
    );
    let publish = old.publish(acquisition(&name, "a", 1), Some("v")).await;
    refused(publish.expect_err("refused"), &[&alters[1]]);
    assert_eq!(
        acquire(&old, &name, "b", LONG).await,
        Some(2),
        "plain still works"
    );

    for statement in alters {
        old.exec(statement).await;
    }
    release(&old, &name, "b", 2).await;
    let granted = claim(&old, once).await;
    assert!(
        matches!(granted, Acquired::Granted(g) if g.slot.is_some()),
        "{granted:?}"
    );
    drop_table(&old).await;
}

/// A holder checks in inside a transaction, then stalls past its ttl: its
/// token fires and its lease expires on the server, yet no other holder is
/// granted the lease until that transaction ends, and what the transaction
/// then writes is committed before the other holder's grant. (Nothing is
/// written before the stall: the check alone keeps the lease.)
async fn a_checked_in_transaction_keeps_the_lease_until_it_ends<B: Sql>(b: &B) {
    let (name, log) = (unique("checked"), table_name("log"));
    let ttl = Duration::from_secs(1);
    b.exec(format!(
        "CREATE TABLE {log} (who VARCHAR(8) NOT NULL, at_us BIGINT NOT NULL)"
    ))
    .await;
    let write = |who: &str| format!("INSERT INTO {log} VALUES ('{who}', {})", B::NOW_US);
    let a = Lease::with_holder(b.clone(), "a");
    let guard = a
        .try_acquire(&name, ttl)
        .await
        .expect("try_acquire")
        .expect("free");
    let mut tx = b.begin().await;
    tx.check_in(&guard).await.expect("a holds the lease");

    let (contender, contended) = (b.clone(), name.clone());
    let taken = tokio::spawn(async move {
        loop {
            if let Some(fence) = acquire(&contender, &contended, "b", LONG).await {
                return fence;
            }
            tokio::time::sleep(20 * MS).await;
        }
    });
    tokio::time::sleep(ttl + 500 * MS).await; // a stalls
    assert!(guard.token().is_cancelled(), "a's token fired");
    let info = row(b, &name).await;
    assert_eq!(info.expires_in, None, "a's lease expired on the server");
    assert!(
        !taken.is_finished(),
        "b was granted the lease during a's transaction"
    );
    tx.exec(write("a")).await;
    tx.commit().await;
    let fence = tokio::time::timeout(ttl * 3, taken)
        .await
        .expect("b's grant")
        .expect("the contender");
    assert_eq!(fence, 2);
    b.exec(write("b")).await;
    let at = |who: &str| b.number(format!("SELECT at_us FROM {log} WHERE who = '{who}'"));
    let (a_at, b_at) = (at("a").await, at("b").await);
    assert!(a_at < b_at, "a wrote at {a_at}, b at {b_at}");
    drop(guard);
    b.exec(format!("DROP TABLE {log}")).await;
}

/// A check after the lease was taken over fails with `NotHeld` and writes
/// nothing: the new holder's lease is as it was.
async fn a_check_in_after_a_takeover_is_not_held<B: Sql>(b: &B) {
    let name = unique("taken");
    let a = Lease::with_holder(b.clone(), "a");
    let guard = a
        .try_acquire(&name, LONG)
        .await
        .expect("try_acquire")
        .expect("free");
    assert!(b.force_release_now(&name).await.expect("force_release_now"));
    assert_eq!(acquire(b, &name, "b", LONG).await, Some(2));
    let before = row(b, &name).await;
    let mut tx = b.begin().await;
    let refused = tx.check_in(&guard).await;
    assert!(
        matches!(&refused, Err(Error::NotHeld { name: n }) if *n == name),
        "{refused:?}"
    );
    tx.commit().await;
    let after = row(b, &name).await;
    assert_eq!((after.holder.as_str(), after.fencing_token), ("b", Some(2)));
    assert!(
        after.expires_in <= before.expires_in,
        "{after:?} after {before:?}"
    );
    assert!(renew(b, &name, "b", 2).await);
}

/// A term checks in as a guard does (here with the backend in an `Arc`); a
/// guard of another backend is a clear error.
async fn a_term_checks_in_and_another_backend_cannot<B: Sql>(b: &B) {
    let name = unique("term");
    let election = Lease::with_holder(Arc::new(b.clone()), "a").elect(&name, LONG);
    let term = election.leading().await;
    let mut tx = b.begin().await;
    tx.check_in_term(&term)
        .await
        .expect("the leader holds the lease");
    tx.commit().await;

    let memory = Lease::new(Memory::new());
    let guard = memory
        .try_acquire(&name, LONG)
        .await
        .expect("try_acquire")
        .expect("free");
    let mut tx = b.begin().await;
    let error = tx.check_in(&guard).await.expect_err("refused");
    assert!(matches!(error, Error::Unsupported { .. }), "{error:?}");
    assert!(error.to_string().starts_with("check_in "), "{error}");
    drop(term);
    election.resign().await.expect("resign");
}

/// Short checked transactions, one after the other, leave the holder's
/// renewals alone: the lease stays valid over several ttls. (SQLite's
/// waiting writers poll rather than queue: with transactions back to back,
/// a renewal could find the lock taken at every poll.)
async fn short_checked_transactions_leave_the_renewals_alone<B: Sql>(b: &B) {
    let name = unique("short");
    let ttl = Duration::from_millis(900);
    let a = Lease::with_holder(b.clone(), "a");
    let guard = a
        .try_acquire(&name, ttl)
        .await
        .expect("try_acquire")
        .expect("free");
    let until = std::time::Instant::now() + ttl * 3;
    while std::time::Instant::now() < until {
        let mut tx = b.begin().await;
        tx.check_in(&guard).await.expect("still held");
        tokio::time::sleep(20 * MS).await;
        tx.commit().await;
        tokio::time::sleep(80 * MS).await;
    }
    assert!(guard.is_valid() && !guard.token().is_cancelled());
    guard.release().await.expect("release");
}

/// `on_every_table!(property, ..)`: a test per property and server, each
/// on a table of its own.
/// An acquisition by the lease's own holder never moves its expiry
/// earlier. Such an acquisition arrives late when its client gave up on it
/// (its time limit passed while it waited on the row's lock, held by a
/// checked-in transaction) and the holder acquired again meanwhile: the
/// statement then carries an expiry computed before the wait, earlier than
/// the one the holder counts on. The fault suite saw it (`stop-in-txn` on
/// `PgTable`, 10 injections: the holder's late attempt cut its new lease to
/// an expiry in the past, and another contender was granted the lease 8 ms
/// before the holder's deadline). Here a re-acquisition with a shorter ttl
/// stands for that statement, by plain `acquire` and by `acquire_with`.
async fn a_late_acquisition_of_the_holder_never_moves_its_expiry_earlier<B: Sql>(b: &B) {
    let name = unique("late");
    let fence = acquire(b, &name, "a", LONG).await.expect("granted");
    let short = Duration::from_secs(1);
    assert_eq!(
        acquire(b, &name, "a", short).await,
        Some(fence),
        "re-acquired"
    );
    let left = row(b, &name).await.expires_in.expect("live");
    assert!(
        left > LONG - Duration::from_secs(10),
        "acquire: {left:?} left"
    );
    let with = claim(b, Request::new(&name, "a", short).value("v")).await;
    assert!(
        matches!(with, Acquired::Granted(ref g) if g.fencing_token == Some(fence)),
        "{with:?}"
    );
    let left = row(b, &name).await.expires_in.expect("live");
    assert!(
        left > LONG - Duration::from_secs(10),
        "acquire_with: {left:?} left"
    );
    assert_eq!(acquire(b, &name, "b", LONG).await, None, "still a's");
}

/// The same for a renewal: one that reaches the row late (it waited on a
/// row lock, or its caller gave up on it and renewed again) computed its
/// expiry from an earlier instant, here stood in for by a shorter ttl; the
/// holder's deadline follows the newer renewal, so the server's expiry must
/// not fall below it.
async fn a_late_renewal_never_moves_the_expiry_earlier<B: Sql>(b: &B) {
    let name = unique("late-renewal");
    let fence = acquire(b, &name, "a", Duration::from_secs(1))
        .await
        .expect("granted");
    let lease = acquisition(&name, "a", fence);
    assert!(b.renew(lease, LONG).await.expect("renew"), "renewed");
    let short = Duration::from_secs(1);
    assert!(b.renew(lease, short).await.expect("renew"), "renewed again");
    let left = row(b, &name).await.expires_in.expect("live");
    assert!(
        left > LONG - Duration::from_secs(10),
        "renew: {left:?} left"
    );
    let many = b.renew_many(&[(lease, short)]).await.expect("renew_many");
    assert_eq!(many, [true]);
    let left = row(b, &name).await.expires_in.expect("live");
    assert!(
        left > LONG - Duration::from_secs(10),
        "renew_many: {left:?} left"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(acquire(b, &name, "b", LONG).await, None, "still a's");
}

macro_rules! on_every_table {
    ($($property:ident),* $(,)?) => {
        mod postgres {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $property() {
                if let Some(base) = super::pg_elsewhere().await {
                    let table = super::fresh(base).await;
                    super::$property(&table).await;
                    super::drop_table(&table).await;
                }
            }
        )*}
        mod mysql {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $property() {
                if let Some(base) = super::mysql_elsewhere().await {
                    let table = super::fresh(base).await;
                    super::$property(&table).await;
                    super::drop_table(&table).await;
                }
            }
        )*}
        mod sqlite {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $property() {
                let db = lease_tests::TempDb::new("lease-sqlite-features");
                let base = leasehold::backend::SqliteTable::open(db.path()).await.expect("open");
                super::$property(&super::fresh(base).await).await;
            }
        )*}
    };
}
on_every_table!(
    a_slot_is_claimed_once_by_the_server_clock,
    retry_failed_records_the_slot_at_release_ran,
    values_are_published_while_held,
    force_release_keeps_the_lock_delay,
    a_table_without_the_new_columns_serves_plain_leases,
    a_checked_in_transaction_keeps_the_lease_until_it_ends,
    a_check_in_after_a_takeover_is_not_held,
    a_term_checks_in_and_another_backend_cannot,
    short_checked_transactions_leave_the_renewals_alone,
    a_late_acquisition_of_the_holder_never_moves_its_expiry_earlier,
    a_late_renewal_never_moves_the_expiry_earlier,
);

/// `check_in` on a connection to another database says so: PostgreSQL
/// compares the databases' names (the other one has the table too, here a
/// temporary one with the very row); MariaDB and SQLite find no such table.
#[tokio::test]
async fn a_check_in_on_another_database_is_refused() {
    use sqlx::{ConnectOptions, Connection};

    let refused = |result: Result<(), Error>, problem: &str| match result {
        Err(Error::Schema { problem: p, .. }) => assert!(p.contains(problem), "{p}"),
        other => panic!("{other:?}"),
    };
    if let Some(base) = pg_elsewhere().await {
        let table = fresh(base).await;
        let lease = Lease::with_holder(table.clone(), "a");
        let guard = lease
            .try_acquire("job", LONG)
            .await
            .expect("try_acquire")
            .expect("free");
        let url: sqlx::postgres::PgConnectOptions =
            lease_tests::postgres_url().parse().expect("a url");
        let mut other = url.database("postgres").connect().await.expect("connect");
        let mut tx = other.begin().await.expect("begin");
        let t = table.table();
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TEMP TABLE {t} (name TEXT, holder TEXT, expires_at TIMESTAMPTZ, fence BIGINT); \
             INSERT INTO {t} VALUES ('job', 'a', clock_timestamp() + interval '1 hour', 1)"
        )))
        .execute(&mut *tx)
        .await
        .expect("a table like it");
        refused(guard.check_in(&mut *tx).await, "the database postgres");
        drop(tx);
        drop_table(&table).await;
    }
    if let Some(base) = mysql_elsewhere().await {
        let table = fresh(base).await;
        let lease = Lease::with_holder(table.clone(), "a");
        let guard = lease
            .try_acquire("job", LONG)
            .await
            .expect("try_acquire")
            .expect("free");
        let url: sqlx::mysql::MySqlConnectOptions =
            lease_tests::mysql_url().parse().expect("a url");
        let mut other = url.database("mysql").connect().await.expect("connect");
        let mut tx = other.begin().await.expect("begin");
        refused(guard.check_in(&mut *tx).await, "no such table");
        drop(tx);
        drop_table(&table).await;
    }
    let (db, elsewhere) = (TempDb::new("lease-sqlite-a"), TempDb::new("lease-sqlite-b"));
    let table = SqliteTable::open(db.path()).await.expect("open");
    let other = SqliteTable::open(elsewhere.path()).await.expect("open");
    let lease = Lease::with_holder(fresh(table).await, "a");
    let guard = lease
        .try_acquire("job", LONG)
        .await
        .expect("try_acquire")
        .expect("free");
    let mut tx = other.pool().begin().await.expect("begin");
    refused(guard.check_in(&mut *tx).await, "no such table");
}
