//! The properties of the table backends (with [`TableBackend`], their
//! inherent API): not part of `leasehold-conformance`, which checks what
//! every backend must do.

use super::*;

/// What the `tables` properties need beyond `Backend`: the inherent API of
/// the table backends.
pub(crate) trait TableBackend: Backend + Clone + std::fmt::Debug {
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
    /// The first migration in `migrations/<database>/`: a table made before
    /// schedule slots and values, without `last_slot` and `value`.
    const FIRST: &'static str;
    /// The migration that adds `last_slot` and `value`.
    const ADD_COLUMNS: &'static str;
    /// Runs `sql` (statements separated by `;`).
    fn exec(&self, sql: String) -> impl Future<Output = ()> + Send;
}

/// `table_backend!(type, migrations, add_columns, now, expires_at)`:
/// `migrations` is the folder of the database's migrations and
/// `add_columns` the file in it that adds `last_slot` and `value`; `now`
/// reads the backend's clock, `expires_at` a row's expiry (binding the
/// name), both in microseconds since the Unix epoch.
macro_rules! table_backend {
    ($($t:ty, $dir:literal, $add:literal, $now:expr, $expires_at:expr;)*) => {$(
        impl TableBackend for $t {
            const FIRST: &'static str =
                include_str!(concat!("../../../migrations/", $dir, "/0001_task_leases.sql"));
            const ADD_COLUMNS: &'static str =
                include_str!(concat!("../../../migrations/", $dir, "/", $add));
            fn exec(&self, sql: String) -> impl Future<Output = ()> + Send {
                let pool = self.pool().clone();
                async move {
                    let done = sqlx::raw_sql(AssertSqlSafe(sql.clone())).execute(&pool).await;
                    done.unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            }
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
    "postgres",
    "0003_add_last_slot_and_value.sql",
    "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::int8",
    "SELECT (EXTRACT(EPOCH FROM expires_at) * 1000000)::int8 FROM {table} WHERE name = $1";
    // A `DATETIME(6)` column in UTC (`ensure_schema`), written with `UTC_TIMESTAMP(6)`.
    MySqlTable,
    "mysql",
    "0002_add_last_slot_and_value.sql",
    "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
    "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at) \
     FROM {table} WHERE name = ?";
    // Milliseconds of the host's clock, read by SQLite as the statements do.
    SqliteTable,
    "sqlite",
    "0002_add_last_slot_and_value.sql",
    "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000",
    "SELECT expires_at * 1000 FROM {table} WHERE name = ?1";
);

// ------------------------------------------- properties of the table backends

pub(crate) async fn table_names_are_validated<S: Subject>(s: &S)
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
pub(crate) async fn backend_calls_reject_invalid_input<S: Subject>(s: &S)
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
pub(crate) async fn expiry_is_the_server_time_of_the_request_plus_the_ttl<S: Subject>(s: &S)
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
pub(crate) async fn within_ttl_of_the_request<B: TableBackend, T>(
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

pub(crate) async fn ensure_schema_twice_and_concurrently<S: Subject>(s: &S)
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

/// A lease table made before schedule slots and values (the first
/// migration only) still serves plain leases; a `once_per` run on it fails with
/// `Error::Schema` naming the `ALTER TABLE` (of the migration that adds the
/// column) that adds `last_slot`; once that migration has run, the same
/// backend claims slots.
pub(crate) async fn a_table_without_last_slot_names_the_alter<S: Subject>(s: &S)
where
    S::B: TableBackend,
{
    let b = s.backend();
    let old = b
        .clone()
        .with_table(&unique("old_leases").replace('-', "_"))
        .expect("valid");
    let on_old = |sql: &str| sql.replace(" task_leases ", &format!(" {} ", old.table()));
    old.exec(on_old(S::B::FIRST)).await;
    let name = unique("old-slot");
    let job = Lease::with_holder(old.clone(), "holder-a");
    let alter = on_old(S::B::ADD_COLUMNS);
    let add_last_slot = alter.lines().find(|l| l.contains("last_slot")).unwrap();
    match job.job(&name, LONG).once_per(ms(1_000)).acquire().await {
        Err(Error::Schema { fix, .. }) => {
            let statement = add_last_slot.trim_end_matches(';');
            assert!(fix.contains(statement), "{fix} does not name {statement}");
        }
        other => panic!("not refused: {other:?}"),
    }
    let guard = job.try_acquire(&name, LONG).await.unwrap();
    let guard = guard.expect("a plain lease on the old table");
    assert_eq!(guard.fencing_token(), Some(1));
    guard.release().await.unwrap();
    old.exec(alter).await;
    let guard = job.job(&name, LONG).once_per(ms(1_000)).acquire().await;
    let guard = guard.unwrap().expect("once_per after the migration");
    assert!(guard.slot().is_some() && guard.fencing_token() == Some(2));
    guard.release().await.unwrap();
    old.drop_table().await;
}
