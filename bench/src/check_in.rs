//! What `LeaseGuard::check_in` costs (issue 33): on a held lease, a user's
//! transaction (`BEGIN`; one `UPDATE` of a row of a user table; `COMMIT`)
//! with and without `guard.check_in(&mut *tx)` first, interleaved; and the
//! server's count of the statements one check sends (`PgTable`,
//! `MySqlTable`: a check on its own, in autocommit, so that each statement
//! is counted — PostgreSQL's counter counts transactions; SQLite has no
//! server to ask: the test `check_in_sends_one_statement` captures the
//! statements instead).

use std::time::{Duration, Instant};

use leasehold::LeaseGuard;

use crate::BoxError;
use crate::measure::{Stats, per_op};
use crate::servers::Counter;
use crate::targets::Target;

/// Longer than the section takes: the holder's renewals (at ttl/3) stay
/// out of the samples. SQLite's checked transactions back to back could
/// starve them (see `LeaseGuard::check_in`).
const TTL: Duration = Duration::from_secs(120);

#[derive(Debug, Default)]
pub(crate) struct CheckInCost {
    /// `BEGIN; UPDATE; COMMIT`.
    pub(crate) plain: Stats,
    /// The same with `check_in` after `BEGIN`.
    pub(crate) checked: Stats,
    /// Server-counted statements of one `check_in` (`None`: SQLite).
    pub(crate) statements: Option<f64>,
}

/// The user's transaction on the lease's own database, checked in first
/// when `guard` is given.
async fn transaction(t: &Target, guard: Option<&LeaseGuard>) -> Result<(), BoxError> {
    macro_rules! run {
        ($pool:expr, $update:expr) => {{
            let mut tx = $pool.begin().await?;
            if let Some(guard) = guard {
                guard.check_in(&mut *tx).await?;
            }
            sqlx::query($update).execute(&mut *tx).await?;
            tx.commit().await?;
        }};
    }
    match t {
        Target::Pg(b) => run!(b.pool(), "UPDATE bench_check_in SET n = n + 1 WHERE id = 1"),
        Target::MySql(b) => run!(b.pool(), "UPDATE bench_check_in SET n = n + 1 WHERE id = 1"),
        Target::Sqlite(b) => run!(b.pool(), "UPDATE bench_check_in SET n = n + 1 WHERE id = 1"),
        _ => return Err(format!("{}: no check_in", t.label()).into()),
    }
    Ok(())
}

/// One `check_in` on its own, on a pooled connection in autocommit: the
/// server counts each of its statements as a transaction (PostgreSQL) or a
/// command (MariaDB).
async fn alone(t: &Target, guard: &LeaseGuard) -> Result<(), BoxError> {
    match t {
        Target::Pg(b) => guard.check_in(&mut *b.pool().acquire().await?).await?,
        Target::MySql(b) => guard.check_in(&mut *b.pool().acquire().await?).await?,
        Target::Sqlite(b) => guard.check_in(&mut *b.pool().acquire().await?).await?,
        _ => return Err(format!("{}: no check_in", t.label()).into()),
    }
    Ok(())
}

/// The user table, with its one row.
async fn user_table(t: &Target) -> Result<(), BoxError> {
    let (create, insert) = match t {
        Target::Pg(_) => (
            "CREATE TABLE IF NOT EXISTS bench_check_in (id INT PRIMARY KEY, n BIGINT NOT NULL) \
             WITH (autovacuum_enabled = false)",
            "INSERT INTO bench_check_in VALUES (1, 0) ON CONFLICT DO NOTHING",
        ),
        Target::MySql(_) => (
            "CREATE TABLE IF NOT EXISTS bench_check_in (id INT PRIMARY KEY, n BIGINT NOT NULL) \
             ENGINE = InnoDB",
            "INSERT IGNORE INTO bench_check_in VALUES (1, 0)",
        ),
        _ => (
            "CREATE TABLE IF NOT EXISTS bench_check_in (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
            "INSERT OR IGNORE INTO bench_check_in VALUES (1, 0)",
        ),
    };
    for sql in [create, insert] {
        match t {
            Target::Pg(b) => {
                sqlx::query(sql).execute(b.pool()).await?;
            }
            Target::MySql(b) => {
                sqlx::query(sql).execute(b.pool()).await?;
            }
            Target::Sqlite(b) => {
                sqlx::query(sql).execute(b.pool()).await?;
            }
            _ => return Err(format!("{}: no check_in", t.label()).into()),
        }
    }
    Ok(())
}

/// `n` plain and `n` checked transactions, one of each per step in an
/// order that alternates; then `counted` checks on their own, counted by
/// the server (three times, the least kept: see `per_op`).
pub(crate) async fn check_in_cost(
    t: &Target,
    counter: &mut Counter,
    n: usize,
    counted: usize,
    run: &str,
) -> Result<CheckInCost, BoxError> {
    user_table(t).await?;
    let lease = t.lease("bench-check-in");
    let name = format!("{run}-check-in");
    let guard = lease
        .try_acquire(&name, TTL)
        .await?
        .ok_or_else(|| BoxError::from(format!("{name} is held elsewhere")))?;
    // Warm up: connections, prepared statements, the backend's schema check.
    for _ in 0..n.min(50) {
        transaction(t, None).await?;
        transaction(t, Some(&guard)).await?;
        alone(t, &guard).await?;
    }
    let (mut plain, mut checked) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for step in 0..n {
        for k in 0..2 {
            let check = (step + k) % 2 == 1;
            let start = Instant::now();
            transaction(t, check.then_some(&guard)).await?;
            if check { &mut checked } else { &mut plain }.push(start.elapsed());
        }
    }
    let statements = if counter.counts() {
        let mut details = Vec::new();
        let guard = &guard;
        Some(
            per_op(counter, &mut details, "check_in", counted, |_, _| {
                alone(t, guard)
            })
            .await?,
        )
    } else {
        None
    };
    if !guard.is_valid() {
        return Err(format!("{name} was lost during the check_in section").into());
    }
    guard.release().await?;
    Ok(CheckInCost {
        plain: Stats::of(&mut plain),
        checked: Stats::of(&mut checked),
        statements,
    })
}

/// The section of the report.
pub(crate) fn report<'a>(
    s: &mut String,
    all: impl Iterator<Item = (&'static str, &'a CheckInCost)>,
) {
    use std::fmt::Write as _;
    let all: Vec<_> = all.collect();
    let Some((_, first)) = all.first() else {
        return;
    };
    let us = |d: Duration| format!("{:.0} µs", d.as_secs_f64() * 1e6);
    let _ = writeln!(s, "\n### What `check_in` costs\n");
    let _ = writeln!(
        s,
        "On a held lease, a user's transaction on the lease's database — `BEGIN`; `UPDATE` of one row of a table of its own; `COMMIT` — plain (the baseline) and with `guard.check_in(&mut *tx)` after `BEGIN`, one of each per step in alternating order, sequentially ({} each). Medians. Statements per check: counted by the server (as for the round trips) for checks on their own in autocommit, where each statement is one transaction (PostgreSQL) or one command (MariaDB); SQLite has no server to ask: one statement by construction, which the test `check_in_sends_one_statement` checks on the statement log of all three. The holder's own renewal waits for a checked transaction's share lock (SQLite: its write transaction): keep checked transactions shorter than the grace.\n",
        first.plain.n
    );
    let _ = writeln!(
        s,
        "| backend | plain transaction | checked transaction | ratio | per check | server statements per check |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for (label, c) in all {
        let (p, k) = (c.plain.median, c.checked.median);
        let _ = writeln!(
            s,
            "| {label} | {} | {} | **{:.2}** | {:+.0} µs | {} |",
            us(p),
            us(k),
            k.as_secs_f64() / p.as_secs_f64(),
            (k.as_secs_f64() - p.as_secs_f64()) * 1e6,
            c.statements
                .map_or("1 (by construction)".to_owned(), |x| format!("{x:.2}")),
        );
    }
}
