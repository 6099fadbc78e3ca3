//! PostgreSQL: Go and Rust replicas on one `task_leases` table.

use super::*;

/// A pool whose sessions use `zone` as their TimeZone.
async fn pg_pool(zone: &'static str) -> Option<PgPool> {
    let base = lease_tests::postgres().await?;
    let options: PgConnectOptions = base.connect_options().as_ref().clone();
    base.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                conn.execute(AssertSqlSafe(format!("SET TimeZone = '{zone}'")))
                    .await
                    .map(drop)
            })
        })
        .connect_with(options)
        .await
        .expect("connect");
    Some(pool)
}

/// The Go services' table, with `expires_at` of type `time`, and the
/// shipped migration run on it.
async fn pg_go_table(go: &PgPool, time: &str) -> (String, PgTable) {
    let table = table_name("go_leases");
    go.execute(AssertSqlSafe(format!(
        "CREATE TABLE {table} (name TEXT PRIMARY KEY, holder TEXT NOT NULL, \
         expires_at {time} NOT NULL)"
    )))
    .await
    .expect("create the Go table");
    let rust = PgTable::new(go.clone()).with_table(&table).expect("valid");
    go.execute(AssertSqlSafe(rust.fence_migration().to_owned()))
        .await
        .expect("the fence migration");
    (table, rust)
}

async fn pg_fleet(time: &str, go_count: usize, expect: Expect) {
    let (Some(go), Some(rust)) = (
        pg_pool("Asia/Tokyo").await,
        pg_pool("America/New_York").await,
    ) else {
        return;
    };
    let (table, _) = pg_go_table(&go, time).await;
    let backend = PgTable::new(rust.clone())
        .with_table(&table)
        .expect("valid");
    let outcome = first_use(&backend).await;
    assert_eq!(outcome, expect, "expires_at {time}");
    if outcome == Expect::Runs {
        let repo = GoRepo::Pg {
            pool: go.clone(),
            table: table.clone(),
        };
        let t = Timing {
            go_ttl: ms(300),
            rust_ttl: ms(300),
            run_for: Duration::from_secs(6),
            max_work: ms(250),
        };
        fleet(GoSide::Table(repo), backend, go_count, 3, t).await;
    }
    go.execute(AssertSqlSafe(format!("DROP TABLE {table}")))
        .await
        .expect("drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_timestamptz_mixed_fleet_never_double_runs() {
    pg_fleet("TIMESTAMPTZ", 3, Expect::Runs).await;
}

/// Whole seconds: expiries are rounded to the second. One Go contender
/// only: Go contenders among themselves compare rounded expiries exactly,
/// which is their own affair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_timestamptz_of_seconds_mixed_fleet_never_double_runs() {
    pg_fleet("TIMESTAMPTZ(0)", 1, Expect::Runs).await;
}

/// `timestamp` without time zone, written by the Go side in its session's
/// TimeZone: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_timestamp_shared_with_go_is_refused() {
    pg_fleet("TIMESTAMP", 3, Expect::Refused).await;
}

/// A table made for the Go services, without `fence`: refused at first
/// use with an error naming the table, the column and the statement that
/// adds it; after that statement, it works, and rows the Go services
/// inserted (fence 0) get fences from 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_go_table_needs_the_fence_migration() {
    let Some(pool) = lease_tests::postgres().await else {
        return;
    };
    let table = table_name("go_leases");
    pool.execute(AssertSqlSafe(format!(
        "CREATE TABLE {table} (name TEXT PRIMARY KEY, holder TEXT NOT NULL, \
         expires_at TIMESTAMPTZ NOT NULL)"
    )))
    .await
    .expect("create the Go table");
    let repo = GoRepo::Pg {
        pool: pool.clone(),
        table: table.clone(),
    };
    let backend = PgTable::new(pool.clone())
        .with_table(&table)
        .expect("valid");
    go_table_needs_the_fence_migration(&repo, &backend, backend.fence_migration(), &table).await;
    pool.execute(AssertSqlSafe(format!("DROP TABLE {table}")))
        .await
        .expect("drop");
}
