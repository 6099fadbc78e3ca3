//! The floor sends the backends' own statements: each backend's acquire and
//! release, as they reach the server, are compared with the floor's.
//!
//! - SQL (`PgTable`, `MySqlTable`, `SqliteTable`, `PgAdvisory`): sqlx logs
//!   the text of every statement it executes (target `sqlx::query`, field
//!   `db.statement`, or the message itself for a short one). A `tracing`
//!   layer captures the statements logged inside a span of this test (sqlx's
//!   SQLite worker thread enters the caller's span), and the backend's are
//!   compared with the floor's, whitespace normalised.
//! - Lua (`Redis`): on a fresh private server, the backend's acquire and
//!   release load their scripts; the server must then know the floor's two
//!   scripts by their SHA1 (`SCRIPT EXISTS`): byte for byte the same text.
//!
//! An edit of either side alone — the backend's statements in `lease/src`
//! or the floor's copies in `targets.rs` — fails this test.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::Duration;

use leasehold::backend::{MySqlTable, PgAdvisory, PgTable, Redis, SqliteTable};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tracing::Instrument as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

use super::{SCRIPTS, Target};
use crate::servers::{self, Servers};

const TTL: Duration = Duration::from_secs(30);

/// Statements captured so far, by capture.
static CAPTURED: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());

/// The id of the `capture` span a span is, or is inside of.
struct CaptureId(u64);

#[derive(Default)]
struct Fields {
    id: Option<u64>,
    statement: String,
    summary: String,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "capture" {
            self.id = Some(value);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "db.statement" => self.statement = value.to_owned(),
            "summary" => self.summary = value.to_owned(),
            _ => {}
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// Records the statements that sqlx logs inside a `capture` span.
struct Capture;

impl<S> Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(capture), Some(span)) = (fields.id, ctx.span(id)) {
            span.extensions_mut().insert(CaptureId(capture));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let Some(capture) = ctx.event_scope(event).and_then(|scope| {
            scope
                .from_root()
                .find_map(|span| span.extensions().get::<CaptureId>().map(|c| c.0))
        }) else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        // sqlx logs a statement of more than four words in `db.statement`,
        // a shorter one as the summary only.
        let text = if fields.statement.trim().is_empty() {
            fields.summary
        } else {
            fields.statement
        };
        CAPTURED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((capture, normalise(&text)));
    }
}

fn normalise(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Run `f`, and return what it returned with the SQL statements that sqlx
/// executed for it, in order.
async fn capture<F: Future>(f: F) -> (F::Output, Vec<String>) {
    static INSTALL: Once = Once::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(Capture);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test binary");
    });
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let out = f
        .instrument(tracing::info_span!("capture", capture = id))
        .await;
    let mut all = CAPTURED.lock().unwrap_or_else(|e| e.into_inner());
    let mine = all
        .iter()
        .filter(|(c, _)| *c == id)
        .map(|(_, s)| s.clone())
        .collect();
    all.retain(|(c, _)| *c != id);
    (out, mine)
}

/// The statements of the backend's acquire + release, and of the floor's
/// cycle (within 60 s).
async fn both(t: &Target, name: &str) -> (Vec<String>, Vec<String>) {
    tokio::time::timeout(Duration::from_secs(60), both_now(t, name))
        .await
        .unwrap_or_else(|_| panic!("{}: no answer within 60 s", t.label()))
}

async fn both_now(t: &Target, name: &str) -> (Vec<String>, Vec<String>) {
    let holder = "floor-statements";
    // Once first, not captured: connections opened, rows created.
    assert!(t.acquire(name, holder, TTL).await.expect("acquire"));
    t.release(name, holder).await.expect("release");
    t.floor_cycle(&mut None, name, holder, TTL)
        .await
        .expect("floor");
    let (acquired, mut backend) = capture(t.acquire(name, holder, TTL)).await;
    assert!(acquired.expect("acquire"));
    let (released, release) = capture(t.release(name, holder)).await;
    released.expect("release");
    backend.extend(release);
    let (floor_ok, floor) = capture(t.floor_cycle(&mut None, name, holder, TTL)).await;
    assert!(floor_ok.expect("floor"), "the floor did not acquire {name}");
    (backend, floor)
}

/// The private servers, or `None` (the test skips) where they cannot be
/// started and `LEASE_REQUIRE_SERVICES` is not set.
async fn servers() -> Option<Servers> {
    match Servers::start().await {
        Ok(servers) => Some(servers),
        Err(e) if !lease_tests::services_required() => {
            println!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn the_floor_sends_the_backends_own_statements() {
    let Some(servers) = servers().await else {
        return;
    };
    // One connection per pool, opened before anything is captured: a
    // connection opened later would log its set-up statements too.
    let pg_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&servers.postgres.url())
        .await
        .expect("pg");
    let pg_table = PgTable::new(pg_pool.clone());
    pg_table.ensure_schema().await.expect("pg table");
    let my_pool = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&servers.mariadb.url())
        .await
        .expect("mariadb");
    let my_table = MySqlTable::new(my_pool);
    my_table.ensure_schema().await.expect("mariadb table");
    let sqlite_db = lease_tests::TempDb::new("lease-bench-floor");
    let lite_pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(sqlite_db.path())
                .create_if_missing(true),
        )
        .await
        .expect("sqlite");
    let sqlite = SqliteTable::new(lite_pool);
    sqlite.ensure_schema().await.expect("sqlite table");
    let targets = [
        Target::Pg(pg_table),
        Target::MySql(my_table),
        Target::Sqlite(sqlite),
        Target::PgAdvisory(PgAdvisory::new(pg_pool.clone()), pg_pool),
    ];
    let mut differ = HashMap::new();
    for t in &targets {
        let (backend, floor) = both(t, "floor-statements").await;
        println!(
            "{}:\n  backend: {backend:#?}\n  floor:   {floor:#?}",
            t.label()
        );
        assert_eq!(
            backend.len(),
            2,
            "{}: the backend's acquire and release, one statement each: {backend:#?}",
            t.label()
        );
        if backend != floor {
            differ.insert(t.label(), (backend, floor));
        }
    }

    // Redis: a fresh server knows no script until the backend loads its own.
    let (redis_pool, _) = servers::redis(&servers.redis).await.expect("redis");
    let client = redis::Client::open(servers.redis.url()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let floor_shas = [SCRIPTS.0.get_hash(), SCRIPTS.1.get_hash()];
    let exists = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("EXISTS").arg(&floor_shas[..]);
        let mut conn = conn.clone();
        async move {
            cmd.query_async::<Vec<bool>>(&mut conn)
                .await
                .expect("SCRIPT EXISTS")
        }
    };
    assert_eq!(exists(&mut conn).await, [false, false], "a fresh server");
    let t = Target::Redis(Redis::new(redis_pool.clone()), redis_pool);
    assert!(
        t.acquire("floor-statements", "h", TTL)
            .await
            .expect("acquire")
    );
    t.release("floor-statements", "h").await.expect("release");
    let known = exists(&mut conn).await;
    if known != [true, true] {
        differ.insert(
            "Redis",
            (
                vec!["(the backend's acquire and release scripts)".to_owned()],
                vec![format!(
                    "the floor's acquire and release scripts; known to the server: {known:?}"
                )],
            ),
        );
    }
    assert!(
        differ.is_empty(),
        "the floor's statements are not the backend's (update `bench/src/targets.rs`): {differ:#?}"
    );
}

/// `LeaseGuard::check_in` sends one statement, in the caller's transaction,
/// on each table backend: its share lock on the lease row (PostgreSQL,
/// MariaDB), its no-op write of it (SQLite). The benchmark's `check_in`
/// section counts it on the servers too (SQLite has none to ask).
#[tokio::test]
async fn check_in_sends_one_statement() {
    let Some(servers) = servers().await else {
        return;
    };
    let (pg_pool, _) = servers::postgres(&servers.postgres).await.expect("pg");
    let pg_table = servers::pg_table(&pg_pool).await.expect("pg table");
    let (my_pool, _) = servers::mysql(&servers.mariadb).await.expect("mariadb");
    let my_table = MySqlTable::new(my_pool);
    my_table.ensure_schema().await.expect("mariadb table");
    let sqlite_db = lease_tests::TempDb::new("lease-bench-check-in");
    let sqlite = SqliteTable::open(sqlite_db.path()).await.expect("sqlite");
    let targets = [
        (Target::Pg(pg_table), "FOR SHARE"),
        (Target::MySql(my_table), "LOCK IN SHARE MODE"),
        (Target::Sqlite(sqlite), "UPDATE"),
    ];
    for (t, lock) in targets {
        let lease = t.lease("check-in-statements");
        let guard = lease
            .try_acquire("check-in-statements", TTL)
            .await
            .expect("acquire")
            .expect("the lease is free");
        // Once first, not captured: the backend's schema check, the
        // statement prepared.
        macro_rules! captured {
            ($pool:expr) => {{
                let mut tx = $pool.begin().await.expect("begin");
                guard.check_in(&mut *tx).await.expect("check_in");
                let (checked, statements) = capture(guard.check_in(&mut *tx)).await;
                checked.expect("check_in");
                tx.rollback().await.expect("rollback");
                statements
            }};
        }
        let statements = match &t {
            Target::Pg(b) => captured!(b.pool()),
            Target::MySql(b) => captured!(b.pool()),
            Target::Sqlite(b) => captured!(b.pool()),
            _ => unreachable!("a table backend"),
        };
        println!("{}: check_in: {statements:#?}", t.label());
        assert_eq!(
            statements.len(),
            1,
            "{}: check_in sends one statement: {statements:#?}",
            t.label()
        );
        assert!(
            statements[0].contains(lock) && statements[0].contains("task_leases"),
            "{}: check_in's statement: {statements:#?}",
            t.label()
        );
        guard.release().await.expect("release");
    }
}

/// An acquisition with a schedule slot (and a value) is one request on each
/// table backend, granted or refused, as a plain acquisition is:
/// PostgreSQL one statement; MySQL and SQLite one script, which sqlx
/// sends (and logs) as one.
#[tokio::test]
async fn a_slot_acquisition_is_one_request() {
    use leasehold::backend::{Acquired, Acquisition, Backend, OncePer, Request};
    let Some(servers) = servers().await else {
        return;
    };
    let (pg_pool, _) = servers::postgres(&servers.postgres).await.expect("pg");
    let pg_table = servers::pg_table(&pg_pool).await.expect("pg table");
    let (my_pool, _) = servers::mysql(&servers.mariadb).await.expect("mariadb");
    let my_table = MySqlTable::new(my_pool);
    my_table.ensure_schema().await.expect("mariadb table");
    let sqlite_db = lease_tests::TempDb::new("lease-bench-slots");
    let sqlite = SqliteTable::open(sqlite_db.path()).await.expect("sqlite");
    // The statements of one call, without a new connection's set-up
    // (sqlx's `PRAGMA ..` on SQLite, `SET sql_mode= ..` on MySQL) should
    // the pool open one for it.
    async fn requests<F: Future>(f: F) -> (F::Output, Vec<String>) {
        let (out, mut statements) = capture(f).await;
        statements.retain(|s| !s.starts_with("PRAGMA ") && !s.starts_with("SET sql_mode="));
        (out, statements)
    }
    async fn check(b: impl Backend, label: &str) {
        let name = lease_tests::unique("slot-requests");
        let hour = OncePer::new(Duration::from_secs(3600));
        let request = |holder| Request::new(&name, holder, TTL).once_per(hour);
        // Once first, not captured: the backend's schema check.
        let slot = match b.acquire_with(request("a")).await.expect("acquire") {
            Acquired::Granted(grant) => {
                b.release(Acquisition::new(&name, "a", grant.fencing_token))
                    .await
                    .expect("release");
                grant.slot.expect("a slot")
            }
            other => panic!("{label}: {other:?}"),
        };
        let next = Request::new(&name, "b", TTL).once_per(hour).value("addr-b");
        let (answer, statements) = requests(b.acquire_with(next)).await;
        assert!(
            matches!(answer.expect("acquire"), Acquired::AlreadyRan { slot: s } if s == slot),
            "{label}: the slot ran"
        );
        assert_eq!(statements.len(), 1, "{label}: a refusal: {statements:#?}");
        let other = format!("{name}-other");
        let fresh = Request::new(&other, "b", TTL)
            .once_per(hour)
            .value("addr-b");
        let (answer, statements) = requests(b.acquire_with(fresh)).await;
        assert!(
            matches!(answer.expect("acquire"), Acquired::Granted(_)),
            "{label}: a grant"
        );
        assert_eq!(statements.len(), 1, "{label}: a grant: {statements:#?}");
        println!("{label}: one request: {statements:#?}");
    }
    check(pg_table, "PgTable").await;
    check(my_table, "MySqlTable").await;
    check(sqlite, "SqliteTable").await;
}
