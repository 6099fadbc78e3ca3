//! `leasehold` beside the Go services it replaces, during a migration: Go
//! replicas and Rust replicas of one job on one lease table, or one Redis.
//!
//! The Go side is played by contenders that speak the seeds' protocols
//! exactly as their docs state them, with the SQL a Go service would
//! plausibly send:
//!
//! - the `Repo` contract of the `lease` package on a table
//!   `task_leases (name, holder, expires_at)`: Acquire inserts, or takes over
//!   an expired row, or re-acquires its own, setting `expires_at = now() +
//!   ttl`; Renew extends iff (name, holder) match, expired or not; Release
//!   *deletes* the row iff (name, holder) match;
//! - the `Redis` locker of the `lock` package: `SET key token NX PX ttl`,
//!   and a Lua delete iff the key still holds the token.
//!
//! The Rust side is `leasehold::Lease` over the backends under test, through a
//! wrapper that can make renewals fail and releases get lost (a stalled or
//! crashed replica), so that leases also change hands at their expiry.
//!
//! A contender records the intervals during which it believed it held the
//! lease: a Go contender from its grant until its deadline (the send time
//! of its last successful acquire or renew, plus ttl, less the margin the
//! Rust engine uses too), its release or the renewal that said it was lost;
//! a Rust contender from its grant until the last instant at which
//! `LeaseGuard::is_valid()` said yes. No two intervals of different
//! contenders may overlap, and every contender must hold the lease at
//! some point.
//!
//! The time column's type decides whether both sides read expiries alike:
//! where they cannot be made to (a zone-less column written by the Go
//! services in a time zone this crate cannot know), the table backend must
//! refuse the table instead ([`leasehold::Error::Schema`]). The Go contenders'
//! sessions use a time zone other than UTC, as on a server whose default
//! is not UTC, and the Rust side's sessions yet another.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_tests::unique;
use leasehold::backend::{MySqlTable, PgTable};
use leasehold::{Acquisition, Backend, Error, Grant, Lease};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Executor, MySqlPool, PgPool};

mod mariadb;
mod pg_advisory;
mod postgres;
mod redis_locker;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The margin the engine keeps before a lease's server-side expiry
/// (`ttl/100 + 2 ms`); the Go contenders keep the same.
fn margin(ttl: Duration) -> Duration {
    ttl / 100 + ms(2)
}

/// A table name no other test uses.
fn table_name(prefix: &str) -> String {
    unique(prefix).replace('-', "_")
}

/// A small random number generator (xorshift), seeded from the OS.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        Self(RandomState::new().hash_one(std::process::id()) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }

    fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = (high - low).as_micros() as u64;
        low + Duration::from_micros(self.below(span))
    }
}

// ------------------------------------------------------------ the Go side

/// The Go services' lease table, `(name, holder, expires_at)`, on one of
/// the two servers.
#[derive(Clone)]
enum GoRepo {
    Pg { pool: PgPool, table: String },
    MySql { pool: MySqlPool, table: String },
}

impl GoRepo {
    /// Acquire: insert, or take over an expired row, or re-acquire our own.
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, sqlx::Error> {
        match self {
            // One upsert; `now()` is the transaction's start.
            Self::Pg { pool, table } => {
                let sql = format!(
                    "INSERT INTO {table} (name, holder, expires_at) \
                     VALUES ($1, $2, now() + $3 * interval '1 millisecond') \
                     ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, \
                     expires_at = EXCLUDED.expires_at \
                     WHERE {table}.expires_at < now() OR {table}.holder = EXCLUDED.holder"
                );
                let done = sqlx::query(AssertSqlSafe(sql))
                    .bind(name)
                    .bind(holder)
                    .bind(ttl.as_millis() as i64)
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected() == 1)
            }
            // Take over (or re-acquire) the row, else insert it; `NOW()` has
            // whole seconds, the ttl is whole seconds too.
            Self::MySql { pool, table } => {
                let secs = ttl.as_secs() as i64;
                let sql = format!(
                    "UPDATE {table} SET holder = ?, expires_at = NOW() + INTERVAL ? SECOND \
                     WHERE name = ? AND (expires_at < NOW() OR holder = ?)"
                );
                let done = sqlx::query(AssertSqlSafe(sql))
                    .bind(holder)
                    .bind(secs)
                    .bind(name)
                    .bind(holder)
                    .execute(pool)
                    .await?;
                // Rows matched (sqlx sets CLIENT_FOUND_ROWS).
                if done.rows_affected() == 1 {
                    return Ok(true);
                }
                let sql = format!(
                    "INSERT IGNORE INTO {table} (name, holder, expires_at) \
                     VALUES (?, ?, NOW() + INTERVAL ? SECOND)"
                );
                let done = sqlx::query(AssertSqlSafe(sql))
                    .bind(name)
                    .bind(holder)
                    .bind(secs)
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected() == 1)
            }
        }
    }

    /// Renew: extend iff (name, holder) match — expired or not.
    async fn renew(&self, name: &str, holder: &str, ttl: Duration) -> Result<bool, sqlx::Error> {
        match self {
            Self::Pg { pool, table } => {
                let sql = format!(
                    "UPDATE {table} SET expires_at = now() + $3 * interval '1 millisecond' \
                     WHERE name = $1 AND holder = $2"
                );
                let done = sqlx::query(AssertSqlSafe(sql))
                    .bind(name)
                    .bind(holder)
                    .bind(ttl.as_millis() as i64)
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected() == 1)
            }
            Self::MySql { pool, table } => {
                let sql = format!(
                    "UPDATE {table} SET expires_at = NOW() + INTERVAL ? SECOND \
                     WHERE name = ? AND holder = ?"
                );
                let done = sqlx::query(AssertSqlSafe(sql))
                    .bind(ttl.as_secs() as i64)
                    .bind(name)
                    .bind(holder)
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected() == 1)
            }
        }
    }

    /// Release: delete the row iff (name, holder) match.
    async fn release(&self, name: &str, holder: &str) -> Result<(), sqlx::Error> {
        match self {
            Self::Pg { pool, table } => {
                let sql = format!("DELETE FROM {table} WHERE name = $1 AND holder = $2");
                sqlx::query(AssertSqlSafe(sql))
                    .bind(name)
                    .bind(holder)
                    .execute(pool)
                    .await?;
            }
            Self::MySql { pool, table } => {
                let sql = format!("DELETE FROM {table} WHERE name = ? AND holder = ?");
                sqlx::query(AssertSqlSafe(sql))
                    .bind(name)
                    .bind(holder)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }
}

/// The Go `lock` package's `Redis` locker: `SET key token NX PX ttl`, and
/// a Lua delete iff the key still holds the token. No renewal, no fence.
#[derive(Clone)]
struct GoLocker {
    pool: deadpool_redis::Pool,
    prefix: String,
}

/// The Go locker's release script.
const GO_UNLOCK: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

impl GoLocker {
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// TryLock: the token if it got the lock.
    async fn try_lock(&self, name: &str, ttl: Duration) -> Result<Option<String>, String> {
        let mut conn = self.pool.get().await.map_err(|e| e.to_string())?;
        let token = format!("{:016x}", RandomState::new().hash_one(name));
        let set: Option<String> = redis::cmd("SET")
            .arg(self.key(name))
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(set.map(|_| token))
    }

    /// Release: delete iff the key still holds `token`.
    async fn unlock(&self, name: &str, token: &str) -> Result<(), String> {
        let mut conn = self.pool.get().await.map_err(|e| e.to_string())?;
        redis::cmd("EVAL")
            .arg(GO_UNLOCK)
            .arg(1)
            .arg(self.key(name))
            .arg(token)
            .query_async::<i64>(&mut *conn)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// The Go side of a fleet.
#[derive(Clone)]
enum GoSide {
    Table(GoRepo),
    Locker(GoLocker),
}

// ---------------------------------------------------------- the Rust side

/// A backend whose renewals fail and whose releases are lost while
/// `stalled` is set: a replica that stalls, or crashes, while it holds.
#[derive(Clone)]
struct Flaky<B> {
    inner: B,
    stalled: Arc<AtomicBool>,
}

impl<B: Backend + Clone> Flaky<B> {
    fn new(inner: B) -> Self {
        Self {
            inner,
            stalled: Arc::default(),
        }
    }

    fn stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }
}

impl<B: Backend + Clone> Backend for Flaky<B> {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        self.inner.acquire(name, holder, ttl).await
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        if self.stalled() {
            return Err(Error::backend("stalled"));
        }
        self.inner.renew(lease, ttl).await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        if self.stalled() {
            return Ok(());
        }
        self.inner.release(lease).await
    }

    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        if self.stalled() {
            return Err(Error::backend("stalled"));
        }
        self.inner.renew_many(leases).await
    }
}

// ------------------------------------------------------------ the fleet

/// When a contender believed it held the lease.
#[derive(Debug, Clone)]
struct Held {
    who: String,
    from: Instant,
    to: Instant,
}

/// What a run of the fleet saw.
#[derive(Debug)]
struct Record {
    held: Vec<Held>,
    /// Errors per contender (acquisitions that failed are skipped ticks).
    errors: BTreeMap<String, usize>,
    /// The contenders, and how many of them held the lease at least once.
    contenders: usize,
    /// Keep trying until then, and after that until every contender held
    /// the lease once (no longer than `give_up`).
    stop: Instant,
    give_up: Instant,
}

type Shared = Arc<Mutex<Record>>;

fn lock(record: &Shared) -> std::sync::MutexGuard<'_, Record> {
    record.lock().unwrap_or_else(|e| e.into_inner())
}

fn hold(record: &Shared, who: &str, from: Instant, to: Instant) {
    if to > from {
        let mut r = lock(record);
        r.held.push(Held {
            who: who.to_owned(),
            from,
            to,
        });
    }
}

fn error(record: &Shared, who: &str) {
    *lock(record).errors.entry(who.to_owned()).or_default() += 1;
}

/// Whether the contenders should keep going.
fn going(record: &Shared) -> bool {
    let r = lock(record);
    let now = Instant::now();
    if now >= r.give_up {
        return false;
    }
    if now < r.stop {
        return true;
    }
    let mut who: Vec<&str> = r.held.iter().map(|h| h.who.as_str()).collect();
    who.sort_unstable();
    who.dedup();
    who.len() < r.contenders
}

/// How a contender ends one hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Renews while it works, then releases.
    Release,
    /// Stops renewing for a while (a pause), then carries on if it can.
    Stall,
    /// Stops renewing and never releases: its lease ends at its expiry.
    Crash,
}

fn ending(rng: &mut Rng) -> Ending {
    match rng.below(10) {
        0..=5 => Ending::Release,
        6 | 7 => Ending::Stall,
        _ => Ending::Crash,
    }
}

/// The timing of a fleet.
#[derive(Debug, Clone, Copy)]
struct Timing {
    /// The Go contenders' ttl.
    go_ttl: Duration,
    /// The Rust contenders' ttl.
    rust_ttl: Duration,
    /// How long contenders keep trying.
    run_for: Duration,
    /// The longest a contender works while holding.
    max_work: Duration,
}

/// A Go contender: the seed's `WithLease` over the `Repo` contract, with a
/// local deadline, until `stop`.
async fn go_contender(repo: GoRepo, name: String, who: String, t: Timing, record: Shared) {
    let mut rng = Rng::new();
    let ttl = t.go_ttl;
    while going(&record) {
        tokio::time::sleep(rng.between(ms(2), ms(25))).await;
        let sent = Instant::now();
        match repo.acquire(&name, &who, ttl).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(_) => {
                error(&record, &who);
                continue;
            }
        }
        let from = Instant::now();
        let mut deadline = sent + ttl - margin(ttl);
        let ending = ending(&mut rng);
        let work_until = from + rng.between(ms(10), t.max_work);
        let stall = (ending == Ending::Stall).then(|| {
            let at = from + rng.between(Duration::ZERO, t.max_work);
            (at, at + rng.between(ttl / 2, ttl * 2))
        });
        let mut next_renewal = from + ttl / 3;
        // The last instant it believed it held the lease.
        let mut to = from;
        loop {
            let now = Instant::now();
            if now < deadline {
                to = now;
            }
            if now >= work_until || (ending == Ending::Crash && now >= deadline) {
                break;
            }
            let stalled = stall.is_some_and(|(from, until)| now >= from && now < until);
            if now >= next_renewal && !stalled && ending != Ending::Crash {
                let sent = Instant::now();
                match repo.renew(&name, &who, ttl).await {
                    Ok(true) => deadline = sent + ttl - margin(ttl),
                    // Lost: another holder took it after its expiry.
                    Ok(false) => break,
                    Err(_) => error(&record, &who),
                }
                next_renewal = Instant::now() + ttl / 3;
            }
            tokio::time::sleep(ms(1)).await;
        }
        let released = Instant::now();
        hold(&record, &who, from, to.min(released).min(deadline));
        if ending != Ending::Crash {
            let _ = repo.release(&name, &who).await;
        }
        // Let the others have a go.
        tokio::time::sleep(rng.between(ms(20), ms(120))).await;
    }
}

/// A Go contender of the `lock` package: TryLock, work (the lock is not
/// renewed: it is valid until the send time + ttl − margin), Release — or
/// crash, or overrun the ttl and release late (the token check makes that
/// harmless).
async fn go_locker_contender(
    locker: GoLocker,
    name: String,
    who: String,
    t: Timing,
    record: Shared,
) {
    let mut rng = Rng::new();
    let ttl = t.go_ttl;
    while going(&record) {
        tokio::time::sleep(rng.between(ms(2), ms(25))).await;
        let sent = Instant::now();
        let token = match locker.try_lock(&name, ttl).await {
            Ok(Some(token)) => token,
            Ok(None) => continue,
            Err(_) => {
                error(&record, &who);
                continue;
            }
        };
        let from = Instant::now();
        let deadline = sent + ttl - margin(ttl);
        let ending = ending(&mut rng);
        let work = match ending {
            Ending::Release => rng.between(ms(10), t.max_work.min(ttl / 2)),
            Ending::Stall | Ending::Crash => rng.between(ttl / 2, ttl * 2),
        };
        tokio::time::sleep(work).await;
        hold(&record, &who, from, (from + work).min(deadline));
        if ending != Ending::Crash {
            let _ = locker.unlock(&name, &token).await;
        }
        tokio::time::sleep(rng.between(ms(20), ms(120))).await;
    }
}

/// A Rust contender: `Lease::try_acquire` through [`Flaky`], until `stop`.
async fn rust_contender<B: Backend + Clone>(
    backend: Flaky<B>,
    name: String,
    who: String,
    t: Timing,
    record: Shared,
) {
    let mut rng = Rng::new();
    let ttl = t.rust_ttl;
    let lease = Lease::with_holder(backend.clone(), who.clone());
    while going(&record) {
        tokio::time::sleep(rng.between(ms(2), ms(25))).await;
        let guard = match lease.try_acquire(&name, ttl).await {
            Ok(Some(guard)) => guard,
            Ok(None) => continue,
            Err(_) => {
                error(&record, &who);
                continue;
            }
        };
        let from = Instant::now();
        let ending = ending(&mut rng);
        let work_until = from + rng.between(ms(10), t.max_work);
        let stall = (ending == Ending::Stall).then(|| {
            let at = from + rng.between(Duration::ZERO, t.max_work);
            (at, at + rng.between(ttl / 2, ttl * 2))
        });
        if ending == Ending::Crash {
            backend.stalled.store(true, Ordering::SeqCst);
        }
        let mut to = from;
        loop {
            let now = Instant::now();
            let stalled = stall.is_some_and(|(from, until)| now >= from && now < until);
            if ending == Ending::Stall {
                backend.stalled.store(stalled, Ordering::SeqCst);
            }
            if !guard.is_valid() || now >= work_until {
                break;
            }
            to = now;
            tokio::time::sleep(ms(1)).await;
        }
        hold(&record, &who, from, to);
        // A crashed replica's release is lost; a stalled one's too, if it
        // is still stalled.
        let _ = guard.release().await;
        backend.stalled.store(false, Ordering::SeqCst);
        tokio::time::sleep(rng.between(ms(20), ms(120))).await;
    }
}

/// Runs `go` Go contenders (on `repo`) and `rust` Rust contenders (on
/// `backend`) for one lease name, and checks what they recorded.
async fn fleet<B: Backend + Clone>(go_side: GoSide, backend: B, go: usize, rust: usize, t: Timing) {
    let name = unique("job");
    let start = Instant::now();
    let record = Arc::new(Mutex::new(Record {
        held: Vec::new(),
        errors: BTreeMap::new(),
        contenders: go + rust,
        stop: start + t.run_for,
        give_up: start + 3 * t.run_for,
    }));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..go {
        let (name, who, record) = (name.clone(), format!("go-{i}"), record.clone());
        match go_side.clone() {
            GoSide::Table(repo) => tasks.spawn(go_contender(repo, name, who, t, record)),
            GoSide::Locker(locker) => {
                tasks.spawn(go_locker_contender(locker, name, who, t, record))
            }
        };
    }
    for i in 0..rust {
        tasks.spawn(rust_contender(
            Flaky::new(backend.clone()),
            name.clone(),
            format!("rust-{i}"),
            t,
            record.clone(),
        ));
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a contender panicked");
    }
    let mut record = lock(&record);
    let mut held = std::mem::take(&mut record.held);
    held.sort_by_key(|h| h.from);
    let t0 = held.first().map(|h| h.from).unwrap_or_else(Instant::now);
    let at = |i: Instant| i.duration_since(t0).as_secs_f64() * 1000.0;
    let mut overlaps = Vec::new();
    for (i, a) in held.iter().enumerate() {
        for b in &held[i + 1..] {
            if b.from >= a.to {
                continue;
            }
            if a.who != b.who {
                overlaps.push(format!(
                    "{} held {:.1}..{:.1} ms while {} held {:.1}..{:.1} ms",
                    a.who,
                    at(a.from),
                    at(a.to),
                    b.who,
                    at(b.from),
                    at(b.to)
                ));
            }
        }
    }
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for h in &held {
        *per.entry(&h.who).or_default() += 1;
    }
    // Handovers between the two sides, in each direction.
    let (mut go_to_rust, mut rust_to_go) = (0, 0);
    for pair in held.windows(2) {
        match (pair[0].who.starts_with("go"), pair[1].who.starts_with("go")) {
            (true, false) => go_to_rust += 1,
            (false, true) => rust_to_go += 1,
            _ => {}
        }
    }
    println!(
        "{} holds in {:?} {per:?}, {go_to_rust} handovers Go to Rust, {rust_to_go} Rust to Go, \
         errors {:?}, {} overlaps",
        held.len(),
        start.elapsed(),
        record.errors,
        overlaps.len()
    );
    assert!(
        overlaps.is_empty(),
        "{} overlaps of valid holders, e.g.:\n{}",
        overlaps.len(),
        overlaps[..overlaps.len().min(10)].join("\n")
    );
    assert!(
        go_to_rust > 0 && rust_to_go > 0,
        "the two sides never took turns"
    );
    for who in (0..go)
        .map(|i| format!("go-{i}"))
        .chain((0..rust).map(|i| format!("rust-{i}")))
    {
        assert!(
            per.get(who.as_str()).is_some_and(|&n| n > 0),
            "{who} never held the lease: {per:?}"
        );
    }
}

/// What a mixed fleet on a table must come to: both sides exclude each
/// other, or the table backend refuses the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Runs,
    Refused,
}

/// The Rust side's first use: refused with [`Error::Schema`] naming
/// `expires_at`, or fine.
async fn first_use(backend: &impl Backend) -> Expect {
    match backend.acquire(&unique("probe"), "probe", ms(100)).await {
        Ok(_) => Expect::Runs,
        Err(e @ Error::Schema { .. }) => {
            let message = e.to_string();
            println!("refused: {message}");
            assert!(message.contains("expires_at"), "{message}");
            Expect::Refused
        }
        Err(e) => panic!("first use failed: {}", e.chain()),
    }
}

// ------------------------------------------------- the tables' migration

/// The steps of `*_go_table_needs_the_fence_migration`: `backend` is on
/// the Go services' table `table`, which `migration` completes.
async fn go_table_needs_the_fence_migration<B: Backend>(
    repo: &GoRepo,
    backend: &B,
    migration: &str,
    table: &str,
) {
    let name = unique("job");
    let ttl = Duration::from_secs(30);
    for _ in 0..2 {
        let error = backend
            .acquire(&name, "rust", ttl)
            .await
            .expect_err("no fence column");
        let message = error.to_string();
        println!("{message}");
        assert!(matches!(error, Error::Schema { .. }), "{message}");
        assert!(message.contains(table), "{message}");
        assert!(message.contains("no column fence"), "{message}");
        assert!(message.contains(migration), "{message}");
    }
    match repo {
        GoRepo::Pg { pool, .. } => pool
            .execute(AssertSqlSafe(migration.to_owned()))
            .await
            .map(drop),
        GoRepo::MySql { pool, .. } => pool
            .execute(AssertSqlSafe(migration.to_owned()))
            .await
            .map(drop),
    }
    .expect("the fence migration");
    // A row the Go side inserted has the fence 0: held, then taken over at 1.
    assert!(
        repo.acquire(&name, "go", ms(1_000))
            .await
            .expect("go acquires")
    );
    assert_eq!(
        backend.acquire(&name, "rust", ttl).await.expect("acquire"),
        None
    );
    tokio::time::sleep(ms(2_200)).await;
    let grant = backend.acquire(&name, "rust", ttl).await.expect("acquire");
    assert_eq!(grant.and_then(|g| g.fencing_token), Some(1));
    let fence = |g: Option<Grant>| g.and_then(|g| g.fencing_token);
    // Idempotent re-acquire keeps it; the Go side cannot have it meanwhile.
    assert_eq!(
        fence(backend.acquire(&name, "rust", ttl).await.expect("acquire")),
        Some(1)
    );
    assert!(
        !repo
            .acquire(&name, "go", ms(1_000))
            .await
            .expect("go tries")
    );
    assert!(!repo.renew(&name, "go", ms(1_000)).await.expect("go renews"));
    backend
        .release(Acquisition::new(&name, "rust", Some(1)))
        .await
        .expect("release");
    // Released (expired at the epoch): the Go side takes it, keeping the
    // row's fence; the next Rust acquisition counts on from it.
    assert!(
        repo.acquire(&name, "go", ms(1_000))
            .await
            .expect("go acquires")
    );
    repo.release(&name, "go").await.expect("go releases");
    // The Go side deleted the row: the counter starts again.
    assert_eq!(
        fence(
            backend
                .acquire(&name, "rust-b", ttl)
                .await
                .expect("acquire")
        ),
        Some(1)
    );
    // A Go-inserted row whose holder is ours (fence 0) still yields a fence >= 1.
    let other = unique("job");
    assert!(
        repo.acquire(&other, "same", ttl)
            .await
            .expect("go acquires")
    );
    assert_eq!(
        fence(backend.acquire(&other, "same", ttl).await.expect("acquire")),
        Some(1)
    );
    assert_eq!(
        fence(backend.acquire(&other, "same", ttl).await.expect("acquire")),
        Some(1)
    );
}
