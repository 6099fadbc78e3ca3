//! The PostgreSQL dialect of the table backend: [`PgTable`].

use std::future::Future;
use std::time::Duration;

use sqlx::{AssertSqlSafe, Postgres};

use super::{
    Column, DEFAULT_TABLE, Info, Layout, Ready, Renewal, Shape, Table, Templates, explain,
    renewed_of, sealed, shape, step_us,
};
use crate::Error;
use crate::backend::push::Push;
use crate::backend::push::pg::{MAX_CHANNEL_LEN, PgSource};

/// The `CREATE TABLE` of the table `$table`: with `"{table}"` the template
/// of every table, with `"task_leases"` [`PgTable::SCHEMA`]. One text, so
/// the two cannot drift apart.
macro_rules! create_table {
    ($table:literal) => {
        concat!(
            "CREATE TABLE IF NOT EXISTS ",
            $table,
            " (\n    \
             name TEXT PRIMARY KEY,\n    \
             holder TEXT NOT NULL,\n    \
             expires_at TIMESTAMPTZ NOT NULL,\n    \
             fence BIGINT NOT NULL\n)"
        )
    };
}

const TEMPLATES: Templates = Templates {
    create: create_table!("{table}"),
    add_fence: "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS fence BIGINT NOT NULL DEFAULT 0",
    // One statement: insert a new row, or take over an expired (or released)
    // row, or extend our own live row. The fence counts acquisitions; only
    // the idempotent re-acquire of our own live lease keeps it (unless it is
    // 0: a row the Go services inserted, which has no fence yet). When the
    // row is held by someone else the WHERE fails and nothing is returned.
    //
    // The NOT EXISTS is a plain read that answers "held elsewhere" without
    // touching the row: ON CONFLICT DO UPDATE locks the conflicting row
    // before it evaluates its WHERE, and a row lock costs a transaction id,
    // a WAL record and a WAL flush at commit — for every contender that
    // finds the lease held, while the holder's release queues behind them.
    // The locked WHERE below still decides when the read saw a free row.
    //
    // `{pad}` and `{cutoff}` are empty and `clock_timestamp()` for a column
    // of microseconds; for a coarser one see `layout`.
    acquire: "INSERT INTO {table} AS l (name, holder, expires_at, fence) \
              SELECT $1, $2, clock_timestamp() + $3 * interval '1 millisecond'{pad}, 1 \
              WHERE NOT EXISTS (SELECT 1 FROM {table} \
              WHERE name = $1 AND holder <> $2 AND expires_at > {cutoff}) \
              ON CONFLICT (name) DO UPDATE SET \
              holder = EXCLUDED.holder, \
              expires_at = EXCLUDED.expires_at, \
              fence = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > {cutoff} \
              AND l.fence > 0 THEN l.fence ELSE l.fence + 1 END \
              WHERE l.expires_at <= {cutoff} OR l.holder = EXCLUDED.holder \
              RETURNING fence",
    // Renew and release match the acquisition: name, holder and fence.
    renew: "UPDATE {table} \
            SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'{pad} \
            WHERE name = $1 AND holder = $2 AND fence = $4 AND expires_at > {cutoff}",
    // A released row expires at the epoch, not at "now": it is then expired
    // for every statement, whatever instant that statement takes as its
    // "now" (MySQL's is the statement's start, which may precede the
    // release when the statement waited for the release's row lock).
    //
    // In the same statement (one round trip), a row released notifies the
    // table's channel (`{channel}`, see `channel`) with the lease name, for
    // the waiters of every process: PostgreSQL delivers it when the
    // statement commits. A release that matched no row notifies nobody.
    release: "WITH released AS (UPDATE {table} SET expires_at = TIMESTAMPTZ 'epoch' \
              WHERE name = $1 AND holder = $2 AND fence = $3 AND expires_at > {cutoff} \
              RETURNING name) \
              SELECT pg_notify({channel}, name) FROM released",
    // Many renewals in one statement: the names, ttls and fences as three
    // arrays; the (name, fence) of the rows renewed come back.
    renew_many: "UPDATE {table} AS l \
                 SET expires_at = clock_timestamp() + b.ttl * interval '1 millisecond'{pad} \
                 FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS b(name, ttl, fence) \
                 WHERE l.name = b.name AND l.fence = b.fence AND l.holder = $4 \
                 AND l.expires_at > {cutoff} \
                 RETURNING l.name, l.fence",
    renewed_many: "",
    list_item: "",
    // The row of a lease, and the microseconds until another holder may
    // take it (`{cutoff}`, read once: `clock_timestamp()` changes within a
    // statement).
    info: "SELECT holder::text, fence::int8, \
           (extract(epoch FROM expires_at - t_now) * 1000000)::int8 \
           FROM (SELECT holder, fence, expires_at, {cutoff} AS t_now FROM {table} \
           WHERE name = $1 OFFSET 0) AS l",
    // Every row, as `info` reads one.
    list: "SELECT name::text, holder::text, fence::int8, \
           (extract(epoch FROM expires_at - t_now) * 1000000)::int8 \
           FROM (SELECT name, holder, fence, expires_at, {cutoff} AS t_now FROM {table} \
           OFFSET 0) AS l ORDER BY name",
    // An operator's release (`lease release --force`): the live row of the
    // name whoever holds it, expired as `release` expires it and announced
    // the same way; the fence stays.
    force_release: "WITH released AS (UPDATE {table} SET expires_at = TIMESTAMPTZ 'epoch' \
                    WHERE name = $1 AND expires_at > {cutoff} RETURNING name) \
                    SELECT pg_notify({channel}, name) FROM released",
};

/// The channel a [`PgTable`] notifies when it releases a lease, and its
/// waiters listen on: `lease:` and the table name as given to
/// [`with_table`](Table::with_table), in lower case (as PostgreSQL folds
/// it); for a name too long for a channel (63 bytes in all), `lease:` and
/// a 64-bit FNV-1a hash of it, in hex.
pub(crate) fn channel(table: &str) -> String {
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

/// The statements' placeholders for an `expires_at` column whose values are
/// `step` microseconds apart (`timestamptz(p)` keeps `p` fractional digits,
/// 6 by default).
///
/// PostgreSQL rounds a value to the column's precision, so a stored expiry
/// may lie up to half a step before the one its writer computed. For a
/// coarser column than microseconds, this crate therefore writes its own
/// expiries a step less a microsecond later (`{pad}`: rounded, they never
/// end before the ttl), and counts any lease as live until a whole step
/// after its stored expiry (`{cutoff}`: a lease written by someone else at
/// that precision never ends early either). For microseconds both are
/// nothing, and the statements are exactly the plain ones.
///
/// `{channel}` is the notification channel of `table` ([`channel`]), as a
/// string literal: the table name was validated (letters, digits, `_` and
/// one `.`), so it holds no quote.
fn layout(step: u32, table: &str) -> Layout {
    let channel = ("{channel}", format!("'{}'", channel(table)));
    if step <= 1 {
        return Layout(vec![
            ("{pad}", String::new()),
            ("{cutoff}", "clock_timestamp()".to_owned()),
            channel,
        ]);
    }
    Layout(vec![
        ("{pad}", format!(" + interval '{} microseconds'", step - 1)),
        (
            "{cutoff}",
            format!("(clock_timestamp() - interval '{step} microseconds')"),
        ),
        channel,
    ])
}

/// The columns of the table `$1` (resolved like the statements resolve it,
/// through the `search_path` unless schema-qualified): name, type, typmod
/// (`timestamptz(p)`: `p`; -1 for the default), whether it has a default,
/// may be NULL, and is unique on its own (a non-partial, immediate unique
/// index of that column alone — what `ON CONFLICT (name)` needs). No rows:
/// no such table.
const INSPECT: &str = "SELECT a.attname::text, t.typname::text, a.atttypmod, a.atthasdef, \
     NOT a.attnotnull, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid \
     AND i.indisunique AND i.indimmediate AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum \
     AND i.indpred IS NULL AND i.indexprs IS NULL) \
     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
     WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped";

/// The advisory lock that serialises `PgTable::ensure_schema` across
/// connections: concurrent `CREATE TABLE IF NOT EXISTS` of one table can fail
/// on PostgreSQL with a unique violation in `pg_type`.
///
/// It lives in the two-`int4` key space, which PostgreSQL keeps apart from
/// the single-`bigint` key space used by sqlx's `PgAdvisoryLock` (and so by
/// lease names in `PgAdvisory`): the two can never collide. `0x6c656173` is
/// `"leas"` in ASCII.
const SCHEMA_LOCK: (i32, i32) = (0x6c65_6173, 1);

/// Run `create` (a `CREATE TABLE IF NOT EXISTS`) in a transaction holding
/// [`SCHEMA_LOCK`]: every table this crate creates on PostgreSQL (the lease
/// table, `PgAdvisory`'s fence table) is created one at a time.
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
/// | `holder` | `TEXT NOT NULL` | who holds (or last held) the lease |
/// | `expires_at` | `TIMESTAMPTZ NOT NULL` | when the lease ends |
/// | `fence` | `BIGINT NOT NULL` | the fencing counter of the name |
///
/// Create it with [`ensure_schema`](Table::ensure_schema), or with your own
/// migration tool from [`PgTable::SCHEMA`]
/// (`migrations/postgres/0001_task_leases.sql` in the repository).
/// `ensure_schema` runs its `CREATE TABLE IF NOT EXISTS` in a short
/// transaction that first takes a transaction-scoped advisory lock (the key
/// pair `(1818583411, 1)`), because concurrent `CREATE TABLE IF NOT EXISTS`
/// statements can otherwise fail with a unique violation.
///
/// - **Clock.** Expiry is computed by the server with `clock_timestamp()`
///   (the wall clock at the moment the statement runs, not `now()`, which is
///   frozen at the start of the transaction). A lease is live while
///   `expires_at > clock_timestamp()`.
/// - **Statements.** Acquire is a single
///   `INSERT .. SELECT .. WHERE NOT EXISTS (live row of another holder)
///   ON CONFLICT .. DO UPDATE .. WHERE .. RETURNING fence` (the `NOT EXISTS`
///   answers "held elsewhere" without locking the row); renew and release
///   are single `UPDATE`s; a batch of renewals is one
///   `UPDATE .. FROM unnest($1::text[], $2::bigint[], $3::bigint[]) ..
///   RETURNING name, fence` per 1,000 leases.
/// - Names containing a NUL byte cannot be stored in a `TEXT` column and
///   fail with [`Error::Database`](crate::Error::Database).
/// - **Column types.** The first call looks the table up in the catalog
///   (resolved through the `search_path` like the statements), see
///   [`Table`]; `expires_at` may be
///   - `timestamptz`, of any precision: an instant, the same for every
///     session whatever its TimeZone;
///   - `timestamp` (without time zone) only in a table that is not shared
///     with the Go services (its `fence` has no default): this crate's own
///     sessions agree on its meaning (sqlx sets their TimeZone to UTC), but
///     a Go service writes `now() + ttl` into it converted to its own
///     session's TimeZone, which may be another — a lease would then end
///     hours early or late for one side. Refused with
///     [`Error::Schema`](crate::Error::Schema) in a shared table; convert it with
///     `ALTER TABLE task_leases ALTER COLUMN expires_at TYPE timestamptz`
///     in a session whose TimeZone is the Go services'.
///
///   With fewer than 6 fractional digits (`timestamptz(0)`), PostgreSQL
///   rounds what is stored: this crate then writes its expiries a step
///   (less a microsecond) later, so they never end before the ttl, and
///   counts every lease as live until a step after its stored expiry, so
///   that a lease written by anyone else never ends early either. A takeover
///   after a crash then waits up to one step longer.
///
/// - **Waiting: releases are pushed.** The release statement also
///   notifies the table's channel with the lease name, in the same
///   statement (`WITH released AS (UPDATE .. RETURNING name) SELECT
///   pg_notify(..)`: still one round trip; a release that matched no row
///   notifies nobody). The channel is `lease:` and the table name as given
///   to [`with_table`](Table::with_table), in lower case (`lease:task_leases`),
///   or, when that is longer than PostgreSQL's 63 bytes, `lease:` and a
///   64-bit FNV-1a hash of it in hex; so replicas must spell the table the
///   same way (`task_leases` and `public.task_leases` are two channels).
///
///   The first waiter ([`Lease::acquire`](crate::Lease::acquire) with a
///   wait, an [`Election`](crate::Election)) of a backend value starts a
///   listener: `LISTEN` on **one connection of the backend's pool** (sqlx's
///   `PgListener`), shared by every waiter of that value and its clones,
///   which wakes the waiters of the released name about one round trip
///   after the release. A waiter never trusts the notification: it tries to
///   acquire. The listener is re-established after a failure (a killed
///   session, a restart; then every waiter tries once more, since releases
///   in between went unseen), and ends 10 s after the last waiter is gone
///   (the next one starts it again) or with the last clone of the backend.
///   Waiters also poll (every `ttl/10`, at most 1 s, ±20%), so nothing
///   hangs on a notification that never comes: while the listener is
///   down or not yet listening, for a lease that simply expired (a crashed
///   holder: taken about one poll after its expiry), for a release by the
///   Go services (which delete the row, without notifying), behind a
///   transaction-mode pooler (where `LISTEN` does not work), and for a
///   listening connection that died without a word (noticed only when TCP
///   gives up).
/// - **Inspect.** [`Backend::inspect`](crate::Backend::inspect) is one
///   `SELECT` of the row: its holder (the last one, once released or
///   expired), fence, and the time left by the server's clock
///   (`clock_timestamp()`) — for a coarse column, until the lease may be
///   taken (a step after its stored expiry, so up to two or three steps
///   more than the ttl). `Ok(None)` when there is no row.
///
/// Everything else — fencing, release, round trips, the pool — is the same
/// for every table backend: see [`Table`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lease::{Acquisition, Backend, backend::PgTable};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lease::Error> {
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

dialect! {
    /// The PostgreSQL [`Dialect`](super::Dialect) of [`PgTable`].
    PgDialect
}

// Sealed: the calls use the crate's own types.
#[allow(private_interfaces)]
impl sealed::Calls for PgDialect {
    type Database = Postgres;
    const NAME: &'static str = "PgTable";
    const TEMPLATES: Templates = TEMPLATES;
    const SCHEMA: &'static str = concat!(create_table!("task_leases"), ";\n");
    const CONCURRENT_BATCHES: bool = true;

    fn default_layout() -> Layout {
        layout(1, DEFAULT_TABLE)
    }

    /// One query of the catalog; see [`PgTable`] for the rules.
    async fn inspect(t: &Table<Self>) -> Result<Layout, Error> {
        let rows: Vec<(String, String, i32, bool, bool, bool)> = explain(
            &t.pool,
            sqlx::query_as(INSPECT)
                .bind(&*t.table)
                .fetch_all(&t.pool)
                .await,
        )
        .await?;
        let columns: Vec<Column> = rows
            .into_iter()
            .map(
                |(name, kind, typmod, has_default, nullable, unique)| Column {
                    name,
                    kind,
                    precision: u32::try_from(typmod).ok(),
                    has_default,
                    nullable,
                    unique,
                },
            )
            .collect();
        let table = &*t.table;
        let create = format!(
            "create it with ensure_schema(), or with `{}`",
            t.create.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        let shape = shape(
            table,
            &columns,
            &["int8", "int4", "int2"],
            &t.add_fence,
            &create,
        )?;
        check_expires_at(table, &shape)?;
        Ok(layout(step_us(shape.expires_at.precision), table))
    }

    async fn create(t: &Table<Self>) -> Result<(), sqlx::Error> {
        create_one_at_a_time(&t.pool, &t.create).await
    }

    numbered_calls!();

    async fn info(t: Ready<'_, Self>, name: &str) -> Result<Option<Info>, sqlx::Error> {
        let row: Option<(String, i64, Option<i64>)> =
            sqlx::query_as(AssertSqlSafe(t.sql.info.clone()))
                .bind(name)
                .fetch_optional(t.pool)
                .await?;
        Ok(row.map(|(holder, fence, left_us)| Info {
            holder,
            fence,
            left_us,
        }))
    }

    async fn list(t: Ready<'_, Self>) -> Result<Vec<(String, Info)>, sqlx::Error> {
        let rows: Vec<(String, String, i64, Option<i64>)> =
            sqlx::query_as(AssertSqlSafe(t.sql.list.clone()))
                .fetch_all(t.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|(name, holder, fence, left_us)| {
                let info = Info {
                    holder,
                    fence,
                    left_us,
                };
                (name, info)
            })
            .collect())
    }

    async fn force_release(t: Ready<'_, Self>, name: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(AssertSqlSafe(t.sql.force_release.clone()))
            .bind(name)
            .execute(t.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// A notification on the table's channel ([`PgTable`]'s push), or `poll`.
    fn released(
        t: &Table<Self>,
        name: &str,
        poll: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        t.push
            .get_or_init(|| {
                Push::new(PgSource {
                    pool: t.pool.clone(),
                    channel: channel(&t.table),
                })
            })
            .released(name.to_owned(), poll)
    }

    /// The names, ttls and fences as three arrays; the rows renewed come back.
    async fn renew_batch(
        t: Ready<'_, Self>,
        holder: &str,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        let names: Vec<&str> = leases.iter().map(|l| l.name).collect();
        let ttls: Vec<i64> = leases.iter().map(|l| l.ttl_ms).collect();
        let fences: Vec<Option<i64>> = leases.iter().map(|l| l.fence).collect();
        let renewed: Vec<(String, i64)> =
            sqlx::query_as(AssertSqlSafe(t.sql.renew_many[0].clone()))
                .bind(&names)
                .bind(&ttls)
                .bind(&fences)
                .bind(holder)
                .fetch_all(t.pool)
                .await?;
        Ok(renewed_of(leases, &renewed))
    }
}

/// Whether `expires_at`'s type is read the same way by every user of the
/// table: `timestamp` without a time zone is refused when services that
/// write it in their own session's TimeZone share the table.
fn check_expires_at(table: &str, shape: &Shape<'_>) -> Result<(), Error> {
    let refuse = |problem: String, fix: String| Error::Schema {
        table: table.to_owned(),
        problem,
        fix,
    };
    match shape.expires_at.kind.as_str() {
        "timestamptz" => Ok(()),
        // This crate's own sessions all use one TimeZone (sqlx sets
        // UTC), so among them a `timestamp` means the same everywhere.
        "timestamp" if !shape.shared => Ok(()),
        "timestamp" => Err(refuse(
            "its column expires_at is `timestamp` (without time zone), and the table \
                 is shared with services that insert rows without a fence (its column \
                 fence has a default): they write `now() + ttl` into it converted to \
                 their session's TimeZone, which this crate cannot know, so a replica \
                 reading it in another TimeZone sees their leases end hours early or \
                 late, and two replicas run the job at once"
                .to_owned(),
            format!(
                "make it timestamptz, in a session whose TimeZone is the one the Go \
                     services' sessions use (the server's default if they set none), so \
                     that the rows keep their meaning: `ALTER TABLE {table} ALTER COLUMN \
                     expires_at TYPE timestamptz`; or, if no service inserts rows without a \
                     fence, drop the default: `ALTER TABLE {table} ALTER COLUMN fence DROP \
                     DEFAULT`"
            ),
        )),
        other => Err(refuse(
            format!("its column expires_at is {other}; it must be timestamptz"),
            "make it timestamptz".to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Statements;
    use super::*;

    /// On the table `ensure_schema` creates (`timestamptz`), renew and
    /// release are the plain statements: the layout adds nothing.
    #[test]
    fn the_default_layout_adds_nothing() {
        let s = Statements::new(&TEMPLATES, "task_leases", &layout(1, "task_leases"));
        assert_eq!(
            &*s.renew,
            "UPDATE task_leases SET expires_at = clock_timestamp() + $3 * interval '1 millisecond' \
             WHERE name = $1 AND holder = $2 AND fence = $4 AND expires_at > clock_timestamp()"
        );
        assert_eq!(
            &*s.release,
            "WITH released AS (UPDATE task_leases SET expires_at = TIMESTAMPTZ 'epoch' \
             WHERE name = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp() \
             RETURNING name) SELECT pg_notify('lease:task_leases', name) FROM released"
        );
        assert_eq!(
            <PgDialect as sealed::Calls>::default_layout(),
            layout(1, "task_leases")
        );
    }

    /// A `timestamptz(0)` column: expiries padded by a step less a
    /// microsecond, leases live until a step after.
    #[test]
    fn a_coarse_column_pads_and_waits_a_step() {
        let s = Statements::new(&TEMPLATES, "task_leases", &layout(1_000_000, "task_leases"));
        assert_eq!(
            &*s.renew,
            "UPDATE task_leases SET expires_at = clock_timestamp() + $3 * interval '1 millisecond' \
             + interval '999999 microseconds' WHERE name = $1 AND holder = $2 AND fence = $4 \
             AND expires_at > (clock_timestamp() - interval '1000000 microseconds')"
        );
    }

    #[test]
    fn channels_follow_the_table_and_fit() {
        assert_eq!(channel("task_leases"), "lease:task_leases");
        assert_eq!(channel("Jobs.Leases"), "lease:jobs.leases");
        let long = format!("{}.{}", "s".repeat(63), "t".repeat(63));
        let hashed = channel(&long);
        assert_eq!(hashed.len(), "lease:".len() + 16);
        assert_eq!(hashed, channel(&long.to_uppercase()));
        assert_ne!(hashed, channel(&format!("{long}x")));
        assert!(channel(&"t".repeat(57)).len() <= MAX_CHANNEL_LEN);
        assert_eq!(
            channel(&"t".repeat(57)),
            format!("lease:{}", "t".repeat(57))
        );
        assert!(
            channel(&"t".repeat(58)).starts_with("lease:")
                && !channel(&"t".repeat(58)).contains('t')
        );
    }
}
