//! Benchmarks of `leasehold` against real servers. Run
//!
//! ```text
//! cargo run -p lease-bench --release -- --write docs/PERFORMANCE.md
//! ```
//!
//! It measures, for every server backend (`Etcd` and `Redis` on a Redis
//! Cluster, `RedisCluster`, included) and `SqliteTable`, each figure next
//! to a baseline measured in the same run:
//!
//! 1. round trips per operation, counted by the servers themselves;
//! 2. the overhead of a `with_lease` cycle (and of `#[singleton]`) over the
//!    same statements sent directly on the same pool;
//! 3. 64 contenders on one name and on 64 names;
//! 4. one process holding 1,000 and 10,000 leases: renewal requests per
//!    `ttl/3` window (batched, and the unbatched default as the baseline),
//!    CPU and memory;
//! 5. hand-over: from a `release()` returning to a waiting `acquire`
//!    returning, with the backend's push and polling (the baseline), in
//!    round trips; and the take-over of a crashed holder's lease after its
//!    expiry.
//! 6. the table backends' `LeaseGuard::check_in`: a user's transaction
//!    with a check against the same transaction without (the baseline),
//!    and the statements per check, counted by the servers.
//!
//! Every required number is checked ([`Check`]); the report ends with the
//! table of checks, and the program exits with an error when one is not
//! met. `--quick` runs a small version of everything, with the same checks
//! (the overhead against [`QUICK_OVERHEAD_BOUND`] instead of
//! [`OVERHEAD_TARGET`]), in about a minute.
//!
//! The servers are private ones, started for the run with the tests'
//! launcher ([`lease_tests::servers`]) and stopped at its end: PostgreSQL,
//! MariaDB and Redis (their binaries must be installed), a throw-away
//! SQLite file, and — when their backends are measured — a 3-member etcd
//! cluster and a 3-master Redis Cluster ([`lease_tests::clusters`]; not the
//! clusters of the conformance tests). [`run`] fails with [`Unavailable`]
//! when they cannot be started.

#![allow(clippy::print_stderr)]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use leasehold::backend::{MySqlTable, PgAdvisory, Redis, SqliteTable};

mod check_in;
mod checks;
mod handover;
mod measure;
mod plots;
mod servers;
mod targets;

pub use checks::{
    Check, HANDOVER_RTT_TARGET, OVERHEAD_TARGET, QUICK_HANDOVER_RTT_BOUND, QUICK_OVERHEAD_BOUND,
    REDIS_OVERHEAD_TARGET, Required,
};
pub use plots::{Plot, write as write_plots};

use handover::Handover;
use measure::{Contention, Overhead, RoundTrips, Scale, Stats};
pub use servers::Unavailable;
use servers::{Clusters, Counter, Servers};
use targets::Target;
pub use targets::redis_floor_cycle;

/// The error type of the benchmark.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// About a minute instead of ten: small sizes, fewer samples, and the
    /// quick run's overhead bound ([`QUICK_OVERHEAD_BOUND`]).
    pub quick: bool,
    /// Only these backends (labels as in the tables), if not empty.
    pub only: Vec<String>,
    /// The command line, for the report.
    pub command: String,
    /// Only these sections (`rt`, `overhead`, `contention`, `scale`,
    /// `handover`, `check_in`, `engine`), if not empty.
    pub sections: Vec<String>,
}

/// Everything measured for one backend.
#[derive(Default)]
struct Results {
    label: &'static str,
    round_trips: Option<RoundTrips>,
    overhead: Option<Overhead>,
    contention: Vec<Contention>,
    scale: Vec<Scale>,
    handover: Option<Handover>,
    check_in: Option<check_in::CheckInCost>,
}

/// Which counter a target's requests land in.
#[derive(Clone, Copy)]
enum Which {
    Pg,
    PgAdvisory,
    MySql,
    Redis,
    RedisCluster,
    Etcd,
    None,
}

/// What a run produced.
#[derive(Debug)]
pub struct Report {
    /// The tables, in Markdown.
    pub markdown: String,
    /// Every required property checked against the numbers (round trips
    /// per operation, batching, overhead, contention, scale), met or not.
    pub checks: Vec<Check>,
    /// The plots the tables embed (`--write FILE` writes them beside FILE,
    /// [`write_plots`]).
    pub plots: Vec<Plot>,
}

impl Report {
    /// The checks that are not met, one sentence each; empty when all hold.
    pub fn violations(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.met())
            .map(ToString::to_string)
            .collect()
    }
}

/// Run the benchmark and return the report.
pub async fn run(options: &Options) -> Result<Report, BoxError> {
    let started = Instant::now();
    let date = command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let uname = command_output("uname", &["-srvmo"]);
    let load_before = load_average();

    let servers = Servers::start().await?;
    let (pg_pool, mut pg_counter) = servers::postgres(&servers.postgres).await?;
    // A pool of its own: the `PgTable` runs leave theirs full of connections
    // whose statistics would count in `PgAdvisory`'s readings.
    let (advisory_pool, mut advisory_counter) = servers::postgres(&servers.postgres).await?;
    let pg_table = servers::pg_table(&pg_pool).await?;
    let (my_pool, mut my_counter) = servers::mysql(&servers.mariadb).await?;
    let my_table = MySqlTable::new(my_pool.clone());
    my_table.ensure_schema().await?;
    let (redis_pool, mut redis_counter) = servers::redis(&servers.redis).await?;
    let sqlite_db = lease_tests::TempDb::new("lease-bench");
    let sqlite = SqliteTable::open(sqlite_db.path()).await?;
    let sqlite_version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(sqlite.pool())
        .await?;
    let mut no_counter = Counter::None;
    // `--only PgAdvisory` takes its variants too ("PgAdvisory (fenced)").
    let wanted = |label: &str| {
        options.only.is_empty()
            || options
                .only
                .iter()
                .any(|o| o == label || label.starts_with(&format!("{o} (")))
    };
    let clusters = Clusters::start(wanted("Etcd"), wanted("RedisCluster")).await?;
    let mut etcd_counter = Counter::None;
    let mut cluster_counter = Counter::None;

    let mut targets = vec![
        (Target::Pg(pg_table), Which::Pg),
        (Target::MySql(my_table), Which::MySql),
        (Target::Sqlite(sqlite), Which::None),
        (
            // With its subscription, as the docs recommend: waiters learn of
            // releases by `PUBLISH` (the hand-over section).
            Target::Redis(
                Redis::new(redis_pool.clone())
                    .with_pubsub(redis::Client::open(servers.redis.url())?),
                redis_pool,
            ),
            Which::Redis,
        ),
        (
            Target::PgAdvisory(
                PgAdvisory::new(advisory_pool.clone()),
                advisory_pool.clone(),
            ),
            Which::PgAdvisory,
        ),
        // What the watch and fencing cost: the overhead section only.
        (
            Target::PgAdvisory(
                PgAdvisory::new(advisory_pool.clone()).with_watch(false),
                advisory_pool.clone(),
            ),
            Which::PgAdvisory,
        ),
        (
            Target::PgAdvisory(
                servers::pg_advisory_fenced(&advisory_pool).await?,
                advisory_pool,
            ),
            Which::PgAdvisory,
        ),
    ];
    if let Some(cluster) = &clusters.etcd {
        let (etcd, counter) = servers::etcd(cluster).await?;
        etcd_counter = counter;
        targets.push((Target::Etcd(Box::new(etcd)), Which::Etcd));
    }
    if let Some(cluster) = &clusters.redis {
        let (backend, client, counter) = servers::redis_cluster(cluster).await?;
        cluster_counter = counter;
        targets.push((
            Target::RedisCluster(backend, Box::new(client)),
            Which::RedisCluster,
        ));
    }
    let run_id = format!("run{:x}", std::process::id());
    let q = options.quick;
    let mut all = Vec::new();
    for (target, which) in &targets {
        let label = target.label();
        if !wanted(label) {
            continue;
        }
        let counter = match which {
            Which::Pg => &mut pg_counter,
            Which::PgAdvisory => &mut advisory_counter,
            Which::MySql => &mut my_counter,
            Which::Redis => &mut redis_counter,
            Which::RedisCluster => &mut cluster_counter,
            Which::Etcd => &mut etcd_counter,
            Which::None => &mut no_counter,
        };
        let mut r = Results {
            label,
            ..Results::default()
        };
        // A variant of a backend (`PgAdvisory (fenced)`) runs the round
        // trips and the overhead only: what it costs against its own floor;
        // `PgAdvisory (unwatched)` the scale too: what the watch costs a
        // held lock (CPU per renewal window).
        let variant = label.contains(" (");
        let section = |s: &str| {
            (options.sections.is_empty() || options.sections.iter().any(|x| x == s))
                && (!variant
                    || s == "overhead"
                    || s == "rt"
                    || (s == "scale" && label == "PgAdvisory (unwatched)"))
        };
        if section("rt") {
            eprintln!("== {label}: round trips");
            r.round_trips =
                Some(measure::round_trips(target, counter, if q { 3 } else { 10 }, &run_id).await?);
        }
        if section("overhead") {
            eprintln!("== {label}: overhead");
            // etcd: every write of its cycle (a grant, two transactions, a
            // revoke) waits for a raft commit, each ~ms: fewer cycles.
            let etcd = matches!(target, Target::Etcd(_));
            r.overhead = Some(match (q, etcd) {
                (true, false) => measure::overhead(target, 5, 60).await?,
                (false, false) => measure::overhead(target, 10, 300).await?,
                (true, true) => measure::overhead(target, 5, 20).await?,
                (false, true) => measure::overhead(target, 10, 60).await?,
            });
        }
        for one_name in [true, false] {
            if !section("contention") {
                break;
            }
            eprintln!("== {label}: contention (one name: {one_name})");
            let d = Duration::from_millis(if q { 300 } else { 3000 });
            r.contention
                .push(measure::contention(target, counter, 64, one_name, d, &run_id).await?);
        }
        let ttl = Duration::from_millis(if q { 6_000 } else { 30_000 });
        let mut runs: Vec<(usize, bool)> = match (target, q) {
            _ if !section("scale") => vec![],
            // One connection per held lock: as many as the pool allows.
            (Target::PgAdvisory(..), true) => vec![(8, true)],
            (Target::PgAdvisory(..), false) => vec![(32, true)],
            // No `renew_many` of its own: one renewal per lease, the
            // unbatched baseline is all there is.
            (Target::Etcd(_), true) => vec![(50, false)],
            (Target::Etcd(_), false) => vec![(1_000, false)],
            // Batches split by hash slot: 1,000 leases take ~1,000 slots
            // of 16,384, so 10,000 would show the same.
            (Target::RedisCluster(..), false) => vec![(1_000, true), (1_000, false)],
            (_, true) => vec![(50, true)],
            (_, false) => vec![
                (1_000, true),
                (1_000, false),
                (10_000, true),
                (10_000, false),
            ],
        };
        // One process holds 100,000 leases on `PgTable` and
        // `Redis`. Acquiring them takes longer than a renewal period of the
        // others' ttl: these get a ttl of 2 minutes.
        if !q && section("scale") && matches!(target, Target::Pg(_) | Target::Redis(..)) {
            runs.push((100_000, true));
        }
        for (n, batched) in runs {
            let ttl = if n >= 100_000 {
                Duration::from_secs(120)
            } else {
                ttl
            };
            eprintln!("== {label}: scale ({n} leases, batched: {batched})");
            // PgAdvisory: the heartbeats run on connections that hold locks,
            // whose statistics PostgreSQL flushes only when it likes; only
            // the engine's calls are counted.
            let counter: &mut Counter = if matches!(target, Target::PgAdvisory(..)) {
                &mut Counter::None
            } else {
                &mut *counter
            };
            r.scale
                .push(measure::scale(target, counter, n, batched, ttl, &run_id).await?);
        }
        if section("handover") {
            eprintln!("== {label}: hand-over");
            let samples = if q {
                handover::Samples {
                    push: 15,
                    poll: 8,
                    crash: 2,
                }
            } else {
                handover::Samples {
                    push: 100,
                    poll: 40,
                    crash: 20,
                }
            };
            r.handover = Some(handover::handover(target, &samples, &run_id).await?);
        }
        let table = matches!(target, Target::Pg(_) | Target::MySql(_) | Target::Sqlite(_));
        if table && section("check_in") {
            eprintln!("== {label}: check_in");
            // Quick: about 1.5 s for the three, mostly PostgreSQL's readings.
            let (n, counted) = if q { (30, 5) } else { (2_000, 50) };
            r.check_in = Some(check_in::check_in_cost(target, counter, n, counted, &run_id).await?);
        }
        all.push(r);
    }
    let mut engine = Vec::new();
    if options.sections.is_empty() || options.sections.iter().any(|x| x == "engine") {
        for n in if q { vec![1_000] } else { vec![1_000, 10_000] } {
            eprintln!("== engine only: {n} leases on Memory");
            let (wall, acquire_cpu, release_cpu) = measure::engine_only(n).await?;
            engine.push((n, wall, acquire_cpu, release_cpu));
        }
    }

    let machine = Machine {
        date,
        uname,
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model: cpu_model(),
        load_before,
        load_after: load_average(),
        versions: {
            let mut v = vec![
                servers.postgres.version().await,
                servers.mariadb.version().await,
                servers.redis.version().await,
                format!("SQLite {sqlite_version} (bundled)"),
            ];
            if clusters.etcd.is_some() {
                let etcd = command_output("etcd", &["--version"]);
                v.push(format!(
                    "{} (3 members, heartbeat 50 ms, election 500 ms)",
                    etcd.lines()
                        .next()
                        .unwrap_or("etcd ?")
                        .replace("Version: ", "")
                ));
            }
            if clusters.redis.is_some() {
                v.push("Redis Cluster of 3 masters (the same redis-server)".to_owned());
            }
            v
        },
        took: started.elapsed(),
    };
    let checks: Vec<Check> = all
        .iter()
        .flat_map(|r| {
            checks::checks(
                &checks::Measured {
                    label: r.label,
                    round_trips: r.round_trips.as_ref(),
                    overhead: r.overhead.as_ref(),
                    contention: &r.contention,
                    scale: &r.scale,
                    handover: r.handover.as_ref(),
                    check_in: r.check_in.as_ref(),
                },
                q,
            )
        })
        .collect();
    Ok(Report {
        markdown: report(options, &machine, &all, &engine, &checks),
        checks,
        plots: plots::plots(&all),
    })
}

struct Machine {
    date: String,
    uname: String,
    cpus: usize,
    cpu_model: String,
    load_before: String,
    load_after: String,
    versions: Vec<String>,
    took: Duration,
}

fn command_output(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "?".to_owned())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "?".to_owned())
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}", a.as_secs_f64() / b.as_secs_f64())
}

fn count(x: f64, counted: bool) -> String {
    if !counted {
        "—".to_owned()
    } else if (x - x.round()).abs() < 0.005 {
        format!("{}", x.round())
    } else {
        format!("{x:.2}")
    }
}

fn report(
    options: &Options,
    m: &Machine,
    all: &[Results],
    engine: &[(usize, f64, f64, f64)],
    checks: &[Check],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Generated by `{}`{}.\n",
        options.command,
        if options.quick {
            " (quick mode: small sizes, fewer samples)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "- date: {}; the run took {:.0} s",
        m.date,
        m.took.as_secs_f64()
    );
    let _ = writeln!(
        s,
        "- machine: `{}`, {} CPUs ({})",
        m.uname, m.cpus, m.cpu_model
    );
    let _ = writeln!(
        s,
        "- load average (1, 5, 15 min): {} before, {} after",
        m.load_before, m.load_after
    );
    let _ = writeln!(s, "- servers: {}", m.versions.join(", "));
    let _ = writeln!(
        s,
        "- pools: {} connections, `test_before_acquire(false)`\n",
        servers::POOL_SIZE
    );

    let _ = writeln!(s, "### Round trips per operation (counted by the server)\n");
    let _ = writeln!(
        s,
        "Steady state: rows exist, statements are prepared. PostgreSQL: `pg_stat_database.xact_commit` of a dedicated database; MariaDB: `USER_STATISTICS` of a dedicated user; Redis: `INFO commandstats` of a private server (every command but `INFO`); Redis Cluster: the same, summed over its 3 masters; etcd: `grpc_server_msg_received_total` (gRPC requests from clients, by method) of the `/metrics` of its 3 members, summed. The floor is the backend's own acquire + release statements sent directly, and must count exactly 2 (`Etcd`: 4 — a `LeaseGrant` and a `Txn` to acquire, a `Txn` and a `LeaseRevoke` to release; so must the backend's: its acquire 2, its release 2, its `with_lease` 4). `renew_many` is one call over the given number of leases: one request (`RedisCluster`: one per hash slot among the leases; `Etcd`, which does not batch: one renewal per lease, 2 requests — a `LeaseKeepAlive` and a linearizable `Range`, see the `Etcd` docs).\n"
    );
    let _ = writeln!(
        s,
        "| backend | floor (acquire + release) | acquire | acquire, new name | renew | release | `with_lease`, empty job | `renew_many` |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for r in all {
        let Some(rt) = &r.round_trips else { continue };
        let c = rt.counted;
        let (acquire, release) = if rt.acquire_with_release {
            (
                format!("{} with release", count(rt.acquire, c)),
                "(with acquire)".to_owned(),
            )
        } else {
            (count(rt.acquire, c), count(rt.release, c))
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} for {} leases |",
            r.label,
            count(rt.floor, c),
            acquire,
            if rt.acquire_new.is_nan() {
                "—".to_owned()
            } else {
                count(rt.acquire_new, c)
            },
            count(rt.renew, c),
            release,
            count(rt.with_lease, c),
            count(rt.renew_many, c),
            rt.batch
        );
    }
    let mut detail = String::new();
    for r in all {
        let Some(rt) = &r.round_trips else { continue };
        for (phase, d, n) in &rt.details {
            if d.by_command.is_empty() || d.total == 0 {
                continue;
            }
            let per: Vec<String> = d
                .by_command
                .iter()
                .map(|(k, v)| format!("{k} {}", count(*v as f64 / *n as f64, true)))
                .collect();
            let _ = writeln!(detail, "| {} | {phase} | {} |", r.label, per.join(", "));
        }
    }
    if !detail.is_empty() {
        let _ = writeln!(
            s,
            "\nBy command, per operation:\n\n| backend | operation | commands |\n|---|---|---|\n{detail}"
        );
    }

    let _ = writeln!(
        s,
        "\n### Overhead of a `with_lease` cycle with an empty job\n"
    );
    let _ = writeln!(
        s,
        "Medians of sequential cycles, sampled in interleaved blocks. Floor: the same acquire and release statements sent directly through sqlx / redis / etcd-client on the same pool or client (`RedisCluster`: a cluster connection of its own to the same nodes). `Etcd` runs fewer cycles (its four writes per cycle each wait for a raft commit). Required: ratio ≤ {}{}; a watched `PgAdvisory` (its listener and `UNLISTEN *` are not in the floor) is held to the quick run's bound, {QUICK_OVERHEAD_BOUND}, only.\n",
        if options.quick {
            QUICK_OVERHEAD_BOUND
        } else {
            OVERHEAD_TARGET
        },
        if options.quick {
            format!(" (the quick run's bound; the full run's target is {OVERHEAD_TARGET})")
        } else {
            format!(
                " (`Redis` ≤ {REDIS_OVERHEAD_TARGET}: its floor is the two scripts on one multiplexed connection)"
            )
        }
    );
    let _ = writeln!(
        s,
        "| backend | floor | `with_lease` | ratio | `#[singleton]` | `#[singleton]` / `with_lease` | samples each |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for r in all {
        let Some(o) = &r.overhead else { continue };
        let _ = writeln!(
            s,
            "| {} | {} | {} | **{}** | {} | {} | {} |",
            r.label,
            us(o.floor.median),
            us(o.with_lease.median),
            ratio(o.with_lease.median, o.floor.median),
            us(o.singleton.median),
            ratio(o.singleton.median, o.with_lease.median),
            o.floor.n
        );
    }
    for r in all {
        if let Some(Overhead {
            sqlx_lock: Some(sq),
            with_lease,
            ..
        }) = &r.overhead
        {
            let _ = writeln!(
                s,
                "\n{}: sqlx's own `PgAdvisoryLock` try-acquire + release on the same pool: {} median; `with_lease` / that = **{}**.",
                r.label,
                us(sq.median),
                ratio(with_lease.median, sq.median)
            );
        }
    }
    if all.iter().any(|r| r.overhead.is_some()) {
        plots::embed(&mut s, plots::OVERHEAD);
    }

    let _ = writeln!(s, "\n### Contention: 64 contenders\n");
    let _ = writeln!(
        s,
        "Each contender is its own `Lease` (holder) looping `try_acquire` then `release` of what it got. Latency is per `try_acquire` call, whatever its answer. Requests per acquisition: everything the server counted (attempts that found the name held, acquisitions, releases) divided by the acquisitions.\n"
    );
    let _ = writeln!(
        s,
        "| backend | names | acquisitions/s | attempts/s | p50 acquire | p99 acquire | server requests per acquisition | errors |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for r in all {
        for c in &r.contention {
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} |",
                r.label,
                c.names,
                c.acquisitions as f64 / c.secs,
                c.attempts as f64 / c.secs,
                us(c.latency.median),
                us(c.latency.p99),
                c.requests_per_acquisition
                    .map_or("—".to_owned(), |x| format!("{x:.2}")),
                c.errors
            );
        }
    }

    let _ = writeln!(s, "\n### Scale: one `Lease` holding many leases\n");
    let _ = writeln!(
        s,
        "One `Lease` acquires the leases (64 at a time) and holds them; we watch one renewal window of ttl/3 (from ttl/3 − 0.5 s to 2·ttl/3 − 0.5 s after the first acquisition), which holds exactly one renewal of every lease. *Batched* is the backend's `renew_many`; *unbatched* is the baseline, one `renew` per lease (what `Backend::renew_many`'s default does for a backend that does not override it). Server requests: counted by the server (SQLite: none to ask). Calls: `renew`/`renew_many` calls the engine made, with the batches (time after the first acquisition: leases). CPU: this process, over the window. Memory: resident set growth while acquiring, per lease. `Etcd` has no batch (its `renew_many` is one renewal per lease, 64 in flight at a time): only its unbatched row is measured. `RedisCluster` sends one script per hash slot among the leases (listed below the table), pipelined on its cluster connection.\n"
    );
    let _ = writeln!(
        s,
        "| backend | leases | ttl | renewals | server requests per window | statements/s | engine calls (leases renewed) | batches in the window | CPU ms per window | RSS per lease | acquiring took |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in all {
        for c in &r.scale {
            let per_window = c.server_requests;
            let batches: Vec<String> = c
                .batches
                .iter()
                .take(6)
                .map(|(at, n)| format!("{:.1} s: {n}", *at as f64 / 1000.0))
                .collect();
            let more = if c.batches.len() > 6 {
                format!(" (+{} more)", c.batches.len() - 6)
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} s | {} | {} | {} | {} ({}) | {}{} | {:.1} | {:.2} KiB | {:.2} s |",
                r.label,
                c.leases,
                c.ttl.as_secs(),
                if c.batched {
                    "**batched**"
                } else {
                    "unbatched"
                },
                per_window.map_or("—".to_owned(), |x| x.to_string()),
                per_window.map_or("—".to_owned(), |x| format!(
                    "{:.1}",
                    x as f64 / (c.ttl.as_secs_f64() / 3.0)
                )),
                c.calls,
                c.renewed,
                batches.join("; "),
                more,
                c.cpu_ms,
                c.rss_kib_per_lease,
                c.acquire_secs
            );
        }
    }
    for r in all {
        for c in r.scale.iter().filter(|c| c.batched) {
            if let Some(slots) = c.slots {
                let _ = writeln!(
                    s,
                    "\n{}: the {} leases' keys are in {slots} hash slots: a batched renewal round is {slots} scripts.",
                    r.label, c.leases
                );
            }
        }
    }
    if all.iter().any(|r| !r.scale.is_empty()) {
        plots::embed(&mut s, plots::SCALE);
    }
    if !engine.is_empty() {
        let _ = writeln!(s, "\n### The engine alone (in-memory backend)\n");
        let _ = writeln!(
            s,
            "One `Lease` on `Memory` acquires the leases, 64 at a time, then releases them: the engine's own cost, without a database.\n"
        );
        let _ = writeln!(
            s,
            "| leases | acquiring: wall | acquiring: CPU | CPU per acquisition | releasing: CPU |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|");
        for (n, wall, acq, rel) in engine {
            let _ = writeln!(
                s,
                "| {n} | {wall:.0} ms | {acq:.0} ms | {:.1} µs | {rel:.0} ms |",
                acq * 1e3 / *n as f64
            );
        }
    }
    handover::report(
        &mut s,
        options.quick,
        all.iter()
            .filter_map(|r| Some((r.label, r.handover.as_ref()?))),
    );
    if all.iter().any(|r| r.handover.is_some()) {
        plots::embed(&mut s, plots::HANDOVER);
    }
    check_in::report(
        &mut s,
        all.iter()
            .filter_map(|r| Some((r.label, r.check_in.as_ref()?))),
    );
    let _ = Stats::default();
    let unmet = checks.iter().filter(|c| !c.met()).count();
    let _ = writeln!(s, "\n### Checks\n");
    let _ = writeln!(
        s,
        "The required numbers, checked by the program against the numbers above; it exits with an error when one is not met. {}\n",
        if unmet == 0 {
            format!("All {} met.", checks.len())
        } else {
            format!("**{unmet} of {} not met.**", checks.len())
        }
    );
    let _ = writeln!(s, "| backend | section | check | required | measured | |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for c in checks {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            c.backend,
            c.section,
            c.what,
            c.required,
            count(c.measured, true),
            if c.met() { "met" } else { "**NOT MET**" }
        );
    }
    s
}

/// Replace the text between `<!-- bench:begin -->` and `<!-- bench:end -->`
/// in `doc` with `generated` (or append both markers and it).
pub fn splice(doc: &str, generated: &str) -> String {
    const BEGIN: &str = "<!-- bench:begin -->";
    const END: &str = "<!-- bench:end -->";
    match (doc.find(BEGIN), doc.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{BEGIN}\n{generated}{}", &doc[..b], &doc[e..]),
        _ => format!("{doc}\n{BEGIN}\n{generated}{END}\n"),
    }
}
