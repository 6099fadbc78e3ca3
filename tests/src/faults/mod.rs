//! The fault-injection suite: contenders in separate processes, a nemesis
//! that injects the faults production sees, and a checker that the
//! contenders cannot fool — see `docs/RELIABILITY.md` for what it shows.
//!
//! [`run`] starts private servers ([`crate::servers`]), then, for every
//! backend × fault ([`Fault`]), a *scenario*: `workers` contender processes
//! (the `fault-suite` binary in its `worker` role, [`worker`]) loop
//! acquire → critical section of random length → release on one lease name,
//! each through its own [`FaultProxy`] to the
//! server, while the nemesis injects the fault `injections` times. Every
//! critical section and every write to the fenced resource is recorded in
//! the checker (tables on the shared PostgreSQL, never faulted); the
//! scenario is analysed from those records when its contenders have
//! stopped, into a [`ScenarioResult`].
//!
//! ```no_run
//! # async fn f() -> Result<(), lease_tests::faults::RunError> {
//! use lease_tests::faults::{Config, run};
//!
//! let config = Config::short("target/debug/fault-suite".into());
//! let report = run(&config).await?;
//! println!("{}", report.markdown());
//! assert!(report.failures().is_empty());
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lease::backend::{MySqlTable, PgTable, Redis};
use sqlx::Connection;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::time::Instant;

use crate::proxy::{FaultProxy, Mode};
use crate::servers::{PrivateServer, RedisPersistence, signal};

mod checker;
mod report;
pub mod worker;

use checker::{Checker, Section, Write};
pub use report::{Environment, MARKERS, Report};

/// Microseconds since the Unix epoch, by this host's wall clock.
///
/// Every process of a run is on the same host, so their readings are
/// comparable; a step of the wall clock during a run would show up as
/// nonsense durations (none was seen).
pub fn now_us() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

/// A number in `[0, 1)`, different on every call.
fn fraction() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let bits = RandomState::new().hash_one(now_us()) >> 11;
    // 53 random bits: exact in an f64.
    bits as f64 / (1u64 << 53) as f64
}

fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// `PgTable` on a private PostgreSQL.
    PgTable,
    /// `MySqlTable` on a private MariaDB.
    MySqlTable,
    /// `PgAdvisory` on a private PostgreSQL.
    PgAdvisory,
    /// `Redis` on a private Redis.
    Redis,
}

impl BackendKind {
    /// Every backend, in report order.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::PgTable,
        BackendKind::MySqlTable,
        BackendKind::PgAdvisory,
        BackendKind::Redis,
    ];

    /// The name used on command lines and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::PgTable => "pg-table",
            BackendKind::MySqlTable => "mysql-table",
            BackendKind::PgAdvisory => "pg-advisory",
            BackendKind::Redis => "redis",
        }
    }

    /// The type's name in the `lease` crate.
    pub fn type_name(self) -> &'static str {
        match self {
            BackendKind::PgTable => "PgTable",
            BackendKind::MySqlTable => "MySqlTable (MariaDB)",
            BackendKind::PgAdvisory => "PgAdvisory",
            BackendKind::Redis => "Redis",
        }
    }

    /// Does it hand out fencing tokens?
    pub fn fenced(self) -> bool {
        self != BackendKind::PgAdvisory
    }

    /// The faults that apply to this backend, in report order.
    pub fn faults(self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|f| match f {
                Fault::Steal => self != BackendKind::PgAdvisory,
                Fault::RestartNoPersistence => self == BackendKind::Redis,
                _ => true,
            })
            .collect()
    }
}

impl FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| format!("unknown backend {s:?}"))
    }
}

/// A fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// `SIGKILL` of the current holder (a new contender process replaces it).
    Kill,
    /// `SIGSTOP` of the current holder for 2.5 ttl, then `SIGCONT`.
    Stop,
    /// Kill the holder's server connections (`pg_terminate_backend`,
    /// MariaDB `KILL CONNECTION USER`, Redis `CLIENT KILL ID`).
    ConnKill,
    /// Take the lease away from its holder on the server (expire its row,
    /// delete its Redis key) — what an operator or a buggy peer could do;
    /// the holder must notice at its next renewal.
    Steal,
    /// Every contender's link gets added latency for 3 ttl: ttl/6 each way
    /// (a round trip of ttl/3, the renewal timeout) on even injections,
    /// ttl/12 each way on odd ones.
    Latency,
    /// The holder's link becomes a black hole for 2 ttl, then heals.
    BlackHole,
    /// Every open connection (all contenders) is reset (TCP RST).
    Reset,
    /// The server process crashes and restarts (PostgreSQL immediate
    /// shutdown, MariaDB and Redis `SIGKILL`; Redis with
    /// `appendonly yes`, `appendfsync always`): on even injections it stays
    /// down for 1.5 ttl first (longer than any lease), on odd ones it
    /// restarts at once.
    Restart,
    /// Redis without persistence crashes and restarts, as [`Fault::Restart`]:
    /// every key is lost.
    RestartNoPersistence,
}

impl Fault {
    /// Every fault, in report order.
    pub const ALL: [Fault; 9] = [
        Fault::Kill,
        Fault::Stop,
        Fault::ConnKill,
        Fault::Steal,
        Fault::Latency,
        Fault::BlackHole,
        Fault::Reset,
        Fault::Restart,
        Fault::RestartNoPersistence,
    ];

    /// The name used on command lines and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::ConnKill => "conn-kill",
            Fault::Steal => "steal",
            Fault::Latency => "latency",
            Fault::BlackHole => "black-hole",
            Fault::Reset => "reset",
            Fault::Restart => "restart",
            Fault::RestartNoPersistence => "restart-no-persistence",
        }
    }

    /// Is this fault, on this backend, a *revocation*: the server itself
    /// ends the lease behind a live holder's back, which the holder can only
    /// learn at its next renewal? Two holders then believe they hold for up
    /// to one renewal period, and only fencing protects the resource.
    pub fn revokes(self, backend: BackendKind) -> bool {
        match self {
            Fault::Steal | Fault::RestartNoPersistence => true,
            // The session *is* the lock: when it ends, the lock is free.
            Fault::ConnKill | Fault::Reset | Fault::Restart => backend == BackendKind::PgAdvisory,
            _ => false,
        }
    }
}

impl FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| format!("unknown fault {s:?}"))
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `fault-suite` binary, run as `fault-suite worker ...` for each contender.
    pub worker_exe: PathBuf,
    /// The lease's ttl.
    pub ttl: Duration,
    /// Contender processes per scenario.
    pub workers: usize,
    /// Injections of the fault per scenario.
    pub injections: u32,
    /// Backends to test.
    pub backends: Vec<BackendKind>,
    /// Faults to inject (those that apply to each backend).
    pub faults: Vec<Fault>,
    /// Allowance added to every timing bound (scheduling on a loaded machine).
    pub slack: Duration,
    /// The PostgreSQL that holds the checker tables (default: the shared test server).
    pub checker_url: String,
    /// Keep the checker tables after the run (they are dropped otherwise).
    pub keep_tables: bool,
    /// Print a line per scenario while running.
    pub progress: bool,
    /// The contenders' sqlx pools ping a connection before handing it out
    /// (`test_before_acquire`, sqlx's default): a second round trip per call.
    pub pool_ping: bool,
}

impl Config {
    /// The short run CI does: every backend × fault, injected once.
    pub fn short(worker_exe: PathBuf) -> Self {
        Self {
            worker_exe,
            ttl: Duration::from_millis(1000),
            workers: 3,
            injections: 1,
            backends: BackendKind::ALL.to_vec(),
            faults: Fault::ALL.to_vec(),
            slack: Duration::from_millis(500),
            checker_url: crate::postgres_url(),
            keep_tables: false,
            progress: true,
            pool_ping: true,
        }
    }

    /// The full run documented in `docs/RELIABILITY.md`: ten injections each.
    pub fn full(worker_exe: PathBuf) -> Self {
        Self {
            injections: 10,
            ..Self::short(worker_exe)
        }
    }

    /// Timing bound: takeover after the holder was killed.
    pub fn takeover_bound(&self, backend: BackendKind) -> Duration {
        match backend {
            // The lock ends with the session: one heartbeat at most.
            BackendKind::PgAdvisory => self.ttl / 3 + self.slack,
            _ => self.ttl + self.ttl / 3 + self.slack,
        }
    }

    /// Timing bound: a revoked holder's token is cancelled (its next renewal).
    pub fn cancel_bound(&self) -> Duration {
        self.ttl / 3 + self.slack
    }

    /// Timing bound: a cut-off holder's token is cancelled (its local deadline).
    pub fn deadline_bound(&self) -> Duration {
        self.ttl + self.slack
    }
}

/// Why a run could not be done.
#[derive(Debug)]
pub enum RunError {
    /// A server (private or the checker's) could not be started or reached.
    Unavailable(String),
    /// The run broke down (not a finding about `lease`: see the report for those).
    Failed(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Unavailable(e) => write!(f, "unavailable: {e}"),
            RunError::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

impl std::error::Error for RunError {}

/// One injection of a fault, as the nemesis did it.
#[derive(Debug, Clone)]
struct Event {
    /// When the fault landed (µs since the epoch).
    t: i64,
    /// When it was lifted (SIGCONT, heal, server up again).
    t_lifted: Option<i64>,
    /// The holder the fault was aimed at.
    victim: Option<String>,
    /// How long the server was down (restarts).
    downtime: Option<Duration>,
}

/// What one backend × fault showed.
#[derive(Debug, Clone)]
pub struct ScenarioResult {
    /// The backend.
    pub backend: BackendKind,
    /// The fault.
    pub fault: Fault,
    /// The lease's ttl.
    pub ttl: Duration,
    /// Injections that landed while the victim held the lease.
    pub hits: u32,
    /// Injections that missed (the victim had just released): not counted.
    pub misses: u32,
    /// Critical sections, all of them.
    pub sections: usize,
    /// Critical sections that ran to their end with the lease still valid.
    pub completed: usize,
    /// Pairs of sections of different holders, both valid, that intersect in time.
    pub overlaps: usize,
    /// The longest such intersection.
    pub max_overlap: Duration,
    /// Writes the fenced resource accepted with a fence lower than one it
    /// had accepted before (or equal, from another holder), found by
    /// re-checking the write log.
    pub stale_accepted: usize,
    /// Writes accepted / rejected by the fenced resource.
    pub writes: (usize, usize),
    /// Writes rejected although the writer believed its lease valid.
    pub valid_rejected: usize,
    /// Acquisitions whose fence was not larger than an earlier holder's.
    pub fence_reissues: usize,
    /// Time from each landed injection that cost the victim its lease to the
    /// next holder's acquisition (kill, stop of 2.5 ttl, and every fault after
    /// which the victim's token was cancelled).
    pub takeovers: Vec<Duration>,
    /// Time from each landed injection to the victim's token being
    /// cancelled; `None` where it was not (the lease was kept).
    pub cancels: Vec<Option<Duration>>,
    /// What each holder woken by `SIGCONT` saw.
    pub wakes: Vec<Wake>,
    /// Pauses (SIGSTOP) during which another contender acquired the lease.
    pub taken_during_pause: usize,
    /// Pauses of 0.6 to 1.4 ttl (around the local deadline): only the
    /// overlap count and, if the holder noticed, its wake-up are checked.
    pub short_pauses: usize,
    /// Server downtime per restart.
    pub downtimes: Vec<Duration>,
    /// Required properties that did not hold.
    pub failures: Vec<String>,
}

impl ScenarioResult {
    /// A revocation (see [`Fault::revokes`]): overlaps are reported, bounded, not required to be zero.
    pub fn revocation(&self) -> bool {
        self.fault.revokes(self.backend)
    }
}

/// What a holder saw when it woke up from a pause longer than its ttl.
#[derive(Debug, Clone, Copy)]
pub struct Wake {
    /// After a pause of 2.5 ttl (else 0.6 to 1.4 ttl).
    pub long: bool,
    /// `is_valid()` at once: must be false.
    pub valid: bool,
    /// The token was already cancelled at once (before the engine's task ran).
    pub cancelled_at_once: bool,
    /// How long after waking the token was cancelled (`None`: not within 2 s).
    pub cancel_after: Option<Duration>,
    /// Whether the resource accepted a write with its old fence (`None`: no fence).
    pub write_accepted: Option<bool>,
}

/// Run the suite.
///
/// # Errors
///
/// [`RunError::Unavailable`] when a server cannot be started or the checker
/// reached; [`RunError::Failed`] when the run itself broke down. Findings
/// about `lease` are in the report ([`Report::failures`]), not errors.
pub async fn run(config: &Config) -> Result<Report, RunError> {
    let started = Instant::now();
    let unavailable = RunError::Unavailable;
    let checker_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&config.checker_url)
        .await
        .map_err(|e| unavailable(format!("checker postgres at {}: {e}", config.checker_url)))?;
    let prefix = crate::unique("lease_faults").replace('-', "_");
    let checker = Checker::new(checker_pool.clone(), &prefix);
    checker
        .create()
        .await
        .map_err(|e| RunError::Failed(format!("checker tables: {e}")))?;
    let result = run_with(config, &checker, &prefix).await;
    if !config.keep_tables {
        let _ = checker.drop_tables().await;
    }
    let mut report = result?;
    report.checker = format!(
        "{} (tables {prefix}_*{})",
        sqlx::query_scalar::<_, String>(
            "SELECT 'PostgreSQL ' || current_setting('server_version')"
        )
        .fetch_one(&checker_pool)
        .await
        .unwrap_or_default(),
        if config.keep_tables {
            ", kept"
        } else {
            ", dropped after the run"
        }
    );
    report.elapsed = started.elapsed();
    Ok(report)
}

/// The private servers of a run.
#[derive(Default)]
struct Servers {
    pg: Option<PrivateServer>,
    mariadb: Option<PrivateServer>,
    redis: Option<PrivateServer>,
    redis_volatile: Option<PrivateServer>,
}

async fn run_with(config: &Config, checker: &Checker, prefix: &str) -> Result<Report, RunError> {
    let unavailable = RunError::Unavailable;
    let wants = |b: BackendKind| config.backends.contains(&b);
    let mut servers = Servers::default();
    if wants(BackendKind::PgTable) || wants(BackendKind::PgAdvisory) {
        let pg = PrivateServer::postgres().await.map_err(unavailable)?;
        let pool = sqlx::PgPool::connect(&pg.url())
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        PgTable::new(pool.clone())
            .ensure_schema()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        pool.close().await;
        servers.pg = Some(pg);
    }
    if wants(BackendKind::MySqlTable) {
        let mariadb = PrivateServer::mariadb().await.map_err(unavailable)?;
        for slot in 0..config.workers {
            mariadb
                .mariadb_user(&format!("w{slot}"))
                .await
                .map_err(unavailable)?;
        }
        let pool = sqlx::MySqlPool::connect(&mariadb.url())
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        MySqlTable::new(pool.clone())
            .ensure_schema()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        pool.close().await;
        servers.mariadb = Some(mariadb);
    }
    if wants(BackendKind::Redis) {
        servers.redis = Some(
            PrivateServer::redis(RedisPersistence::AppendFsyncAlways)
                .await
                .map_err(unavailable)?,
        );
        if config.faults.contains(&Fault::RestartNoPersistence) {
            servers.redis_volatile = Some(
                PrivateServer::redis(RedisPersistence::None)
                    .await
                    .map_err(unavailable)?,
            );
        }
    }
    let mut environment = Environment::probe().await;
    for server in [&servers.pg, &servers.mariadb, &servers.redis]
        .into_iter()
        .flatten()
    {
        environment.servers.push(server.version().await);
    }

    let mut results = Vec::new();
    for &backend in &config.backends {
        for fault in backend.faults() {
            if !config.faults.contains(&fault) {
                continue;
            }
            let server = match (backend, fault) {
                (BackendKind::PgTable | BackendKind::PgAdvisory, _) => servers.pg.as_mut(),
                (BackendKind::MySqlTable, _) => servers.mariadb.as_mut(),
                (BackendKind::Redis, Fault::RestartNoPersistence) => {
                    servers.redis_volatile.as_mut()
                }
                (BackendKind::Redis, _) => servers.redis.as_mut(),
            }
            .ok_or_else(|| RunError::Failed("BUG: no server for a backend".to_owned()))?;
            let began = Instant::now();
            let mut scenario =
                Scenario::new(config, backend, fault, server, checker, prefix).await?;
            let outcome = scenario.run().await;
            scenario.shutdown().await;
            let result = match outcome {
                Ok(events) => scenario.analyse(&events).await?,
                Err(e) => {
                    return Err(RunError::Failed(format!(
                        "{}/{}: {e}",
                        backend.as_str(),
                        fault.as_str()
                    )));
                }
            };
            if config.progress {
                println!(
                    "fault-suite: {:<12} {:<23} {:>5.1}s  hits {} sections {} overlaps {} stale {}{}",
                    backend.as_str(),
                    fault.as_str(),
                    began.elapsed().as_secs_f64(),
                    result.hits,
                    result.sections,
                    result.overlaps,
                    result.stale_accepted,
                    if result.failures.is_empty() {
                        String::new()
                    } else {
                        format!("  FAILED: {}", result.failures.join("; "))
                    }
                );
            }
            results.push(result);
        }
    }
    Ok(Report {
        config: config.clone(),
        environment,
        results,
        checker: String::new(),
        elapsed: Duration::ZERO,
    })
}

/// What the orchestrator knows about one contender, from its stdout.
#[derive(Debug, Default)]
struct Seen {
    holding_since: Option<Instant>,
    /// Answer to the last `hold`: Some(true) = HOLDING.
    hold_reply: Option<bool>,
    wakes: u32,
    acquisitions: u64,
    exited: bool,
}

struct Worker {
    holder: String,
    child: Child,
    stdin: Option<ChildStdin>,
    seen: Arc<Mutex<Seen>>,
}

impl Worker {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
            let _ = stdin.flush().await;
        }
    }
}

struct Scenario<'a> {
    config: &'a Config,
    backend: BackendKind,
    fault: Fault,
    server: &'a mut PrivateServer,
    checker: &'a Checker,
    prefix: &'a str,
    key: String,
    name: String,
    proxies: Vec<FaultProxy>,
    workers: Vec<Worker>,
    generation: usize,
    /// Holders killed by the nemesis, and when.
    killed: HashMap<String, i64>,
}

impl<'a> Scenario<'a> {
    async fn new(
        config: &'a Config,
        backend: BackendKind,
        fault: Fault,
        server: &'a mut PrivateServer,
        checker: &'a Checker,
        prefix: &'a str,
    ) -> Result<Scenario<'a>, RunError> {
        let key = format!("{}/{}", backend.as_str(), fault.as_str());
        checker
            .add_resource(&key)
            .await
            .map_err(|e| RunError::Failed(format!("checker: {e}")))?;
        let mut proxies = Vec::new();
        for _ in 0..config.workers {
            proxies.push(FaultProxy::start(server.addr()).await);
        }
        let mut scenario = Scenario {
            config,
            backend,
            fault,
            server,
            checker,
            prefix,
            key,
            name: crate::unique("faults"),
            proxies,
            workers: Vec::new(),
            generation: 0,
            killed: HashMap::new(),
        };
        for slot in 0..config.workers {
            let worker = scenario.spawn(slot).map_err(RunError::Failed)?;
            scenario.workers.push(worker);
        }
        Ok(scenario)
    }

    fn spawn(&mut self, slot: usize) -> Result<Worker, String> {
        self.generation += 1;
        let holder = format!(
            "{}-{}-w{slot}-{}",
            self.backend.as_str(),
            self.fault.as_str(),
            self.generation
        );
        let port = self.proxies[slot].addr().port();
        let url = match self.backend {
            BackendKind::MySqlTable => format!("mysql://w{slot}@127.0.0.1:{port}/test"),
            _ => self.server.url_at(port),
        };
        let ttl = self.config.ttl;
        let args = worker::command_line(
            self.backend,
            &url,
            &self.name,
            &holder,
            ttl,
            &self.config.checker_url,
            self.prefix,
            &self.key,
            (ttl / 4, ttl * 2),
            Duration::from_secs(600),
            self.config.pool_ping,
        );
        let mut child = Command::new(&self.config.worker_exe)
            .arg("worker")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.config.worker_exe.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stdin = child.stdin.take();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let reader_seen = seen.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut seen = reader_seen.lock().unwrap_or_else(|e| e.into_inner());
                match line.split_whitespace().next() {
                    Some("ACQ") => {
                        seen.holding_since = Some(Instant::now());
                        seen.acquisitions += 1;
                    }
                    Some("REL") => seen.holding_since = None,
                    Some("HOLDING") => seen.hold_reply = Some(true),
                    Some("IDLE") => seen.hold_reply = Some(false),
                    Some("WAKE") => seen.wakes += 1,
                    _ => {}
                }
            }
            reader_seen.lock().unwrap_or_else(|e| e.into_inner()).exited = true;
        });
        Ok(Worker {
            holder,
            child,
            stdin,
            seen,
        })
    }

    /// A contender that has held the lease for at least 30 ms.
    async fn wait_holder(&self) -> Result<usize, String> {
        let limit = Instant::now() + self.config.ttl * 15;
        while Instant::now() < limit {
            if let Some(slot) = self.workers.iter().position(|w| {
                w.seen()
                    .holding_since
                    .is_some_and(|t| t.elapsed() >= Duration::from_millis(30))
            }) {
                return Ok(slot);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err("no contender acquired the lease".to_owned())
    }

    /// A holder that promised to keep its section going for `hold` more.
    async fn victim(&mut self, hold: Duration) -> Result<usize, String> {
        for _ in 0..30 {
            let slot = self.wait_holder().await?;
            self.workers[slot].seen().hold_reply = None;
            self.workers[slot]
                .send(&format!("hold {}", hold.as_millis()))
                .await;
            let limit = Instant::now() + Duration::from_secs(2);
            while Instant::now() < limit {
                let reply = self.workers[slot].seen().hold_reply;
                match reply {
                    Some(true) => return Ok(slot),
                    Some(false) => break,
                    None => tokio::time::sleep(Duration::from_millis(2)).await,
                }
            }
        }
        Err("no holder could be held".to_owned())
    }

    /// Wait until a contender other than `victim` acquires, for at most `limit`.
    async fn wait_takeover(&self, victim: &str, limit: Duration) {
        let before: Vec<u64> = self.workers.iter().map(|w| w.seen().acquisitions).collect();
        let limit = Instant::now() + limit;
        while Instant::now() < limit {
            let taken = self.workers.iter().enumerate().any(|(i, w)| {
                w.holder != victim && w.seen().acquisitions > before.get(i).copied().unwrap_or(0)
            });
            if taken {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn run(&mut self) -> Result<Vec<Event>, String> {
        let ttl = self.config.ttl;
        let mut events = Vec::new();
        self.wait_holder().await?;
        for k in 0..self.config.injections {
            events.push(self.inject(k).await?);
            // Let the victim's section end by its own length again.
            for worker in &mut self.workers {
                worker.send("hold 0").await;
            }
            if let Some(w) = self.workers.iter().find(|w| w.seen().exited) {
                return Err(format!(
                    "contender {} exited on its own (see its stderr)",
                    w.holder
                ));
            }
            // Let the contenders settle before the next injection.
            tokio::time::sleep(ttl / 2).await;
        }
        tokio::time::sleep(ttl / 2).await;
        Ok(events)
    }

    async fn inject(&mut self, k: u32) -> Result<Event, String> {
        let ttl = self.config.ttl;
        let mut event = Event {
            t: 0,
            t_lifted: None,
            victim: None,
            downtime: None,
        };
        match self.fault {
            Fault::Kill => {
                let slot = self.wait_holder().await?;
                let victim = self.workers[slot].holder.clone();
                event.t = now_us();
                let _ = self.workers[slot].child.start_kill();
                let _ = self.workers[slot].child.wait().await;
                self.killed.insert(victim.clone(), event.t);
                self.workers[slot] = self.spawn(slot)?;
                self.wait_takeover(&victim, ttl * 3).await;
                event.victim = Some(victim);
            }
            Fault::Stop => {
                let slot = self.victim(ttl * 10).await?;
                let pid = self.workers[slot].child.id().ok_or("victim gone")?;
                let wakes = self.workers[slot].seen().wakes;
                event.victim = Some(self.workers[slot].holder.clone());
                // Even injections: 2.5 ttl, so that the lease has surely
                // expired and been taken over. Odd ones: 0.6 to 1.4 ttl, around
                // the holder's local deadline.
                let pause = if k.is_multiple_of(2) {
                    ttl * 5 / 2
                } else {
                    ttl.mul_f64(0.6 + 0.8 * fraction())
                };
                event.t = now_us();
                signal(pid, "STOP");
                tokio::time::sleep(pause).await;
                signal(pid, "CONT");
                event.t_lifted = Some(now_us());
                let limit = Instant::now() + Duration::from_secs(5);
                while pause > ttl
                    && Instant::now() < limit
                    && self.workers[slot].seen().wakes == wakes
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                if pause <= ttl {
                    tokio::time::sleep(ttl).await;
                }
            }
            Fault::ConnKill => {
                let slot = self.victim(ttl * 3).await?;
                let victim = self.workers[slot].holder.clone();
                event.t = now_us();
                self.kill_connections(slot, &victim).await?;
                event.victim = Some(victim);
                tokio::time::sleep(ttl * 2).await;
            }
            Fault::Steal => {
                let slot = self.victim(ttl * 3).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = now_us();
                self.steal().await?;
                tokio::time::sleep(ttl * 2).await;
            }
            Fault::Latency => {
                let slot = self.victim(ttl * 4).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = now_us();
                let delay = if k.is_multiple_of(2) {
                    ttl / 6
                } else {
                    ttl / 12
                };
                for proxy in &self.proxies {
                    proxy.set_mode(Mode::Delay(delay));
                }
                tokio::time::sleep(ttl * 3).await;
                for proxy in &self.proxies {
                    proxy.set_mode(Mode::Pass);
                }
                event.t_lifted = Some(now_us());
                tokio::time::sleep(ttl / 2).await;
            }
            Fault::BlackHole => {
                let slot = self.victim(ttl * 5).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = now_us();
                self.proxies[slot].set_mode(Mode::BlackHole);
                tokio::time::sleep(ttl * 2).await;
                self.proxies[slot].set_mode(Mode::Pass);
                event.t_lifted = Some(now_us());
                tokio::time::sleep(ttl).await;
            }
            Fault::Reset => {
                let slot = self.victim(ttl * 3).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = now_us();
                for proxy in &self.proxies {
                    proxy.reset();
                }
                tokio::time::sleep(ttl * 2).await;
            }
            Fault::Restart | Fault::RestartNoPersistence => {
                let slot = self.victim(ttl * 4).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = now_us();
                let down = if k.is_multiple_of(2) {
                    ttl * 3 / 2
                } else {
                    Duration::ZERO
                };
                let down = self.server.restart_after(down).await?;
                event.downtime = Some(down);
                event.t_lifted = Some(now_us());
                tokio::time::sleep(ttl * 2).await;
            }
        }
        Ok(event)
    }

    /// Kill every server connection of the holder in `slot`.
    async fn kill_connections(&self, slot: usize, holder: &str) -> Result<(), String> {
        let err = |e: &dyn std::fmt::Display| format!("kill connections: {e}");
        match self.backend {
            BackendKind::PgTable | BackendKind::PgAdvisory => {
                let mut conn = sqlx::PgConnection::connect(&self.server.url())
                    .await
                    .map_err(|e| err(&e))?;
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(holder)
                .execute(&mut conn)
                .await
                .map_err(|e| err(&e))?;
                let _ = conn.close().await;
            }
            BackendKind::MySqlTable => {
                let mut conn = sqlx::MySqlConnection::connect(&self.server.url())
                    .await
                    .map_err(|e| err(&e))?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "KILL CONNECTION USER 'w{slot}'"
                )))
                .execute(&mut conn)
                .await
                .map_err(|e| err(&e))?;
                let _ = conn.close().await;
            }
            BackendKind::Redis => {
                let client = redis::Client::open(self.server.url()).map_err(|e| err(&e))?;
                let mut conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| err(&e))?;
                let list: String = redis::cmd("CLIENT")
                    .arg("LIST")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| err(&e))?;
                let name = format!("name={holder}");
                for line in list.lines().filter(|l| l.split(' ').any(|f| f == name)) {
                    if let Some(id) = line.split(' ').find_map(|f| f.strip_prefix("id=")) {
                        let _: Result<i64, _> = redis::cmd("CLIENT")
                            .arg("KILL")
                            .arg("ID")
                            .arg(id)
                            .query_async(&mut conn)
                            .await;
                    }
                }
            }
        }
        Ok(())
    }

    /// End the lease on the server, behind its holder's back.
    async fn steal(&self) -> Result<(), String> {
        let err = |e: &dyn std::fmt::Display| format!("steal: {e}");
        match self.backend {
            BackendKind::PgTable => {
                let mut conn = sqlx::PgConnection::connect(&self.server.url())
                    .await
                    .map_err(|e| err(&e))?;
                sqlx::query(
                    "UPDATE task_leases SET expires_at = clock_timestamp() WHERE name = $1",
                )
                .bind(&self.name)
                .execute(&mut conn)
                .await
                .map_err(|e| err(&e))?;
                let _ = conn.close().await;
            }
            BackendKind::MySqlTable => {
                let mut conn = sqlx::MySqlConnection::connect(&self.server.url())
                    .await
                    .map_err(|e| err(&e))?;
                sqlx::query("UPDATE task_leases SET expires_at = UTC_TIMESTAMP(6) WHERE name = ?")
                    .bind(self.name.as_bytes())
                    .execute(&mut conn)
                    .await
                    .map_err(|e| err(&e))?;
                let _ = conn.close().await;
            }
            BackendKind::Redis => {
                let pool = deadpool_redis::Config::from_url(self.server.url())
                    .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                    .map_err(|e| err(&e))?;
                let key = Redis::new(pool.clone()).lock_key(&self.name);
                let mut conn = pool.get().await.map_err(|e| err(&e))?;
                redis::cmd("DEL")
                    .arg(key)
                    .query_async::<i64>(&mut conn)
                    .await
                    .map_err(|e| err(&e))?;
            }
            BackendKind::PgAdvisory => return Err("no steal for advisory locks".to_owned()),
        }
        Ok(())
    }

    /// Stop every contender (they finish their section) and wait for them.
    async fn shutdown(&mut self) {
        for worker in &mut self.workers {
            worker.send("stop").await;
            worker.stdin = None;
        }
        let limit = Instant::now() + self.config.ttl * 4 + Duration::from_secs(5);
        for worker in &mut self.workers {
            let left = limit.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, worker.child.wait())
                .await
                .is_err()
            {
                let _ = worker.child.start_kill();
                let _ = worker.child.wait().await;
            }
        }
        for proxy in &self.proxies {
            proxy.set_mode(Mode::Pass);
        }
    }

    async fn analyse(&self, events: &[Event]) -> Result<ScenarioResult, RunError> {
        let failed = |e: sqlx::Error| RunError::Failed(format!("checker: {e}"));
        let sections = self.checker.sections(&self.key).await.map_err(failed)?;
        let writes = self.checker.writes(&self.key).await.map_err(failed)?;
        let resource = self.checker.resource(&self.key).await.map_err(failed)?;
        Ok(analyse(
            self.config,
            self.backend,
            self.fault,
            &self.killed,
            events,
            &sections,
            &writes,
            &resource,
        ))
    }
}

/// Where section `s`'s valid interval ends: its last valid check; for a
/// section that never ended, the moment its process was killed (the
/// latest it could have acted).
fn valid_until(s: &Section, killed: &HashMap<String, i64>, ttl: Duration) -> Option<i64> {
    match s.t_end {
        Some(_) => s.t_last_valid,
        None => Some(
            killed
                .get(&s.holder)
                .copied()
                .unwrap_or(s.t_start + us(ttl)),
        ),
    }
}

/// The section of `victim` that was running at `t`.
fn section_at<'s>(sections: &'s [Section], victim: &str, t: i64) -> Option<&'s Section> {
    sections
        .iter()
        .filter(|s| s.holder == victim && s.t_start <= t)
        .rfind(|s| s.t_end.is_none_or(|end| end >= t))
}

fn dur(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

#[allow(clippy::too_many_arguments)]
fn analyse(
    config: &Config,
    backend: BackendKind,
    fault: Fault,
    killed: &HashMap<String, i64>,
    events: &[Event],
    sections: &[Section],
    writes: &[Write],
    resource: &(i64, String),
) -> ScenarioResult {
    let ttl = config.ttl;
    let mut r = ScenarioResult {
        backend,
        fault,
        ttl,
        hits: 0,
        misses: 0,
        sections: sections.len(),
        completed: sections
            .iter()
            .filter(|s| s.valid_end == Some(true))
            .count(),
        overlaps: 0,
        max_overlap: Duration::ZERO,
        stale_accepted: 0,
        writes: (
            writes.iter().filter(|w| w.accepted).count(),
            writes.iter().filter(|w| !w.accepted).count(),
        ),
        valid_rejected: writes
            .iter()
            .filter(|w| w.client_valid && !w.accepted)
            .count(),
        fence_reissues: 0,
        takeovers: Vec::new(),
        cancels: Vec::new(),
        wakes: Vec::new(),
        downtimes: events.iter().filter_map(|e| e.downtime).collect(),
        taken_during_pause: 0,
        short_pauses: 0,
        failures: Vec::new(),
    };

    // Sections that never ended must be explained by a kill.
    for s in sections.iter().filter(|s| s.t_end.is_none()) {
        if !killed.contains_key(&s.holder) {
            r.failures.push(format!(
                "contender {} died in a section (not killed by the nemesis)",
                s.holder
            ));
        }
    }

    // Overlaps between valid intervals of different holders.
    let intervals: Vec<(&str, i64, i64)> = sections
        .iter()
        .filter_map(|s| {
            let until = valid_until(s, killed, ttl)?;
            (until >= s.t_start).then_some((s.holder.as_str(), s.t_start, until))
        })
        .collect();
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                r.overlaps += 1;
                r.max_overlap = r.max_overlap.max(dur(a.2.min(b.2) - a.1.max(b.1)));
            }
        }
    }

    // The write log, re-checked: accepted writes in the order they were applied.
    let mut max: Option<(i64, &str)> = None;
    for w in writes.iter().filter(|w| w.accepted) {
        if let Some((f, h)) = max
            && (w.fence < f || (w.fence == f && w.holder != h))
        {
            r.stale_accepted += 1;
        }
        if max.is_none_or(|(f, _)| w.fence >= f) {
            max = Some((w.fence, &w.holder));
        }
    }
    let expected = max.map_or((0, String::new()), |(f, h)| (f, h.to_owned()));
    if backend.fenced() && *resource != expected {
        r.failures.push(format!(
            "checker inconsistent: the resource holds {resource:?}, its write log says {expected:?}"
        ));
    }

    // Fences handed out: each acquisition's must exceed every earlier holder's.
    if backend.fenced() {
        let mut max: Option<(i64, &str)> = None;
        for s in sections {
            let Some(f) = s.fence else { continue };
            if let Some((m, h)) = max
                && (f < m || (f == m && s.holder != h))
            {
                r.fence_reissues += 1;
            }
            if max.is_none_or(|(m, _)| f >= m) {
                max = Some((f, &s.holder));
            }
        }
    }

    // Per injection.
    for (i, e) in events.iter().enumerate() {
        let Some(victim) = e.victim.as_deref() else {
            continue;
        };
        // What happened after this injection and before the next one is its doing.
        let next = events.get(i + 1).map_or(i64::MAX, |n| n.t);
        let ours = |t: i64| e.t <= t && t < next;
        let Some(section) = section_at(sections, victim, e.t) else {
            r.misses += 1;
            continue;
        };
        // A pause longer than 2 ttl: the lease has surely been taken over.
        let long_pause = e.t_lifted.is_some_and(|l| l - e.t > 2 * us(ttl));
        let woke = section.wake_t.filter(|&t| ours(t));
        let hit = match fault {
            Fault::Kill => section.t_end.is_none(),
            Fault::Stop if long_pause => woke.is_some(),
            _ => true,
        };
        if !hit {
            r.misses += 1;
            continue;
        }
        r.hits += 1;
        let takeover = sections
            .iter()
            .filter(|s| s.holder != victim && ours(s.t_start))
            .map(|s| s.t_start - e.t)
            .min();
        let cancel = section.t_cancel.filter(|&c| ours(c)).map(|c| dur(c - e.t));
        // A takeover is reported where the victim lost its lease to the
        // fault: killed, paused past its lease, or its token cancelled
        // (otherwise the next acquisition merely follows its release).
        let lost = match fault {
            Fault::Kill => true,
            Fault::Stop => long_pause,
            _ => cancel.is_some(),
        };
        if let Some(t) = takeover.filter(|_| lost) {
            r.takeovers.push(dur(t));
        }
        match fault {
            Fault::Kill => match takeover {
                Some(t) if dur(t) <= config.takeover_bound(backend) => {}
                Some(t) => r.failures.push(format!(
                    "takeover {:?} after SIGKILL exceeds {:?}",
                    dur(t),
                    config.takeover_bound(backend)
                )),
                None => r.failures.push("nobody took over after SIGKILL".to_owned()),
            },
            Fault::Stop => {
                // Woken after a gap longer than the ttl (every long pause, and
                // the short ones that exceeded the ttl).
                if woke.is_some() {
                    let valid = section.wake_valid.unwrap_or(true);
                    let cancel_after = section.wake_cancel_us.map(dur);
                    r.wakes.push(Wake {
                        long: long_pause,
                        valid,
                        cancelled_at_once: section.wake_cancelled_now.unwrap_or(false),
                        cancel_after,
                        write_accepted: section.wake_write_accepted,
                    });
                    if valid {
                        r.failures
                            .push("the woken holder's is_valid() was true".to_owned());
                    }
                    if cancel_after.is_none_or(|c| c > config.slack) {
                        r.failures.push(format!(
                            "the woken holder's token was not cancelled within {:?} ({cancel_after:?})",
                            config.slack
                        ));
                    }
                }
                if !long_pause {
                    r.short_pauses += 1;
                    continue;
                }
                if section.wake_write_accepted == Some(true) {
                    r.failures.push(
                        "the woken holder's write with its old fence was accepted".to_owned(),
                    );
                }
                let lifted = e.t_lifted.unwrap_or(i64::MAX);
                if takeover.is_some_and(|t| e.t + t < lifted) {
                    r.taken_during_pause += 1;
                }
                if backend != BackendKind::PgAdvisory {
                    match takeover.filter(|&t| e.t + t < lifted) {
                        Some(t) if dur(t) <= config.takeover_bound(backend) => {}
                        Some(t) => r.failures.push(format!(
                            "takeover {:?} during the pause exceeds {:?}",
                            dur(t),
                            config.takeover_bound(backend)
                        )),
                        None => r
                            .failures
                            .push("nobody took over during the pause".to_owned()),
                    }
                }
            }
            _ => {
                r.cancels.push(cancel);
                let bound = match fault {
                    Fault::BlackHole => Some(config.deadline_bound()),
                    f if f.revokes(backend) && f != Fault::RestartNoPersistence => {
                        Some(config.cancel_bound())
                    }
                    _ => None,
                };
                if let Some(bound) = bound {
                    match cancel {
                        Some(c) if c <= bound => {}
                        // The victim may have finished its section valid
                        // before it could learn (only if it was not held).
                        other => r.failures.push(format!(
                            "{}: the victim's token was cancelled after {other:?}, bound {bound:?}",
                            fault.as_str()
                        )),
                    }
                }
            }
        }
    }

    if r.hits == 0 {
        r.failures
            .push("no injection landed on a holder".to_owned());
    }
    if r.completed == 0 {
        r.failures.push("no critical section completed".to_owned());
    }
    if backend.fenced() && r.stale_accepted > 0 {
        r.failures
            .push(format!("{} stale-fence writes accepted", r.stale_accepted));
    }
    if fault == Fault::RestartNoPersistence {
        // Reported, not required: see docs/RELIABILITY.md.
    } else if fault.revokes(backend) {
        if r.max_overlap > config.cancel_bound() {
            r.failures.push(format!(
                "overlap of {:?} exceeds one renewal period ({:?})",
                r.max_overlap,
                config.cancel_bound()
            ));
        }
    } else if r.overlaps > 0 {
        r.failures.push(format!(
            "{} overlaps between valid holders (longest {:?})",
            r.overlaps, r.max_overlap
        ));
    }
    r
}

#[cfg(test)]
mod tests;
