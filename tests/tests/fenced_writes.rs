//! The README's recipe for a resource outside the lease's database
//! ("Guarded writes"): a `fence` column and a conditional `UPDATE` make any
//! SQL table reject a write that carries an older fencing token than one it
//! has accepted — the write of a holder that paused past its lease.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease_tests::unique;
use leasehold::Lease;
use leasehold::backend::{MySqlTable, PgTable};
use tokio::time::sleep;

const TTL: Duration = Duration::from_millis(300);

/// The recipe's statement on PostgreSQL (`$1` data, `$2` the writer's
/// fencing token, `$3` the row): rows affected 0 = a newer holder has
/// written, the write is refused.
const PG_WRITE: &str = "UPDATE {t} SET data = $1, fence = $2 WHERE id = $3 AND fence <= $2";
/// The same on MySQL/MariaDB (`?` in the order data, fence, id, fence).
const MYSQL_WRITE: &str = "UPDATE {t} SET data = ?, fence = ? WHERE id = ? AND fence <= ?";

/// A holder acquires, then stalls past its lease; a second holder takes
/// the lease and writes; the first one's late write is refused; a write by
/// the current holder is accepted.
#[tokio::test]
async fn pg_a_stale_holders_write_is_refused() {
    let Some(pool) = lease_tests::postgres().await else {
        return;
    };
    let backend = PgTable::new(pool.clone());
    backend.ensure_schema().await.unwrap();
    let t = unique("resource").replace('-', "_");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {t} (id TEXT PRIMARY KEY, data TEXT, fence BIGINT NOT NULL DEFAULT 0); \
         INSERT INTO {t} (id, data) VALUES ('report', NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let write = PG_WRITE.replace("{t}", &t);
    let write = |data: &'static str, fence: u64| {
        let (pool, write) = (pool.clone(), write.clone());
        async move {
            sqlx::query(sqlx::AssertSqlSafe(write))
                .bind(data)
                .bind(i64::try_from(fence).unwrap())
                .bind("report")
                .execute(&pool)
                .await
                .unwrap()
                .rows_affected()
        }
    };
    let (old, new) = holders(backend).await;
    assert_eq!(write("new", new).await, 1, "the current holder writes");
    assert_eq!(
        write("stale", old).await,
        0,
        "the stale holder's write is refused"
    );
    let (data,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT data FROM {t} WHERE id = 'report'"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(data, "new");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {t}")))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn mysql_a_stale_holders_write_is_refused() {
    let Some(pool) = lease_tests::mysql().await else {
        return;
    };
    let backend = MySqlTable::new(pool.clone());
    backend.ensure_schema().await.unwrap();
    let t = unique("resource").replace('-', "_");
    for statement in [
        format!(
            "CREATE TABLE {t} (id VARCHAR(64) PRIMARY KEY, data TEXT, fence BIGINT NOT NULL DEFAULT 0)"
        ),
        format!("INSERT INTO {t} (id, data) VALUES ('report', NULL)"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&pool)
            .await
            .unwrap();
    }
    let write = MYSQL_WRITE.replace("{t}", &t);
    let write = |data: &'static str, fence: u64| {
        let (pool, write) = (pool.clone(), write.clone());
        async move {
            let fence = i64::try_from(fence).unwrap();
            sqlx::query(sqlx::AssertSqlSafe(write))
                .bind(data)
                .bind(fence)
                .bind("report")
                .bind(fence)
                .execute(&pool)
                .await
                .unwrap()
                .rows_affected()
        }
    };
    let (old, new) = holders(backend).await;
    assert_eq!(write("new", new).await, 1, "the current holder writes");
    assert_eq!(
        write("stale", old).await,
        0,
        "the stale holder's write is refused"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {t}")))
        .execute(&pool)
        .await
        .unwrap();
}

/// Two holders of one lease, one after the other: the first lets its lease
/// expire without releasing it (a paused process), the second acquires.
/// Their fencing tokens, old and new.
async fn holders(backend: impl leasehold::Backend + Clone) -> (u64, u64) {
    let name = unique("fenced-write");
    let first = Lease::with_holder(backend.clone(), "paused");
    let paused = first
        .try_acquire(&name, TTL)
        .await
        .expect("acquire")
        .expect("free");
    let old = paused.fencing_token().unwrap();
    // The paused process: its lease is no longer renewed (a shutdown
    // leaves a body still running at the end of its grace to expire).
    first.shutdown().await;
    sleep(TTL * 2).await;
    let second = Lease::with_holder(backend, "next");
    let guard = second
        .try_acquire(&name, TTL)
        .await
        .expect("acquire")
        .expect("expired");
    let new = guard.fencing_token().unwrap();
    assert!(new > old);
    guard.release().await.unwrap();
    drop(paused);
    (old, new)
}
