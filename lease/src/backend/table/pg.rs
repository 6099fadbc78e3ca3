//! The PostgreSQL dialect of the table backend: [`PgTable`].

use std::future::Future;
use std::time::Duration;

use sqlx::{AssertSqlSafe, Postgres};

use super::{
    Column, Dialect, Layout, OptionalColumns, Ready, RowChange, Shape, Table, TableAnswer,
    TableRenewal, TableRequest, Templates, change_text, explain, refused, renewed_of, rows_text,
    sealed, shape, step_us, zoneless_in_shared,
};
use crate::backend::push::Push;
use crate::backend::push::pg::{MAX_CHANNEL_LEN, PgSource};
use crate::{Error, LeaseInfo};

/// `migrations/postgres/0001_task_leases.sql` with the columns of
/// `0003_add_last_slot_and_value.sql`: [`PG_ADD_LAST_SLOT`], [`PG_ADD_VALUE`].
const PG_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS task_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    fence BIGINT NOT NULL,
    last_slot BIGINT NULL,
    value TEXT NULL
);
";

const PG_ADD_LAST_SLOT: &str =
    "ALTER TABLE task_leases ADD COLUMN IF NOT EXISTS last_slot BIGINT NULL;\n";
const PG_ADD_VALUE: &str = "ALTER TABLE task_leases ADD COLUMN IF NOT EXISTS value TEXT NULL;\n";

/// `migrations/from-go/postgres/0001_add_fence.sql`.
const PG_ADD_FENCE: &str =
    "ALTER TABLE task_leases ADD COLUMN IF NOT EXISTS fence BIGINT NOT NULL DEFAULT 0;\n";

// `{cutoff}` is the instant before which a lease has ended: `clock_timestamp()`
// (the wall clock when the statement runs; `now()` is frozen at the
// transaction's start), or a step earlier for a coarse column; `{pad}` is
// added to the expiries written. See `layout`.
const PG_SQL: Templates = Templates {
    // Insert a new row, take over an expired (or released) row, or extend
    // our own live row. Only a re-acquire of our own live lease keeps the
    // fence (unless it is 0: a row the Go services inserted). Held by
    // someone else: the WHERE fails and nothing is returned.
    //
    // GREATEST: the SELECT reads the clock before ON CONFLICT waits for the
    // row's lock, so a late attempt of ours (given up while a checked-in
    // transaction held the row) must not cut the lease we acquired since
    // (`a_late_acquisition_of_the_holder_never_moves_its_expiry_earlier`).
    //
    // NOT EXISTS answers "held elsewhere" by a plain read: ON CONFLICT DO
    // UPDATE locks the row before its WHERE, and a row lock costs every
    // refused contender a transaction id and a WAL flush, while the
    // holder's release queues behind them. The locked WHERE still decides.
    acquire: "INSERT INTO {table} AS l (name, holder, expires_at, fence) \
              SELECT $1, $2, clock_timestamp() + $3 * interval '1 millisecond'{pad}, 1 \
              WHERE NOT EXISTS (SELECT 1 FROM {table} \
              WHERE name = $1 AND holder <> $2 AND expires_at > {cutoff}) \
              ON CONFLICT (name) DO UPDATE SET \
              holder = EXCLUDED.holder, \
              expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at), \
              fence = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > {cutoff} \
              AND l.fence > 0 THEN l.fence ELSE l.fence + 1 END{clear_value} \
              WHERE l.expires_at <= {cutoff} OR l.holder = EXCLUDED.holder \
              RETURNING fence",
    // `acquire`, with a slot ($4: the period in ms; $5: retry_failed) and a
    // value ($6). `c` reads the clock once: the slot of the request. `p` is
    // the row as the statement's snapshot saw it: the slot recorded before
    // (for the grant and a refusal) and another holder's time left (for a
    // refusal). The insert's locked WHERE decides, on the row as it is,
    // refusing a slot at or below the recorded one whoever holds the lease;
    // without `retry_failed` the grant records the slot.
    acquire_with: "WITH c AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8 / $4 \
                   AS slot), \
                   p AS (SELECT holder, last_slot::int8, \
                   (extract(epoch FROM expires_at - {cutoff}) * 1000000)::int8 AS left_us \
                   FROM {table} WHERE name = $1), \
                   g AS (INSERT INTO {table} AS l (name, holder, expires_at, fence, last_slot, value) \
                   SELECT $1, $2, clock_timestamp() + $3 * interval '1 millisecond'{pad}, 1, \
                   CASE WHEN $5 THEN NULL ELSE c.slot END, $6 FROM c \
                   WHERE NOT EXISTS (SELECT 1 FROM p \
                   WHERE (p.holder <> $2 AND p.left_us > 0) OR p.last_slot >= c.slot) \
                   ON CONFLICT (name) DO UPDATE SET \
                   holder = EXCLUDED.holder, expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at), \
                   fence = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > {cutoff} \
                   AND l.fence > 0 THEN l.fence ELSE l.fence + 1 END, \
                   last_slot = COALESCE(EXCLUDED.last_slot, l.last_slot), value = EXCLUDED.value \
                   WHERE (l.expires_at <= {cutoff} OR l.holder = EXCLUDED.holder) \
                   AND NOT COALESCE(l.last_slot >= (SELECT slot FROM c), false) \
                   RETURNING fence::int8) \
                   SELECT g.fence, c.slot, p.last_slot, CASE WHEN p.holder <> $2 THEN p.left_us END \
                   FROM c LEFT JOIN p ON true LEFT JOIN g ON true",
    // A released row expires at the epoch, not at "now": it is then expired
    // for every statement, whatever instant that statement takes as its
    // "now". In the same statement, a row released notifies the table's
    // channel (`{channel}`) with the lease name, for the waiters of every
    // process; PostgreSQL delivers it at commit. The rows of the SELECT are
    // the rows expired.
    release: "WITH released AS (UPDATE {table} SET expires_at = TIMESTAMPTZ 'epoch'{clear_value} \
              WHERE name = $1 AND holder = $2 AND fence = $3 AND expires_at > {cutoff} \
              RETURNING name) \
              SELECT pg_notify({channel}, name) FROM released",
    // $4: the slot, recorded (GREATEST ignores a NULL) whoever has the row;
    // the release only if it is still this acquisition's. Each CASE reads
    // the row as it is once locked.
    release_ran: "WITH ran AS (UPDATE {table} SET last_slot = GREATEST(last_slot, $4), \
                  expires_at = CASE WHEN holder = $2 AND fence = $3 AND expires_at > {cutoff} \
                  THEN TIMESTAMPTZ 'epoch' ELSE expires_at END, \
                  value = CASE WHEN holder = $2 AND fence = $3 AND expires_at > {cutoff} \
                  THEN NULL ELSE value END \
                  WHERE name = $1 \
                  RETURNING name, expires_at = TIMESTAMPTZ 'epoch' AND holder = $2 AND fence = $3 \
                  AS released) \
                  SELECT pg_notify({channel}, name) FROM ran WHERE released",
    // Observers (and waiters) wake on the channel.
    publish: "WITH published AS (UPDATE {table} SET value = $4 \
              WHERE name = $1 AND holder = $2 AND fence = $3 AND expires_at > {cutoff} \
              RETURNING name) \
              SELECT pg_notify({channel}, name) FROM published",
    force_release: "WITH evicted AS (UPDATE {table} SET holder = ''{clear_value} \
                    WHERE name = $1 AND holder <> '' AND expires_at > {cutoff} RETURNING name) \
                    SELECT pg_notify({channel}, name) FROM evicted",
    force_release_now: "WITH released AS (UPDATE {table} \
                        SET expires_at = TIMESTAMPTZ 'epoch'{clear_value} \
                        WHERE name = $1 AND expires_at > {cutoff} RETURNING name) \
                        SELECT pg_notify({channel}, name) FROM released",
    // `{cutoff}` read once per row (`clock_timestamp()` changes within a
    // statement); the casts read the Go services' column types too.
    info: "SELECT name::text, holder::text, fence::int8, \
           (extract(epoch FROM expires_at - t_now) * 1000000)::int8, value::text, last_slot::int8 \
           FROM (SELECT name, holder, fence, expires_at, {value} AS value, \
           {last_slot} AS last_slot, {cutoff} AS t_now FROM {table} \
           WHERE name = $1 OFFSET 0) AS l",
    list: "SELECT name::text, holder::text, fence::int8, \
           (extract(epoch FROM expires_at - t_now) * 1000000)::int8, value::text, last_slot::int8 \
           FROM (SELECT name, holder, fence, expires_at, {value} AS value, \
           {last_slot} AS last_slot, {cutoff} AS t_now FROM {table} \
           OFFSET 0) AS l ORDER BY name",
    // The names, ttls and fences as three arrays; the (name, fence) of the
    // rows renewed come back. The expiry never moves earlier, as in
    // `acquire` (`a_late_renewal_never_moves_the_expiry_earlier`).
    renew_many: "UPDATE {table} AS l \
                 SET expires_at = GREATEST(l.expires_at, \
                 clock_timestamp() + b.ttl * interval '1 millisecond'{pad}) \
                 FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS b(name, ttl, fence) \
                 WHERE l.name = b.name AND l.fence = b.fence AND l.holder = $4 \
                 AND l.expires_at > {cutoff} \
                 RETURNING l.name, l.fence",
    // One lease: by its name, a plan that stays right whatever the table
    // holds (see `renew_batch`).
    renew: "UPDATE {table} SET expires_at = GREATEST(expires_at, \
            clock_timestamp() + $2 * interval '1 millisecond'{pad}) \
            WHERE name = $1 AND fence = $3 AND holder = $4 AND expires_at > {cutoff} \
            RETURNING name, fence",
    renewed_many: "",
    list_item: "",
    // A share lock on the row: the acquisitions' and renewals' row locks
    // wait for the transaction to end. Re-checked on the row as it is once
    // locked (READ COMMITTED), with the clock of then.
    check_in: "SELECT current_database()::text FROM {table} \
               WHERE name = $1 AND holder = $2 AND fence = $3 AND expires_at > {cutoff} \
               FOR SHARE",
};

/// The placeholders for `table`, whose `expires_at` values are `step`
/// microseconds apart. PostgreSQL rounds a value to the column's precision,
/// up to half a step early: for a coarser column than microseconds, this
/// crate's expiries are a step less a microsecond later (`{pad}`), and a
/// lease is live until a step after its stored expiry (`{cutoff}`), so that
/// none ends early, whoever wrote it. The channel's name holds no quote.
fn layout(step: u32, table: &str, columns: OptionalColumns) -> Layout {
    let (pad, cutoff) = match step {
        0 | 1 => (String::new(), "clock_timestamp()".to_owned()),
        step => (
            format!(" + interval '{} microseconds'", step - 1),
            format!("(clock_timestamp() - interval '{step} microseconds')"),
        ),
    };
    let channel = format!("'{}'", channel(table));
    let fills = vec![("{pad}", pad), ("{cutoff}", cutoff), ("{channel}", channel)];
    Layout { fills, columns }
}

/// The channel of a [`PgTable`]'s releases: `lease:` and the table name in
/// lower case (as PostgreSQL folds it), or beyond 63 bytes `lease:` and a
/// 64-bit FNV-1a hash of it, in hex.
fn channel(table: &str) -> String {
    let table = table.to_ascii_lowercase();
    let channel = format!("lease:{table}");
    if channel.len() <= MAX_CHANNEL_LEN {
        return channel;
    }
    let hash = table.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("lease:{hash:016x}")
}

/// The columns of the table `$1`, resolved as the statements resolve it:
/// name, type, typmod (`timestamptz(p)`: `p`; -1 by default), a default,
/// NULL allowed, unique on its own (a non-partial, immediate unique index
/// of that column alone, as `ON CONFLICT (name)` needs). No rows: no table.
const PG_COLUMNS: &str = "SELECT a.attname::text, t.typname::text, a.atttypmod, a.atthasdef, \
     NOT a.attnotnull, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid \
     AND i.indisunique AND i.indimmediate AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum \
     AND i.indpred IS NULL AND i.indexprs IS NULL) \
     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
     WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped";

/// The advisory lock that serialises `ensure_schema`: concurrent `CREATE
/// TABLE IF NOT EXISTS` of one table can fail with a unique violation in
/// `pg_type`. Two `int4`s, apart from the `bigint` keys of sqlx's
/// `PgAdvisoryLock` (and so of `PgAdvisory`); `0x6c656173` is `"leas"`.
const SCHEMA_LOCK: (i32, i32) = (0x6c65_6173, 1);

/// Run `create` (a `CREATE TABLE IF NOT EXISTS`) in a transaction holding
/// [`SCHEMA_LOCK`], for every table this crate creates on PostgreSQL.
pub(crate) async fn create_one_at_a_time(
    pool: &sqlx::PgPool,
    create: &str,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
        .bind(SCHEMA_LOCK.0)
        .bind(SCHEMA_LOCK.1)
        .execute(&mut *tx)
        .await?;
    sqlx::query(AssertSqlSafe(create)).execute(&mut *tx).await?;
    tx.commit().await
}

/// Leases stored in a PostgreSQL table, one row per lease name; the server's
/// clock decides expiry, and every acquisition gets a fencing token.
///
/// The table (by default `task_leases`, see [`with_table`](Table::with_table))
/// has the columns
///
/// | column | type | meaning |
/// |---|---|---|
/// | `name` | `TEXT PRIMARY KEY` | the lease name, compared byte for byte |
/// | `holder` | `TEXT NOT NULL` | who holds (or last held) the lease; empty once force-released |
/// | `expires_at` | `TIMESTAMPTZ NOT NULL` | when the lease ends |
/// | `fence` | `BIGINT NOT NULL` | the fencing counter of the name |
/// | `last_slot` | `BIGINT NULL` | the last schedule slot claimed ([`Job::once_per`](crate::Job::once_per)) |
/// | `value` | `TEXT NULL` | what the holder published ([`Election::proclaim`](crate::Election::proclaim)) |
///
/// Create it with [`ensure_schema`](Table::ensure_schema) (which takes the
/// transaction-scoped advisory lock `(1818583411, 1)`, as concurrent
/// `CREATE TABLE IF NOT EXISTS` can fail), or from [`PgTable::SCHEMA`].
///
/// - **Clock.** A lease is live while `expires_at > clock_timestamp()`.
/// - A name containing a NUL byte cannot be stored in `TEXT`: it fails with
///   [`Error::Database`](crate::Error::Database).
/// - **Column types.** `expires_at` may be `timestamptz` of any precision,
///   or `timestamp` in a table not shared with the Go services (see
///   [`Table`]; they write it in their session's TimeZone, so a shared one
///   is refused with [`Error::Schema`](crate::Error::Schema)). With fewer
///   than 6 fractional digits, a takeover after a crash may wait up to a
///   step longer: rounding never ends a lease early.
/// - **Waiting: releases are pushed.** A release (and a forced one, and a
///   published value) notifies the channel `lease:` and the table name as
///   given to [`with_table`](Table::with_table), in lower case
///   (`lease:task_leases`). So replicas must spell the table alike
///   (`public.task_leases` is another channel). One pool connection
///   listens while waiters wait, and 10 s after; a waiter acquires about
///   one round trip after the release. Waiters also poll
///   ([`Lease::acquire`](crate::Lease::acquire)), for an expiry, a release
///   by the Go services, a pooler in transaction mode, a listener that is
///   down.
///
/// For what every table backend does, see [`Table`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold::{Acquisition, Backend, backend::PgTable};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), leasehold::Error> {
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let table = PgTable::new(pool);
/// table.ensure_schema().await?;
///
/// let grant = table.acquire("nightly-report", "pod-a", Duration::from_secs(90)).await?;
/// let fence = grant.and_then(|g| g.fencing_token);
/// assert!(fence >= Some(1));
/// assert!(table.acquire("nightly-report", "pod-b", Duration::from_secs(90)).await?.is_none());
/// table.release(Acquisition::new("nightly-report", "pod-a", fence)).await?;
/// # Ok(()) }
/// ```
pub type PgTable = Table<PgDialect>;

/// The PostgreSQL [`Dialect`] of [`PgTable`].
#[derive(Debug, Clone, Copy)]
pub enum PgDialect {}

impl Dialect for PgDialect {}

// Sealed: the calls use the crate's own types.
#[allow(private_interfaces)]
impl sealed::SqlDialect for PgDialect {
    type Database = Postgres;
    const NAME: &'static str = "PgTable";
    const SCHEMA: &'static str = PG_SCHEMA;
    const ADD_FENCE: &'static str = PG_ADD_FENCE;
    const ADD_LAST_SLOT: &'static str = PG_ADD_LAST_SLOT;
    const ADD_VALUE: &'static str = PG_ADD_VALUE;
    const TEMPLATES: Templates = PG_SQL;

    async fn inspect(t: &Table<Self>) -> Result<Layout, Error> {
        type PgColumnRow = (String, String, i32, bool, bool, bool);
        let query = sqlx::query_as(PG_COLUMNS).bind(&*t.table);
        let rows: Vec<PgColumnRow> = explain(&t.pool, query.fetch_all(&t.pool).await).await?;
        let columns: Vec<Column> = rows
            .into_iter()
            .map(|(name, kind, typmod, has_default, nullable, unique)| {
                let precision = u32::try_from(typmod).ok();
                Column {
                    name,
                    kind,
                    precision,
                    has_default,
                    nullable,
                    unique,
                }
            })
            .collect();
        let integers = ["int8", "int4", "int2"];
        let shape = shape(&t.table, &columns, &integers, &t.add_fence, &t.create)?;
        check_expires_at(&t.table, &shape)?;
        let step = step_us(shape.expires_at.precision);
        Ok(layout(step, &t.table, shape.columns))
    }

    async fn create(t: &Table<Self>) -> Result<(), sqlx::Error> {
        create_one_at_a_time(&t.pool, &t.create).await
    }

    async fn acquire(
        t: &Ready<'_, Self>,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(AssertSqlSafe(t.sql.acquire.clone()))
            .bind(name)
            .bind(holder)
            .bind(ttl_ms)
            .fetch_optional(t.pool)
            .await
    }

    async fn acquire_with(
        t: &Ready<'_, Self>,
        c: &TableRequest<'_>,
    ) -> Result<TableAnswer, sqlx::Error> {
        let (fence, slot, last_slot, others_left_us) =
            sqlx::query_as(AssertSqlSafe(t.sql.acquire_with.clone()))
                .bind(c.name)
                .bind(c.holder)
                .bind(c.ttl_ms)
                .bind(c.period_ms)
                .bind(c.retry_failed)
                .bind(c.value)
                .fetch_one(t.pool)
                .await?;
        Ok(TableAnswer {
            fence,
            slot,
            last_slot,
            others_left_us,
        })
    }

    async fn renew_batch(
        t: &Ready<'_, Self>,
        holder: &str,
        leases: &[TableRenewal<'_>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        if let [one] = leases {
            let renewed: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(t.sql.renew.clone()))
                .bind(one.name)
                .bind(one.ttl_ms)
                .bind(one.fence)
                .bind(holder)
                .fetch_all(t.pool)
                .await?;
            return Ok(renewed_of(leases, &renewed));
        }
        let names: Vec<&str> = leases.iter().map(|l| l.name).collect();
        let ttls: Vec<i64> = leases.iter().map(|l| l.ttl_ms).collect();
        let fences: Vec<Option<i64>> = leases.iter().map(|l| l.fence).collect();
        // Unnamed, so planned for the table as it is now (one more round
        // trip). A prepared one gets a generic plan after five runs, made
        // while the table was small, which reads every row once per lease
        // (`pg_renewals_keep_up_when_the_table_grows`).
        let renewed: Vec<(String, i64)> =
            sqlx::query_as(AssertSqlSafe(t.sql.renew_many[0].clone()))
                .bind(&names)
                .bind(&ttls)
                .bind(&fences)
                .bind(holder)
                .persistent(false)
                .fetch_all(t.pool)
                .await?;
        Ok(renewed_of(leases, &renewed))
    }

    async fn change(
        t: &Ready<'_, Self>,
        name: &str,
        change: RowChange<'_>,
    ) -> Result<bool, sqlx::Error> {
        change_text(
            t,
            name,
            change,
            sqlx::postgres::PgQueryResult::rows_affected,
        )
        .await
    }

    async fn rows(t: &Ready<'_, Self>, name: Option<&str>) -> Result<Vec<LeaseInfo>, sqlx::Error> {
        rows_text(t, name).await
    }

    /// The database named in the pool's options, else the user's (the
    /// server's default).
    fn database(t: &Table<Self>) -> Option<String> {
        let options = t.pool.connect_options();
        let database = options.get_database().unwrap_or(options.get_username());
        Some(database.to_owned())
    }

    fn released(
        t: &Table<Self>,
        name: &str,
        poll: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let source = || PgSource {
            pool: t.pool.clone(),
            channel: channel(&t.table),
        };
        t.push
            .get_or_init(|| Push::new(source()))
            .released(name.to_owned(), poll)
    }
}

impl super::CheckIn for sqlx::PgConnection {}

impl sealed::CheckInConnection for sqlx::PgConnection {
    type Dialect = PgDialect;

    async fn check_in(
        &mut self,
        sql: &str,
        name: &str,
        holder: &str,
        fence: Option<i64>,
    ) -> Result<Option<String>, sqlx::Error> {
        let query = sqlx::query_scalar(AssertSqlSafe(sql));
        let query = query.bind(name).bind(holder).bind(fence);
        query.fetch_optional(self).await
    }
}

/// Whether every user of the table reads `expires_at` alike: `timestamp`
/// without a time zone is refused when services that write it in their
/// own session's TimeZone share the table.
fn check_expires_at(table: &str, shape: &Shape<'_>) -> Result<(), Error> {
    match shape.expires_at.kind.as_str() {
        "timestamptz" => Ok(()),
        // This crate's own sessions all use one TimeZone (sqlx sets UTC),
        // so among them a `timestamp` means the same everywhere.
        "timestamp" if !shape.shared => Ok(()),
        "timestamp" => Err(zoneless_in_shared(
            table,
            "timestamp",
            &format!("ALTER TABLE {table} ALTER COLUMN expires_at TYPE timestamptz"),
        )),
        other => Err(refused(
            table,
            &format!("its column expires_at is {other}; it must be timestamptz"),
            "make it timestamptz",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Statements;
    use super::*;

    /// On `timestamptz` (microseconds) the statements are the plain ones;
    /// on `timestamptz(0)` expiries are padded by a step less a
    /// microsecond, and leases live a step longer.
    #[test]
    fn the_layout_follows_the_precision() {
        let plain = OptionalColumns::default();
        let s = Statements::new(&PG_SQL, "task_leases", &layout(1, "task_leases", plain));
        assert_eq!(
            &*s.release,
            "WITH released AS (UPDATE task_leases SET expires_at = TIMESTAMPTZ 'epoch' \
             WHERE name = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp() \
             RETURNING name) SELECT pg_notify('lease:task_leases', name) FROM released"
        );
        let s = Statements::new(&PG_SQL, "t", &layout(1_000_000, "t", plain));
        assert!(s.renew_many[0].contains(
            "clock_timestamp() + b.ttl * interval '1 millisecond' + interval '999999 microseconds'"
        ));
        let cutoff = "expires_at > (clock_timestamp() - interval '1000000 microseconds')";
        assert!(s.renew_many[0].contains(cutoff) && s.release.contains(cutoff));
        assert!(s.renew.contains(
            "clock_timestamp() + $2 * interval '1 millisecond' + interval '999999 microseconds'"
        ));
        assert!(s.renew.contains(cutoff));
    }

    #[test]
    fn channels_follow_the_table_and_fit() {
        assert_eq!(channel("task_leases"), "lease:task_leases");
        assert_eq!(channel("Jobs.Leases"), "lease:jobs.leases");
        let long = format!("{}.{}", "s".repeat(63), "t".repeat(63));
        assert_eq!(channel(&long).len(), "lease:".len() + 16);
        assert_eq!(channel(&long), channel(&long.to_uppercase()));
        assert_ne!(channel(&long), channel(&format!("{long}x")));
        let longest = "t".repeat(57);
        assert_eq!(channel(&longest), format!("lease:{longest}"));
        assert!(!channel(&format!("{longest}t")).contains('t'));
    }
}
