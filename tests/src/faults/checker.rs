//! The checker: a fenced resource and an interval log in PostgreSQL tables
//! that the contenders write to and the orchestrator analyses afterwards.
//!
//! Three tables per run, named `{prefix}_resource`, `{prefix}_writes` and
//! `{prefix}_sections` (the prefix is unique per run):
//!
//! - `resource(key, max_fence, fence_holder)`: one row per scenario. A write
//!   with fence `f` by `holder` is accepted iff `f > max_fence`, or
//!   `f = max_fence` and `holder = fence_holder` (the same holder writing
//!   again). It is one atomic `UPDATE ... WHERE`; 0 rows = rejected.
//! - `writes`: every attempted write, accepted or not, appended in the same
//!   statement, with the holder, the fence, whether the client believed its
//!   lease valid before it wrote and whether it still did once the write had
//!   returned (set by a second statement), and the time. Accepted writes of one key get increasing
//!   ids in the order they were applied (each holds the row lock from its
//!   `UPDATE` to its commit, and draws its id in between), so the log can
//!   be re-checked without trusting the `UPDATE`'s condition.
//! - `sections`: one row per critical section: holder, process, fence,
//!   when the acquisition's request was sent and when it returned, the last
//!   instant at which the holder found its lease valid, end, when its token
//!   was cancelled, and what it saw after a pause.
//!
//! Every time is in µs of [`monotonic_us`](crate::monotonic_us), which all
//! the processes of a run share.

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, FromRow, PgPool, Row};

/// Statements on the checker tables of one run.
#[derive(Debug, Clone)]
pub(crate) struct Checker {
    pool: PgPool,
    prefix: String,
}

/// One critical section as recorded by a contender.
#[derive(Debug, Clone)]
pub(crate) struct Section {
    pub(crate) holder: String,
    pub(crate) fence: Option<i64>,
    /// Just before the acquisition's request was sent.
    pub(crate) t_req: i64,
    /// When the acquisition returned.
    pub(crate) t_start: i64,
    /// When its proxy saw the grant's answer leave the server (not in the
    /// log: the orchestrator fills it in).
    pub(crate) t_granted: Option<i64>,
    pub(crate) t_last_valid: Option<i64>,
    pub(crate) t_end: Option<i64>,
    pub(crate) valid_end: Option<bool>,
    pub(crate) t_cancel: Option<i64>,
    pub(crate) wake_t: Option<i64>,
    pub(crate) wake_valid: Option<bool>,
    pub(crate) wake_cancelled_now: Option<bool>,
    pub(crate) wake_cancel_us: Option<i64>,
    pub(crate) wake_write_accepted: Option<bool>,
}

/// One attempted write to the fenced resource.
#[derive(Debug, Clone)]
pub(crate) struct Write {
    pub(crate) holder: String,
    pub(crate) fence: i64,
    /// The lease was still valid once the write had returned (so all along
    /// it was applied); `None` if the writer did not get to record it.
    pub(crate) valid_after: Option<bool>,
    pub(crate) accepted: bool,
    /// When the writer sent it.
    pub(crate) t_client: i64,
}

impl FromRow<'_, PgRow> for Section {
    fn from_row(row: &PgRow) -> Result<Self> {
        Ok(Self {
            holder: row.try_get("holder")?,
            fence: row.try_get("fence")?,
            t_req: row.try_get("t_req")?,
            t_start: row.try_get("t_start")?,
            t_granted: None,
            t_last_valid: row.try_get("t_last_valid")?,
            t_end: row.try_get("t_end")?,
            valid_end: row.try_get("valid_end")?,
            t_cancel: row.try_get("t_cancel")?,
            wake_t: row.try_get("wake_t")?,
            wake_valid: row.try_get("wake_valid")?,
            wake_cancelled_now: row.try_get("wake_cancelled_now")?,
            wake_cancel_us: row.try_get("wake_cancel_us")?,
            wake_write_accepted: row.try_get("wake_write_accepted")?,
        })
    }
}

impl FromRow<'_, PgRow> for Write {
    fn from_row(row: &PgRow) -> Result<Self> {
        Ok(Self {
            holder: row.try_get("holder")?,
            fence: row.try_get("fence")?,
            valid_after: row.try_get("valid_after")?,
            accepted: row.try_get("accepted")?,
            t_client: row.try_get("t_client")?,
        })
    }
}

/// What a contender reports at the end of a section.
#[derive(Debug, Clone, Default)]
pub(crate) struct SectionEnd {
    pub(crate) t_last_valid: Option<i64>,
    pub(crate) t_end: i64,
    pub(crate) valid_end: bool,
    pub(crate) t_cancel: Option<i64>,
    pub(crate) wake_t: Option<i64>,
    pub(crate) wake_valid: Option<bool>,
    pub(crate) wake_cancelled_now: Option<bool>,
    pub(crate) wake_cancel_us: Option<i64>,
    pub(crate) wake_write_accepted: Option<bool>,
}

type Result<T> = std::result::Result<T, sqlx::Error>;

impl Checker {
    /// The checker tables named after `prefix` (`[a-z0-9_]+`, made by the orchestrator).
    pub(crate) fn new(pool: PgPool, prefix: &str) -> Self {
        assert!(
            !prefix.is_empty()
                && prefix
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "BUG: checker prefix {prefix:?}"
        );
        Self {
            pool,
            prefix: prefix.to_owned(),
        }
    }

    fn sql(&self, template: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(template.replace("{p}", &self.prefix))
    }

    /// Create the three tables.
    pub(crate) async fn create(&self) -> Result<()> {
        let ddl = "CREATE TABLE {p}_resource (key TEXT PRIMARY KEY, max_fence BIGINT NOT NULL, \
                   fence_holder TEXT NOT NULL);
             CREATE TABLE {p}_writes (id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, holder TEXT NOT NULL, \
                   fence BIGINT NOT NULL, kind TEXT NOT NULL, client_valid BOOLEAN NOT NULL, \
                   accepted BOOLEAN NOT NULL, valid_after BOOLEAN, t_client BIGINT NOT NULL, \
                   t_server TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
             CREATE TABLE {p}_sections (id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, holder TEXT NOT NULL, \
                   pid INT NOT NULL, fence BIGINT, t_req BIGINT NOT NULL, t_start BIGINT NOT NULL, \
                   t_last_valid BIGINT, \
                   t_end BIGINT, valid_end BOOLEAN, t_cancel BIGINT, wake_t BIGINT, wake_valid BOOLEAN, \
                   wake_cancelled_now BOOLEAN, wake_cancel_us BIGINT, wake_write_accepted BOOLEAN)";
        sqlx::raw_sql(self.sql(ddl)).execute(&self.pool).await?;
        Ok(())
    }

    /// Drop the three tables.
    pub(crate) async fn drop_tables(&self) -> Result<()> {
        sqlx::raw_sql(self.sql("DROP TABLE IF EXISTS {p}_resource, {p}_writes, {p}_sections"))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Add the resource `key`, never written.
    pub(crate) async fn add_resource(&self, key: &str) -> Result<()> {
        sqlx::query(
            self.sql("INSERT INTO {p}_resource (key, max_fence, fence_holder) VALUES ($1, 0, '')"),
        )
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Write to the fenced resource `key` with `fence`: whether it was
    /// accepted, and the id of its log entry (for [`valid_after`](Checker::valid_after)).
    /// The attempt is logged either way, in the same statement.
    pub(crate) async fn write(
        &self,
        key: &str,
        holder: &str,
        fence: i64,
        kind: &str,
        client_valid: bool,
        t_client: i64,
    ) -> Result<(bool, i64)> {
        sqlx::query_as(self.sql(
            "WITH u AS (UPDATE {p}_resource SET max_fence = $3, fence_holder = $2 \
                 WHERE key = $1 AND (max_fence < $3 OR (max_fence = $3 AND fence_holder = $2)) \
                 RETURNING 1) \
             INSERT INTO {p}_writes (key, holder, fence, kind, client_valid, accepted, t_client) \
             SELECT $1, $2, $3, $4, $5, EXISTS (SELECT 1 FROM u), $6 RETURNING accepted, id",
        ))
        .bind(key)
        .bind(holder)
        .bind(fence)
        .bind(kind)
        .bind(client_valid)
        .bind(t_client)
        .fetch_one(&self.pool)
        .await
    }

    /// Record whether the writer's lease was still valid once the write `id` had returned.
    pub(crate) async fn valid_after(&self, id: i64, valid: bool) -> Result<()> {
        sqlx::query(self.sql("UPDATE {p}_writes SET valid_after = $2 WHERE id = $1"))
            .bind(id)
            .bind(valid)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Record the start of a critical section; returns its id.
    pub(crate) async fn start_section(
        &self,
        key: &str,
        holder: &str,
        pid: u32,
        fence: Option<i64>,
        (t_req, t_start): (i64, i64),
        valid: bool,
    ) -> Result<i64> {
        sqlx::query_scalar(self.sql(
            "INSERT INTO {p}_sections (key, holder, pid, fence, t_req, t_start, t_last_valid) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        ))
        .bind(key)
        .bind(holder)
        .bind(i32::try_from(pid).unwrap_or(i32::MAX))
        .bind(fence)
        .bind(t_req)
        .bind(t_start)
        .bind(valid.then_some(t_start))
        .fetch_one(&self.pool)
        .await
    }

    /// Record the end of the section `id`.
    pub(crate) async fn end_section(&self, id: i64, end: &SectionEnd) -> Result<()> {
        sqlx::query(self.sql(
            "UPDATE {p}_sections SET t_last_valid = $2, t_end = $3, valid_end = $4, t_cancel = $5, \
             wake_t = $6, wake_valid = $7, wake_cancelled_now = $8, wake_cancel_us = $9, \
             wake_write_accepted = $10 WHERE id = $1",
        ))
        .bind(id)
        .bind(end.t_last_valid)
        .bind(end.t_end)
        .bind(end.valid_end)
        .bind(end.t_cancel)
        .bind(end.wake_t)
        .bind(end.wake_valid)
        .bind(end.wake_cancelled_now)
        .bind(end.wake_cancel_us)
        .bind(end.wake_write_accepted)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every section of `key`, in start order.
    pub(crate) async fn sections(&self, key: &str) -> Result<Vec<Section>> {
        sqlx::query_as(self.sql(
            "SELECT holder, fence, t_req, t_start, t_last_valid, t_end, valid_end, t_cancel, wake_t, \
             wake_valid, wake_cancelled_now, wake_cancel_us, wake_write_accepted \
             FROM {p}_sections WHERE key = $1 ORDER BY t_start, id",
        ))
        .bind(key)
        .fetch_all(&self.pool)
        .await
    }

    /// Every write to `key`, in id order.
    pub(crate) async fn writes(&self, key: &str) -> Result<Vec<Write>> {
        sqlx::query_as(self.sql(
            "SELECT holder, fence, valid_after, accepted, t_client FROM {p}_writes \
             WHERE key = $1 ORDER BY id",
        ))
        .bind(key)
        .fetch_all(&self.pool)
        .await
    }

    /// The resource's `(max_fence, fence_holder)`.
    pub(crate) async fn resource(&self, key: &str) -> Result<(i64, String)> {
        sqlx::query_as(self.sql("SELECT max_fence, fence_holder FROM {p}_resource WHERE key = $1"))
            .bind(key)
            .fetch_one(&self.pool)
            .await
    }
}
