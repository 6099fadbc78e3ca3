//! The fault-injection suite: contenders in separate processes, a nemesis
//! that injects the faults production sees, and a checker that the
//! contenders cannot fool — see `docs/RELIABILITY.md` for what it shows.
//!
//! [`run`] starts private servers ([`crate::servers`]), then, for every
//! backend × fault ([`Fault`]), a *scenario*: `workers` contender processes
//! (the `fault-suite` binary in its `worker` role, [`worker`]) loop
//! acquire → critical section (the *body*, which stops a random 0 to
//! grace/2 after its token fires) of random length → release on one lease name,
//! each through its own [`FaultProxy`](crate::proxy::FaultProxy) to the
//! server, while the nemesis injects the fault `injections` times (at least
//! once per variant of the fault, [`Fault::variants`]). Every critical
//! section and every write to the fenced resource is recorded in the
//! checker (tables on the shared PostgreSQL, never faulted); the scenario
//! is analysed from those records, and from what the proxies saw, when its
//! contenders have stopped, into a [`ScenarioResult`].
//!
//! *Election scenarios* ([`Config::elections`]) run the same faults with
//! contenders that run a leader election ([`leasehold::Lease::elect`]) instead
//! of a `try_acquire` loop: each term is a critical section, recorded and
//! checked the same way (never two valid terms at once, fencing), and after
//! every fault some contender must lead again within the takeover bound
//! ([`Config::takeover_bound`]).
//!
//! Every check must be able to fail: [`breaks`] holds the deliberately
//! broken behaviours (switched on by `LEASE_FAULTS_BREAK`) that show it.
//!
//! The files, in reading order: this one ([`Config`], its timing bounds,
//! [`run`]); `kinds.rs`, the backends and faults with the facts about each
//! in one table ([`BACKENDS`], [`FAULTS`]); `scenario.rs`, one scenario's
//! contender processes and the waits the nemesis builds on; `nemesis.rs`,
//! what each fault does; `analysis.rs`, the checks ([`ScenarioResult`]);
//! `report.rs` and `timeline.rs`, the table and pictures of
//! `docs/RELIABILITY.md`; [`worker`], the contender; `checker.rs`, the
//! records; `txn.rs`, the unfenced table of `stop-in-txn`; [`etcd`], the
//! etcd cluster under faults.
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

use std::path::PathBuf;
use std::time::Duration;

use leasehold::backend::{MySqlTable, PgAdvisory, PgTable};
use tokio::time::Instant;

use crate::clusters::RedisCluster;
use crate::servers::{PrivateServer, RedisPersistence};

mod analysis;
pub mod breaks;
mod checker;
pub mod etcd;
mod kinds;
mod nemesis;
mod report;
mod scenario;
mod timeline;
mod txn;
pub mod worker;

pub use analysis::{ScenarioResult, Wake};
use analysis::{analyse, dur, leader_again, section_at, valid_from};
use checker::Checker;
#[cfg(test)]
use checker::{Section, Write};
pub use kinds::{
    BACKENDS, BackendKind, BackendSpec, ByDeadline, FAULTS, Fault, FaultSpec, LeaseEnd, Revokes,
    Server,
};
use nemesis::Event;
pub use report::{Environment, MARKERS, Report};
use scenario::{Target, result_label, run_scenario};

/// Every time the suite records — in the orchestrator, the proxies and the
/// contender processes — is in µs of this clock: `CLOCK_MONOTONIC`, one
/// clock for all the processes of the host, which the wall clock is not.
pub use crate::monotonic_us;

/// A number in `[0, 1)`, different on every call.
fn fraction() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let bits = RandomState::new().hash_one(monotonic_us()) >> 11;
    // 53 random bits: exact in an f64.
    bits as f64 / (1u64 << 53) as f64
}

fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The `cluster-node-timeout` of the fault suite's Redis Cluster: a master
/// that does not answer for that long is failed over to its replica.
pub const CLUSTER_NODE_TIMEOUT_MS: u32 = 1000;

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
    /// Faults also run as *election scenarios* (contenders run
    /// `Lease::elect`), on every backend they apply to, when they are in
    /// [`faults`](Config::faults) too.
    pub elections: Vec<Fault>,
    /// Run only the election scenarios.
    pub elections_only: bool,
    /// `drift`: the speed of the victim's clocks (libfaketime), as a
    /// fraction of real time. The suite requires zero overlaps at 0.8
    /// (the default); at 0.5 it reports them (`docs/RELIABILITY.md`).
    pub drift_rate: f64,
    /// Run the faults that have a [`FaultSpec::short_on`] only on those
    /// backends (the short run); `false`: on every backend they apply to.
    pub sample: bool,
}

impl Config {
    /// The short run CI does: every backend × fault (the newer faults on a
    /// sample of backends, [`FaultSpec::short_on`]), injected once per
    /// variant ([`Config::injections_for`]).
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
            // The full run adds `black-hole` (CI's time).
            elections: vec![Fault::Kill, Fault::Stop, Fault::ConnKill],
            elections_only: false,
            drift_rate: 0.8,
            sample: true,
        }
    }

    /// The scenarios of this run: `(backend, fault, election)`, in report order.
    pub fn scenarios(&self) -> Vec<(BackendKind, Fault, bool)> {
        let mut out = Vec::new();
        for &backend in &self.backends {
            let faults = || {
                backend.faults().into_iter().filter(|f| {
                    self.faults.contains(f)
                        && (!self.sample
                            || f.spec().short_on.is_none_or(|on| on.contains(&backend)))
                })
            };
            if !self.elections_only {
                out.extend(faults().map(|f| (backend, f, false)));
            }
            out.extend(
                faults()
                    .filter(|f| self.elections.contains(f))
                    .map(|f| (backend, f, true)),
            );
        }
        out
    }

    /// Injections of `fault` in this run: [`injections`](Config::injections),
    /// but at least one per documented variant ([`Fault::variants`]), so
    /// that even the short run tries every kind of scenario (except under
    /// the `first-variant-only` break).
    pub fn injections_for(&self, fault: Fault) -> u32 {
        if breaks::on("first-variant-only") {
            return 1;
        }
        let variants = u32::try_from(fault.variants().len()).unwrap_or(1);
        self.injections.max(variants)
    }

    /// The full run documented in `docs/RELIABILITY.md`: ten injections
    /// each, and every fault of [`Fault::ELECTION`] as an election scenario.
    pub fn full(worker_exe: PathBuf) -> Self {
        Self {
            injections: 10,
            elections: Fault::ELECTION.to_vec(),
            sample: false,
            ..Self::short(worker_exe)
        }
    }

    /// Timing bound: takeover after the holder was killed.
    pub fn takeover_bound(&self, backend: BackendKind) -> Duration {
        match backend.spec().lease_end {
            // The lock ends with the session: one heartbeat at most.
            LeaseEnd::Session => self.ttl / 3 + self.slack,
            LeaseEnd::EtcdLease => self.etcd_takeover_bound(),
            LeaseEnd::Expiry => self.ttl + self.ttl / 3 + self.slack,
        }
    }

    /// Timing bound: takeover after the holder was killed, on etcd. The
    /// etcd lease's TTL is the ttl rounded up to whole seconds (at least
    /// etcd's minimum, 1.5 election timeouts rounded up: 1 s here,
    /// [`leasehold::backend::Etcd::lease_ttl_secs`]), counted by the leader from
    /// the last keep-alive; the leader finds expired leases only when its
    /// check comes round ([`etcd::EXPIRY_CHECK`], 500 ms) and then revokes
    /// them through raft. So on top of the other backends' bound
    /// (`ttl + ttl/3`), the rounding and one expiry check.
    pub fn etcd_takeover_bound(&self) -> Duration {
        let etcd_ttl = Duration::from_secs(
            u64::try_from(leasehold::backend::Etcd::lease_ttl_secs(self.ttl)).unwrap_or(u64::MAX),
        );
        etcd_ttl.max(self.ttl) + self.ttl / 3 + etcd::EXPIRY_CHECK + self.slack
    }

    /// The longest overlap allowed where a revocation is noticed when it
    /// happens: `PgAdvisory` watches the connection that holds the lock, so
    /// the end of its session (`conn-kill`, `reset`, `restart`) reaches the
    /// holder at once, not at its next heartbeat; `Etcd` watches its keys,
    /// so a steal or a resumed leader's revocation does too.
    pub fn overlap_bound(&self, fault: Fault, backend: BackendKind) -> Duration {
        if fault.revokes_promptly(backend) {
            PROMPT_LOSS
        } else {
            self.cancel_bound()
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

    /// The contenders' grace: the library's default, ttl/3. A cooperative
    /// body stops within grace/2 of its token.
    pub fn grace(&self) -> Duration {
        self.ttl / 3
    }

    /// `max-hold`: the contenders' `max_hold`, one ttl (shorter than the
    /// victim's section, which it is asked to hold for 3 ttl).
    pub fn max_hold(&self) -> Duration {
        self.ttl
    }

    /// Timing bound (`deploy`, `max-hold`): from the victim's body's return
    /// to the next grant of the lease — its release, and the contenders'
    /// retry every 5–25 ms (the slack: a loaded machine).
    pub fn handover_bound(&self) -> Duration {
        self.slack
    }

    /// Timing bound (`deploy`): from the `SIGTERM` to the victim's exit:
    /// `shutdown()` returns within the grace plus a release's time limit,
    /// `min(ttl, 30 s)`.
    pub fn exit_bound(&self) -> Duration {
        self.grace() + self.ttl.min(Duration::from_secs(30)) + self.slack
    }

    /// Timing bound (`black-hole-conn`): from the end of the victim's section
    /// to its next acquisition, with the other contenders held back. The
    /// `Redis` docs ("Connection"): a connection that stops answering is
    /// retired when the first call sent into the silence reaches its time
    /// limit — at most redis' response timeout, 500 ms by default (the
    /// contenders' pools keep it), or the engine's acquisition limit if
    /// shorter — and every later call goes to a new connection. So the
    /// release and the acquisition take at most one such limit plus round
    /// trips, after the contender's pause of up to 60 ms.
    pub fn reconnect_bound(&self) -> Duration {
        let margin = self.ttl / 100 + Duration::from_millis(2);
        Duration::from_millis(500).min(self.ttl - margin) + Duration::from_millis(60) + self.slack
    }

    /// [`reconnect_bound`](Config::reconnect_bound), or on etcd
    /// [`etcd_reconnect_bound`](Config::etcd_reconnect_bound).
    pub fn reconnect_bound_of(&self, backend: BackendKind) -> Duration {
        match backend.spec().lease_end {
            LeaseEnd::EtcdLease => self.etcd_reconnect_bound(),
            LeaseEnd::Expiry | LeaseEnd::Session => self.reconnect_bound(),
        }
    }

    /// Timing bound (`black-hole-conn`) on etcd. The client's gRPC channel
    /// keeps sending on a connection until HTTP/2 keep-alive retires it:
    /// a PING every 5 s, 2 s to answer ([`etcd::CLIENT_KEEP_ALIVE`], as
    /// `Etcd::connect` sets them), so a connection that went silent is
    /// closed at most 7 s after the silence began, and the channel connects
    /// again; until then the holder's calls time out. Counted from the end
    /// of the victim's section (2 ttl after the silence began, so this is
    /// generous by that much), plus its pause of up to 60 ms and the slack.
    pub fn etcd_reconnect_bound(&self) -> Duration {
        let (interval, answer) = etcd::CLIENT_KEEP_ALIVE;
        interval + answer + Duration::from_millis(60) + self.slack
    }
}

/// Why a run could not be done.
#[derive(Debug)]
pub enum RunError {
    /// A server (private or the checker's) could not be started or reached.
    Unavailable(String),
    /// The run broke down (not a finding about `leasehold`: see the report for those).
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

/// The longest overlap between two holders of a lease revoked behind the
/// first one's back where the backend watches for it (a `PgAdvisory`
/// session's end, an etcd key deleted or its lease revoked;
/// [`Config::overlap_bound`]): the watch tells it in a few milliseconds.
pub const PROMPT_LOSS: Duration = Duration::from_millis(50);

/// How long [`Fault::BlackHoleLong`] cuts the holder's link.
pub const LONG_BLACK_HOLE: Duration = Duration::from_secs(8);

/// Run the suite.
///
/// # Errors
///
/// [`RunError::Unavailable`] when a server cannot be started or the checker
/// reached; [`RunError::Failed`] when the run itself broke down. Findings
/// about `leasehold` are in the report ([`Report::failures`]), not errors.
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
    redis_cluster: Option<RedisCluster>,
    etcd: Option<etcd::Cluster>,
}

async fn run_with(config: &Config, checker: &Checker, prefix: &str) -> Result<Report, RunError> {
    let unavailable = RunError::Unavailable;
    let wants = |b: BackendKind| config.backends.contains(&b);
    if config.scenarios().iter().any(|s| s.1 == Fault::Drift)
        && std::process::Command::new("faketime")
            .arg("--help")
            .output()
            .is_err()
    {
        return Err(unavailable(
            "`drift` needs libfaketime's `faketime` (apt-get install faketime)".to_owned(),
        ));
    }
    let mut servers = Servers::default();
    if config.backends.iter().any(|b| b.postgres()) {
        let pg = PrivateServer::postgres().await.map_err(unavailable)?;
        let pool = sqlx::PgPool::connect(&pg.url())
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        PgTable::new(pool.clone())
            .ensure_schema()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        // On the private server, which goes with the run.
        PgAdvisory::new(pool.clone())
            .with_fencing(worker::FENCE_TABLE)
            .map_err(|e| unavailable(e.to_string()))?
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
    if wants(BackendKind::RedisCluster) {
        let cluster =
            tokio::task::spawn_blocking(|| RedisCluster::with_replicas(3, CLUSTER_NODE_TIMEOUT_MS))
                .await
                .map_err(|e| unavailable(e.to_string()))?
                .map_err(unavailable)?;
        servers.redis_cluster = Some(cluster);
    }
    if wants(BackendKind::Etcd) {
        servers.etcd = Some(etcd::Cluster::start(3).await.map_err(unavailable)?);
    }
    let mut environment = Environment::probe().await;
    for server in [&servers.pg, &servers.mariadb, &servers.redis]
        .into_iter()
        .flatten()
    {
        environment.servers.push(server.version().await);
    }
    if let Some(cluster) = &servers.redis_cluster {
        let info = cluster.command(0, "INFO server");
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim();
        environment.servers.push(format!(
            "Redis Cluster {version} (3 masters, 1 replica each, cluster-node-timeout \
             {CLUSTER_NODE_TIMEOUT_MS} ms, no persistence)"
        ));
    }
    if let Some(cluster) = &servers.etcd {
        environment
            .servers
            .push(format!("{} (3 members)", cluster.version()));
    }

    let mut results = Vec::new();
    for (backend, fault, election) in config.scenarios() {
        let target = match backend.spec().server {
            Server::Postgres => servers.pg.as_mut().map(Target::Server),
            Server::MariaDb => servers.mariadb.as_mut().map(Target::Server),
            Server::Redis if fault == Fault::RestartNoPersistence => {
                servers.redis_volatile.as_mut().map(Target::Server)
            }
            Server::Redis => servers.redis.as_mut().map(Target::Server),
            Server::RedisCluster => servers.redis_cluster.as_mut().map(Target::Cluster),
            Server::Etcd => match servers.etcd.as_mut() {
                Some(cluster) => {
                    // One cluster for the run: every fault leaves it healthy again.
                    cluster.ensure_healthy().await.map_err(|e| {
                        RunError::Failed(format!("etcd before {}: {e}", fault.as_str()))
                    })?;
                    Some(Target::Etcd(cluster))
                }
                None => None,
            },
        }
        .ok_or_else(|| RunError::Failed("BUG: no server for a backend".to_owned()))?;
        let began = Instant::now();
        let result =
            run_scenario(config, backend, fault, election, target, checker, prefix).await?;
        progress(config, &result, began);
        results.push(result);
    }
    Ok(Report {
        config: config.clone(),
        environment,
        results,
        checker: String::new(),
        elapsed: Duration::ZERO,
    })
}

/// The progress line of a scenario (if [`Config::progress`]).
fn progress(config: &Config, result: &ScenarioResult, began: Instant) {
    if config.progress {
        println!(
            "fault-suite: {:<12} {:<23} {:>5.1}s  hits {} sections {} overlaps {} (valid {}) stale {}{}{}",
            result.backend.as_str(),
            result_label(result.fault, result.election),
            began.elapsed().as_secs_f64(),
            result.hits,
            result.sections,
            result.body_overlaps + result.frozen_overlaps,
            result.overlaps,
            result.stale_accepted,
            if result.fault == Fault::StopInTxn {
                format!(
                    " unfenced stale {} (of {})",
                    result.unfenced_stale, result.unfenced_writes
                )
            } else {
                String::new()
            },
            if result.failures.is_empty() {
                String::new()
            } else {
                format!("  FAILED: {}", result.failures.join("; "))
            }
        );
    }
}

#[cfg(test)]
mod tests;
