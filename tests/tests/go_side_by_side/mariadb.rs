//! MariaDB: Go and Rust replicas on one `task_leases` table.

use super::*;

/// A pool whose sessions use `zone` as their time_zone.
async fn mysql_pool(zone: &str) -> Option<MySqlPool> {
    let base = lease_tests::mysql().await?;
    let options: MySqlConnectOptions = base.connect_options().as_ref().clone();
    base.close().await;
    let pool = MySqlPoolOptions::new()
        .max_connections(10)
        .connect_with(options.timezone(Some(zone.to_owned())))
        .await
        .expect("connect");
    Some(pool)
}

/// The Go services' table (text columns, a whole-seconds time column of
/// type `time`), and the shipped migration run on it.
async fn mysql_go_table(go: &MySqlPool, time: &str) -> (String, MySqlTable) {
    let table = table_name("go_leases");
    go.execute(AssertSqlSafe(format!(
        "CREATE TABLE {table} (name VARCHAR(255) NOT NULL PRIMARY KEY, \
         holder VARCHAR(255) NOT NULL, expires_at {time} NOT NULL) ENGINE=InnoDB"
    )))
    .await
    .expect("create the Go table");
    let rust = MySqlTable::new(go.clone())
        .with_table(&table)
        .expect("valid");
    go.execute(AssertSqlSafe(rust.fence_migration().to_owned()))
        .await
        .expect("the fence migration");
    (table, rust)
}

async fn mysql_fleet(time: &str, expect: Expect) {
    let (Some(go), Some(rust)) = (mysql_pool("+09:00").await, mysql_pool("+03:00").await) else {
        return;
    };
    let (table, _) = mysql_go_table(&go, time).await;
    let backend = MySqlTable::new(rust.clone())
        .with_table(&table)
        .expect("valid");
    let outcome = first_use(&backend).await;
    assert_eq!(outcome, expect, "expires_at {time}");
    if outcome == Expect::Runs {
        let repo = GoRepo::MySql {
            pool: go.clone(),
            table: table.clone(),
        };
        let t = Timing {
            go_ttl: Duration::from_secs(1),
            rust_ttl: ms(600),
            run_for: Duration::from_secs(10),
            max_work: ms(300),
        };
        fleet(GoSide::Table(repo), backend, 3, 3, t).await;
    }
    go.execute(AssertSqlSafe(format!("DROP TABLE {table}")))
        .await
        .expect("drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_timestamp_mixed_fleet_never_double_runs() {
    mysql_fleet("TIMESTAMP", Expect::Runs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_go_table_needs_the_fence_migration() {
    let Some(pool) = lease_tests::mysql().await else {
        return;
    };
    let table = table_name("go_leases");
    pool.execute(AssertSqlSafe(format!(
        "CREATE TABLE {table} (name VARCHAR(255) NOT NULL PRIMARY KEY, \
         holder VARCHAR(255) NOT NULL, expires_at TIMESTAMP NOT NULL) ENGINE=InnoDB"
    )))
    .await
    .expect("create the Go table");
    let repo = GoRepo::MySql {
        pool: pool.clone(),
        table: table.clone(),
    };
    let backend = MySqlTable::new(pool.clone())
        .with_table(&table)
        .expect("valid");
    go_table_needs_the_fence_migration(&repo, &backend, backend.fence_migration(), &table).await;
    pool.execute(AssertSqlSafe(format!("DROP TABLE {table}")))
        .await
        .expect("drop");
}

/// `DATETIME`, written by the Go side in its session's time zone: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_datetime_shared_with_go_is_refused() {
    mysql_fleet("DATETIME", Expect::Refused).await;
}
