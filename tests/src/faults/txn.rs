//! `stop-in-txn`'s resource: a plain table on the lease's own server, which
//! fences nothing, written in transactions checked in with the writer's
//! lease ([`leasehold::LeaseGuard::check_in`]), as an application guards
//! the writes of a table backend's lease (issue 33).
//!
//! Two tables on the private server (kept for the run, one row per
//! scenario): `fault_txn_counter(resource, n)` and
//! `fault_txn_writes(resource, holder, fence, kind, n)`. A write, in one
//! transaction: the check-in, `n = n + 1` on the counter's row, a log row
//! with that `n`, commit. The counter's row lock is held to the commit, so
//! `n` is the order of the commits. Every section writes once when it
//! starts (`start`), so a holder's write follows its grant; the victim of
//! `stop-in-txn` is stopped between its check-in and its write (`held`).
//! A write committed after one with a larger fence was committed after
//! that later holder's grant: it is stale
//! ([`ScenarioResult::unfenced`]). The check-in's share lock on the
//! lease's row keeps the next grant waiting until the transaction ends.

use std::time::Duration;

use sqlx::{Connection, MySqlPool, PgPool};
use tokio::sync::Notify;

use super::ScenarioResult;
use super::breaks::{self, Raw};
use super::worker::{Args, Holding, say};
use crate::servers::{PrivateServer, ServerKind};

/// Create the tables on `server` if missing, and the counter of `resource`.
pub(super) async fn create(server: &PrivateServer, resource: &str) -> Result<(), String> {
    let err = |e: sqlx::Error| format!("stop-in-txn tables: {e}");
    if server.kind() == ServerKind::MariaDb {
        let mut conn = sqlx::MySqlConnection::connect(&server.url())
            .await
            .map_err(err)?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS fault_txn_counter (resource VARCHAR(255) PRIMARY KEY, \
                 n BIGINT NOT NULL);
             CREATE TABLE IF NOT EXISTS fault_txn_writes (resource VARCHAR(255) NOT NULL, \
                 holder VARCHAR(255) NOT NULL, fence BIGINT NOT NULL, kind VARCHAR(16) NOT NULL, \
                 n BIGINT NOT NULL, PRIMARY KEY (resource, n))",
        )
        .execute(&mut conn)
        .await
        .map_err(err)?;
        sqlx::query("INSERT IGNORE INTO fault_txn_counter (resource, n) VALUES (?, 0)")
            .bind(resource)
            .execute(&mut conn)
            .await
            .map_err(err)?;
        let _ = conn.close().await;
    } else {
        let mut conn = sqlx::PgConnection::connect(&server.url())
            .await
            .map_err(err)?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS fault_txn_counter (resource TEXT PRIMARY KEY, \
                 n BIGINT NOT NULL);
             CREATE TABLE IF NOT EXISTS fault_txn_writes (resource TEXT NOT NULL, \
                 holder TEXT NOT NULL, fence BIGINT NOT NULL, kind TEXT NOT NULL, \
                 n BIGINT NOT NULL, PRIMARY KEY (resource, n))",
        )
        .execute(&mut conn)
        .await
        .map_err(err)?;
        sqlx::query(
            "INSERT INTO fault_txn_counter (resource, n) VALUES ($1, 0) ON CONFLICT DO NOTHING",
        )
        .bind(resource)
        .execute(&mut conn)
        .await
        .map_err(err)?;
        let _ = conn.close().await;
    }
    Ok(())
}

/// The writes committed for `resource`, `(holder, fence)` in commit order.
pub(super) async fn log(
    server: &PrivateServer,
    resource: &str,
) -> Result<Vec<(String, i64)>, String> {
    let err = |e: sqlx::Error| format!("stop-in-txn log: {e}");
    let select = "SELECT holder, fence FROM fault_txn_writes WHERE resource = {} ORDER BY n";
    if server.kind() == ServerKind::MariaDb {
        let mut conn = sqlx::MySqlConnection::connect(&server.url())
            .await
            .map_err(err)?;
        let rows = sqlx::query_as(sqlx::AssertSqlSafe(select.replace("{}", "?")))
            .bind(resource)
            .fetch_all(&mut conn)
            .await
            .map_err(err)?;
        let _ = conn.close().await;
        Ok(rows)
    } else {
        let mut conn = sqlx::PgConnection::connect(&server.url())
            .await
            .map_err(err)?;
        let rows = sqlx::query_as(sqlx::AssertSqlSafe(select.replace("{}", "$1")))
            .bind(resource)
            .fetch_all(&mut conn)
            .await
            .map_err(err)?;
        let _ = conn.close().await;
        Ok(rows)
    }
}

impl ScenarioResult {
    /// `stop-in-txn`: the writes committed to the unfenced table, as
    /// `(holder, fence)` in commit order. A write committed after one with a
    /// larger fence (a later holder's, written once it was granted) is
    /// stale: the check-in must have kept that grant waiting until the
    /// older transaction had ended.
    pub(super) fn unfenced(&mut self, log: &[(String, i64)]) {
        self.unfenced_writes = log.len();
        let mut max: Option<(i64, &str)> = None;
        for (holder, fence) in log {
            if max.is_some_and(|(m, h)| *fence < m && holder != h) {
                self.unfenced_stale += 1;
            }
            if max.is_none_or(|(m, _)| *fence > m) {
                max = Some((*fence, holder));
            }
        }
        if self.unfenced_stale > 0 {
            self.failures.push(format!(
                "{} stale writes committed to the unfenced table (after a later holder's)",
                self.unfenced_stale
            ));
        }
        if log.is_empty() {
            self.failures
                .push("no write committed to the unfenced table".to_owned());
        }
    }
}

/// A section's writer (in the contender).
pub(super) struct Writer<'a> {
    pub(super) raw: &'a Raw,
    pub(super) holding: &'a Holding,
    pub(super) args: &'a Args,
    pub(super) fence: i64,
}

impl Writer<'_> {
    /// One write, in a transaction checked in with the lease (not under the
    /// `skip-check-in` break); a write refused by the check-in (`NotHeld`)
    /// is rolled back. `held` (the nemesis' `txn-hold`): say `INTXN` once
    /// checked in and wait for `commit` (at most 10 s) before writing, then
    /// say `TXN`.
    pub(super) async fn write(&self, kind: &str, held: Option<&Notify>) {
        let written = match self.raw {
            Raw::Pg(pool) => self.pg(pool, kind, held).await,
            Raw::MySql(pool) => self.mysql(pool, kind, held).await,
            _ => Err("stop-in-txn needs a table backend".to_owned()),
        };
        if held.is_some() {
            say(match written {
                Ok(true) => "TXN ok",
                Ok(false) => "TXN refused",
                Err(_) => "TXN err",
            });
        }
        if let Err(e) = written {
            eprintln!("fault-suite worker: the {kind} write to the unfenced table: {e}");
        }
    }

    async fn pg(&self, pool: &PgPool, kind: &str, held: Option<&Notify>) -> Result<bool, String> {
        let err = |e: sqlx::Error| e.to_string();
        let mut tx = pool.begin().await.map_err(err)?;
        if !self.checked_in(&mut *tx, held).await? {
            return Ok(false);
        }
        sqlx::query("UPDATE fault_txn_counter SET n = n + 1 WHERE resource = $1")
            .bind(&self.args.key)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::query(
            "INSERT INTO fault_txn_writes (resource, holder, fence, kind, n) \
             SELECT $1, $2, $3, $4, n FROM fault_txn_counter WHERE resource = $1",
        )
        .bind(&self.args.key)
        .bind(&self.args.holder)
        .bind(self.fence)
        .bind(kind)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(true)
    }

    async fn mysql(
        &self,
        pool: &MySqlPool,
        kind: &str,
        held: Option<&Notify>,
    ) -> Result<bool, String> {
        let err = |e: sqlx::Error| e.to_string();
        let mut tx = pool.begin().await.map_err(err)?;
        if !self.checked_in(&mut *tx, held).await? {
            return Ok(false);
        }
        sqlx::query("UPDATE fault_txn_counter SET n = n + 1 WHERE resource = ?")
            .bind(&self.args.key)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::query(
            "INSERT INTO fault_txn_writes (resource, holder, fence, kind, n) \
             SELECT ?, ?, ?, ?, n FROM fault_txn_counter WHERE resource = ?",
        )
        .bind(&self.args.key)
        .bind(&self.args.holder)
        .bind(self.fence)
        .bind(kind)
        .bind(&self.args.key)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(true)
    }

    /// The check-in on `conn` (a transaction's): whether the lease is held;
    /// with `held`, then `INTXN` and the wait for `commit`.
    async fn checked_in<C: leasehold::CheckIn>(
        &self,
        conn: &mut C,
        held: Option<&Notify>,
    ) -> Result<bool, String> {
        let checked = if breaks::on("skip-check-in") {
            Ok(())
        } else {
            self.holding.check_in(conn).await
        };
        let outcome = match checked {
            Ok(()) => Ok(true),
            Err(leasehold::Error::NotHeld { .. }) => Ok(false),
            Err(e) => Err(e.to_string()),
        };
        if let Some(commit) = held {
            say(match outcome {
                Ok(true) => "INTXN ok",
                Ok(false) => "INTXN refused",
                Err(_) => "INTXN err",
            });
            if outcome == Ok(true) {
                let _ = tokio::time::timeout(Duration::from_secs(10), commit.notified()).await;
            }
        }
        outcome
    }
}
