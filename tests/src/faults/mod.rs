//! The fault-injection suite: contenders in separate processes, a nemesis
//! that injects the faults production sees, and a checker that the
//! contenders cannot fool — see `docs/RELIABILITY.md` for what it shows.
//!
//! [`run`] starts private servers ([`crate::servers`]), then, for every
//! backend × fault ([`Fault`]), a *scenario*: `workers` contender processes
//! (the `fault-suite` binary in its `worker` role, [`worker`]) loop
//! acquire → critical section of random length → release on one lease name,
//! each through its own [`FaultProxy`] to the
//! server, while the nemesis injects the fault `injections` times (at least
//! once per variant of the fault, [`Fault::variants`]). Every critical
//! section and every write to the fenced resource is recorded in the
//! checker (tables on the shared PostgreSQL, never faulted); the scenario
//! is analysed from those records, and from what the proxies saw, when its
//! contenders have stopped, into a [`ScenarioResult`].
//!
//! *Election scenarios* ([`Config::elections`]) run the same faults with
//! contenders that run a leader election ([`lease::Lease::elect`]) instead
//! of a `try_acquire` loop: each term is a critical section, recorded and
//! checked the same way (never two valid terms at once, fencing), and after
//! every fault some contender must lead again within the takeover bound
//! ([`Config::takeover_bound`]).
//!
//! Every check must be able to fail: [`breaks`] holds the deliberately
//! broken behaviours (switched on by `LEASE_FAULTS_BREAK`) that show it.
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
use std::time::Duration;

use lease::backend::{MySqlTable, PgAdvisory, PgTable, Redis};
use sqlx::Connection;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::time::Instant;

use crate::clusters::RedisCluster;
use crate::proxy::{FaultProxy, Mode, StalledRequest};
use crate::servers::{PrivateServer, RedisPersistence, signal};

pub mod breaks;
mod checker;
pub mod etcd;
mod report;
mod timeline;
pub mod worker;

use checker::{Checker, Section, Write};
pub use report::{Environment, MARKERS, Report};

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

/// A backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// `PgTable` on a private PostgreSQL.
    PgTable,
    /// `MySqlTable` on a private MariaDB.
    MySqlTable,
    /// `PgAdvisory` on a private PostgreSQL.
    PgAdvisory,
    /// `PgAdvisory::with_fencing` (the table `lease_fences`) on a private
    /// PostgreSQL.
    PgAdvisoryFenced,
    /// `Redis` on a private Redis.
    Redis,
    /// `Redis::cluster` on a private Redis Cluster: 3 masters, each with
    /// one replica ([`RedisCluster::with_replicas`]).
    RedisCluster,
    /// `Etcd` on a private 3-member etcd cluster ([`etcd::Cluster`]).
    Etcd,
}

impl BackendKind {
    /// Every backend, in report order.
    pub const ALL: [BackendKind; 7] = [
        BackendKind::PgTable,
        BackendKind::MySqlTable,
        BackendKind::PgAdvisory,
        BackendKind::PgAdvisoryFenced,
        BackendKind::Redis,
        BackendKind::RedisCluster,
        BackendKind::Etcd,
    ];

    /// The name used on command lines and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::PgTable => "pg-table",
            BackendKind::MySqlTable => "mysql-table",
            BackendKind::PgAdvisory => "pg-advisory",
            BackendKind::PgAdvisoryFenced => "pg-advisory-fenced",
            BackendKind::Redis => "redis",
            BackendKind::RedisCluster => "redis-cluster",
            BackendKind::Etcd => "etcd",
        }
    }

    /// The type's name in the `lease` crate.
    pub fn type_name(self) -> &'static str {
        match self {
            BackendKind::PgTable => "PgTable",
            BackendKind::MySqlTable => "MySqlTable (MariaDB)",
            BackendKind::PgAdvisory => "PgAdvisory",
            BackendKind::PgAdvisoryFenced => "PgAdvisory (fenced)",
            BackendKind::Redis => "Redis",
            BackendKind::RedisCluster => "Redis (Cluster)",
            BackendKind::Etcd => "Etcd (3 members)",
        }
    }

    /// Does it hand out fencing tokens?
    pub fn fenced(self) -> bool {
        self != BackendKind::PgAdvisory
    }

    /// Is it `PgAdvisory` (with fencing or without): a session advisory
    /// lock, which ends with its session and has no expiry?
    pub fn advisory(self) -> bool {
        matches!(
            self,
            BackendKind::PgAdvisory | BackendKind::PgAdvisoryFenced
        )
    }

    /// Does it run on the private PostgreSQL?
    pub fn postgres(self) -> bool {
        self == BackendKind::PgTable || self.advisory()
    }

    /// The faults that apply to this backend, in report order.
    pub fn faults(self) -> Vec<Fault> {
        if self == BackendKind::RedisCluster {
            // The contenders talk to the nodes directly (the cluster tells
            // them where its nodes are), so the faults of the proxy do not
            // apply; the holder's process, and the master of its slot.
            return vec![Fault::Kill, Fault::Stop, Fault::MasterKill];
        }
        Fault::ALL
            .into_iter()
            .filter(|f| match f {
                // No lease to steal without ending the session (that is
                // `conn-kill`); without fencing, no fence to match a late
                // release against (with fencing, the same faults as
                // without, to compare the two).
                Fault::Steal | Fault::LateRelease => !self.advisory(),
                // The backend that promises to replace a silent connection;
                // see `docs/RELIABILITY.md` for the others.
                Fault::BlackHoleConn => matches!(self, BackendKind::Redis | BackendKind::Etcd),
                Fault::RestartNoPersistence => self == BackendKind::Redis,
                Fault::MasterKill => false,
                // The faults of an etcd cluster's members.
                Fault::LeaderKill | Fault::LeaderPause | Fault::Partition => {
                    self == BackendKind::Etcd
                }
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
    /// Added latency for 3 ttl, in turn: ttl/6 each way on every
    /// contender's link (a round trip of ttl/3, the renewal timeout); ttl/12
    /// each way on every link; ttl/6 each way on the holder's link only, so
    /// that the others, undelayed, take the lease the moment the server lets
    /// them — any belief of the holder's past that moment is an overlap.
    Latency,
    /// The holder's link becomes a black hole for 2 ttl, then heals.
    BlackHole,
    /// The holder's established connections go silent for good (a half-open
    /// socket: a failover behind a virtual IP, a dropped NAT entry), while
    /// new connections get through.
    BlackHoleConn,
    /// Every open connection (all contenders) is reset (TCP RST).
    Reset,
    /// The holder's release is held back in the network past the ttl; the
    /// same holder acquires the name again; then the old release is
    /// delivered. It must not end the newer lease.
    LateRelease,
    /// The server process crashes and restarts (PostgreSQL immediate
    /// shutdown, MariaDB and Redis `SIGKILL`; Redis with
    /// `appendonly yes`, `appendfsync always`): on even injections it stays
    /// down for 1.5 ttl first (longer than any lease), on odd ones it
    /// restarts at once.
    Restart,
    /// Redis without persistence crashes and restarts, as [`Fault::Restart`]:
    /// every key is lost.
    RestartNoPersistence,
    /// Redis Cluster: `SIGKILL` of the master of the lease's hash slot; its
    /// replica takes over (after the `cluster-node-timeout`, or at once by
    /// `CLUSTER FAILOVER TAKEOVER`), then the killed node is started again
    /// and rejoins as a replica. Replication is asynchronous: the promoted
    /// replica may lack the lock or the fence counter's last increment.
    MasterKill,
    /// etcd: the member that leads the cluster is `SIGKILL`ed (found by
    /// asking every member, [`etcd::Cluster::leader`]), stays down for 2 ttl,
    /// and is started again on its data.
    LeaderKill,
    /// etcd: the leader member is `SIGSTOP`ped for 3 election timeouts
    /// ([`etcd::ELECTION_TIMEOUT`]), then `SIGCONT`.
    LeaderPause,
    /// etcd: one member is cut off from the two others in both directions
    /// ([`etcd::Cluster::partition`]) for 3 election timeouts, then healed;
    /// in turn the leader and a follower. Clients still reach it.
    Partition,
}

impl Fault {
    /// The faults of the election scenarios ([`Config::elections`]): the
    /// holder killed, paused, its connections killed, its link cut.
    pub const ELECTION: [Fault; 4] = [Fault::Kill, Fault::Stop, Fault::ConnKill, Fault::BlackHole];

    /// Every fault, in report order.
    pub const ALL: [Fault; 15] = [
        Fault::Kill,
        Fault::Stop,
        Fault::ConnKill,
        Fault::Steal,
        Fault::Latency,
        Fault::BlackHole,
        Fault::BlackHoleConn,
        Fault::Reset,
        Fault::LateRelease,
        Fault::Restart,
        Fault::RestartNoPersistence,
        Fault::MasterKill,
        Fault::LeaderKill,
        Fault::LeaderPause,
        Fault::Partition,
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
            Fault::BlackHoleConn => "black-hole-conn",
            Fault::Reset => "reset",
            Fault::LateRelease => "late-release",
            Fault::Restart => "restart",
            Fault::RestartNoPersistence => "restart-no-persistence",
            Fault::MasterKill => "master-kill",
            Fault::LeaderKill => "leader-kill",
            Fault::LeaderPause => "leader-pause",
            Fault::Partition => "partition",
        }
    }

    /// The documented variants of this fault, which injections take in
    /// turn (injection `k` is variant `k % len`): every run must land each at
    /// least once.
    pub fn variants(self) -> &'static [&'static str] {
        match self {
            Fault::Stop => &["pause 2.5 ttl", "pause 0.6–1.4 ttl"],
            Fault::Latency => &[
                "ttl/6 each way",
                "ttl/12 each way",
                "ttl/6 each way, holder's link only",
            ],
            Fault::Restart | Fault::RestartNoPersistence => &["down 1.5 ttl", "restarted at once"],
            Fault::MasterKill => &[
                "failover after the node timeout",
                "replica takes over at once",
            ],
            Fault::Partition => &["the leader", "a follower"],
            _ => &[""],
        }
    }

    /// Is this fault, on this backend, a *revocation*: the server itself
    /// ends the lease behind a live holder's back, which the holder can only
    /// learn at its next renewal? Two holders then believe they hold for up
    /// to one renewal period, and only fencing protects the resource.
    pub fn revokes(self, backend: BackendKind) -> bool {
        match self {
            Fault::Steal | Fault::RestartNoPersistence => true,
            // The promoted replica may not have the lock.
            Fault::MasterKill => true,
            // The session *is* the lock: when it ends, the lock is free.
            Fault::ConnKill | Fault::Reset | Fault::Restart => backend.advisory(),
            // etcd revokes leases its holders renewed through the new
            // leader: the resumed old leader's lessor still counts from the
            // last keep-alive *it* saw, finds the lease expired and proposes
            // its revocation, which the new leader commits (etcd issue
            // #15247; the leadership check of 3.4.28 / 3.5.11 narrows the
            // window, measured in docs/RELIABILITY.md). No client request
            // ends it, so no client can prevent it; what the suite requires
            // is the revocation's bound, counted from the resumption
            // ([`Fault::revoked_from`]).
            Fault::LeaderPause => backend == BackendKind::Etcd,
            _ => false,
        }
    }

    /// When a revocation by this fault can happen, for the bounds of
    /// [`Fault::revokes`]: at the injection, or, for `leader-pause`, up to
    /// its lifting (the resumed leader revokes).
    fn revoked_from(self, e: &Event) -> i64 {
        match self {
            Fault::LeaderPause => e.t_lifted.unwrap_or(e.t),
            _ => e.t,
        }
    }
}

impl Fault {
    /// Is the outcome of this fault reported as measured, with no required
    /// property but the fenced resource's own (no stale-fence write
    /// accepted)? Faults that lose keys the lease depends on: a restart
    /// without persistence, a failover to a replica that may lack them.
    pub fn reported_only(self) -> bool {
        matches!(self, Fault::RestartNoPersistence | Fault::MasterKill)
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
    /// Faults also run as *election scenarios* (contenders run
    /// `Lease::elect`), on every backend they apply to, when they are in
    /// [`faults`](Config::faults) too.
    pub elections: Vec<Fault>,
    /// Run only the election scenarios.
    pub elections_only: bool,
}

impl Config {
    /// The short run CI does: every backend × fault, injected once per
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
        }
    }

    /// The scenarios of this run: `(backend, fault, election)`, in report order.
    pub fn scenarios(&self) -> Vec<(BackendKind, Fault, bool)> {
        let mut out = Vec::new();
        for &backend in &self.backends {
            let faults = || {
                backend
                    .faults()
                    .into_iter()
                    .filter(|f| self.faults.contains(f))
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
            ..Self::short(worker_exe)
        }
    }

    /// Timing bound: takeover after the holder was killed.
    pub fn takeover_bound(&self, backend: BackendKind) -> Duration {
        match backend {
            // The lock ends with the session: one heartbeat at most.
            BackendKind::PgAdvisory | BackendKind::PgAdvisoryFenced => self.ttl / 3 + self.slack,
            BackendKind::Etcd => self.etcd_takeover_bound(),
            _ => self.ttl + self.ttl / 3 + self.slack,
        }
    }

    /// Timing bound: takeover after the holder was killed, on etcd. The
    /// etcd lease's TTL is the ttl rounded up to whole seconds (at least
    /// etcd's minimum, 1.5 election timeouts rounded up: 1 s here,
    /// [`lease::backend::Etcd::lease_ttl_secs`]), counted by the leader from
    /// the last keep-alive; the leader finds expired leases only when its
    /// check comes round ([`etcd::EXPIRY_CHECK`], 500 ms) and then revokes
    /// them through raft. So on top of the other backends' bound
    /// (`ttl + ttl/3`), the rounding and one expiry check.
    pub fn etcd_takeover_bound(&self) -> Duration {
        let etcd_ttl = Duration::from_secs(
            u64::try_from(lease::backend::Etcd::lease_ttl_secs(self.ttl)).unwrap_or(u64::MAX),
        );
        etcd_ttl.max(self.ttl) + self.ttl / 3 + etcd::EXPIRY_CHECK + self.slack
    }

    /// The longest overlap allowed where a revocation is noticed when it
    /// happens: `PgAdvisory` watches the connection that holds the lock, so
    /// the end of its session (`conn-kill`, `reset`, `restart`) reaches the
    /// holder at once, not at its next heartbeat.
    pub fn overlap_bound(&self, fault: Fault, backend: BackendKind) -> Duration {
        match fault {
            Fault::ConnKill | Fault::Reset | Fault::Restart if backend.advisory() => PROMPT_LOSS,
            _ => self.cancel_bound(),
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
        match backend {
            BackendKind::Etcd => self.etcd_reconnect_bound(),
            _ => self.reconnect_bound(),
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

/// The longest overlap between two holders of a `PgAdvisory` lock whose
/// holding session ended behind the first one's back
/// ([`Config::overlap_bound`]): the watch tells it in a few milliseconds.
pub const PROMPT_LOSS: Duration = Duration::from_millis(50);

/// One injection of a fault, as the nemesis did it.
#[derive(Debug, Clone, Default)]
struct Event {
    /// When the fault landed (µs).
    t: i64,
    /// When it was lifted (SIGCONT, heal, server up again, stalled bytes delivered).
    t_lifted: Option<i64>,
    /// The holder the fault was aimed at.
    victim: Option<String>,
    /// Which of [`Fault::variants`].
    variant: usize,
    /// Why the fault did not happen, as far as the nemesis could see (no
    /// connection killed or reset, nothing stalled, ...): then it is a miss.
    missed: Option<String>,
    /// Connections killed, reset or black-holed; rows or keys stolen.
    count: usize,
    /// How long the server was down (restarts).
    downtime: Option<Duration>,
    /// `late-release`: the victim's fence before and after it acquired again.
    fences: Option<(i64, i64)>,
    /// `black-hole-conn`: from the end of the victim's section to its next
    /// acquisition (`None`: not within the nemesis' wait).
    reacquired_after: Option<Option<Duration>>,
    /// `master-kill`: whether the replica had the victim's lock, and the
    /// fence counter at least at the victim's fence, when the master died.
    replicated: Option<(bool, bool)>,
}

/// The bulk strings of a run of Redis replies (`$-1`: `None`); other
/// replies (`+OK`) are skipped.
fn bulk_strings(reply: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    let mut lines = reply.split("\r\n");
    while let Some(line) = lines.next() {
        if line == "$-1" {
            out.push(None);
        } else if line.starts_with('$') {
            out.push(lines.next().map(str::to_owned));
        }
    }
    out
}

/// What one backend × fault showed.
#[derive(Debug, Clone)]
pub struct ScenarioResult {
    /// The backend.
    pub backend: BackendKind,
    /// The fault.
    pub fault: Fault,
    /// An election scenario: the contenders ran `Lease::elect`.
    pub election: bool,
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
    /// Writes rejected although the writer's lease was valid from before
    /// the write until after it returned.
    pub valid_rejected: usize,
    /// Acquisitions whose fence was not larger than an earlier holder's.
    pub fence_reissues: usize,
    /// Connections killed, reset or black-holed (summed over the injections).
    pub connections: usize,
    /// `late-release`: stalled releases delivered after the same holder's
    /// newer acquisition, and how many of those newer leases were kept.
    pub late_releases: (usize, usize),
    /// `black-hole-conn`: per landed injection, the time from the end of the
    /// victim's section to its next acquisition (`None`: it did not acquire).
    pub reacquires: Vec<Option<Duration>>,
    /// Landed injections per variant ([`Fault::variants`]), and how many of
    /// them cost the victim its lease.
    pub variants: Vec<(u32, u32)>,
    /// Why the missed injections missed.
    pub miss_reasons: Vec<String>,
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
    /// Server downtime per restart; `master-kill`: from the kill until the
    /// cluster served the slot again (the failover).
    pub downtimes: Vec<Duration>,
    /// The length of every overlap counted in [`overlaps`](ScenarioResult::overlaps).
    pub overlap_lengths: Vec<Duration>,
    /// `master-kill`, per landed injection: whether the replica had the
    /// victim's lock, and the fence counter up to the victim's fence, when
    /// the master died.
    pub replicated: Vec<(bool, bool)>,
    /// Required properties that did not hold.
    pub failures: Vec<String>,
    /// One injection drawn (`None`: none landed); the report writes it
    /// to `img/` beside itself.
    pub timeline: Option<crate::plots::Timeline>,
}

impl ScenarioResult {
    /// The fault's name, and `(election)` for an election scenario.
    pub fn fault_label(&self) -> String {
        if self.election {
            format!("{} (election)", self.fault.as_str())
        } else {
            self.fault.as_str().to_owned()
        }
    }

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
    redis_cluster: Option<RedisCluster>,
    etcd: Option<etcd::Cluster>,
}

async fn run_with(config: &Config, checker: &Checker, prefix: &str) -> Result<Report, RunError> {
    let unavailable = RunError::Unavailable;
    let wants = |b: BackendKind| config.backends.contains(&b);
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
        if backend == BackendKind::Etcd {
            let cluster = servers
                .etcd
                .as_mut()
                .ok_or_else(|| RunError::Failed("BUG: no etcd cluster".to_owned()))?;
            // One cluster for the run: every fault leaves it healthy again.
            cluster
                .ensure_healthy()
                .await
                .map_err(|e| RunError::Failed(format!("etcd before {}: {e}", fault.as_str())))?;
            let began = Instant::now();
            let target = Target::Etcd(cluster);
            let result =
                run_scenario(config, backend, fault, election, target, checker, prefix).await?;
            progress(config, &result, began);
            results.push(result);
            continue;
        }
        {
            let target = match (backend, fault) {
                (
                    BackendKind::PgTable | BackendKind::PgAdvisory | BackendKind::PgAdvisoryFenced,
                    _,
                ) => servers.pg.as_mut().map(Target::Server),
                (BackendKind::MySqlTable, _) => servers.mariadb.as_mut().map(Target::Server),
                (BackendKind::Redis, Fault::RestartNoPersistence) => {
                    servers.redis_volatile.as_mut().map(Target::Server)
                }
                (BackendKind::Redis, _) => servers.redis.as_mut().map(Target::Server),
                (BackendKind::RedisCluster, _) => {
                    servers.redis_cluster.as_mut().map(Target::Cluster)
                }
                (BackendKind::Etcd, _) => None,
            }
            .ok_or_else(|| RunError::Failed("BUG: no server for a backend".to_owned()))?;
            let began = Instant::now();
            let result =
                run_scenario(config, backend, fault, election, target, checker, prefix).await?;
            progress(config, &result, began);
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

/// Run one scenario on `target` and analyse it.
async fn run_scenario(
    config: &Config,
    backend: BackendKind,
    fault: Fault,
    election: bool,
    target: Target<'_>,
    checker: &Checker,
    prefix: &str,
) -> Result<ScenarioResult, RunError> {
    let mut scenario =
        Scenario::new(config, backend, fault, election, target, checker, prefix).await?;
    let outcome = scenario.run().await;
    scenario.shutdown().await;
    match outcome {
        Ok(events) => scenario.analyse(&events).await,
        Err(e) => Err(RunError::Failed(format!(
            "{}/{}: {e}",
            backend.as_str(),
            result_label(fault, election)
        ))),
    }
}

/// The progress line of a scenario (if [`Config::progress`]).
fn progress(config: &Config, result: &ScenarioResult, began: Instant) {
    if config.progress {
        println!(
            "fault-suite: {:<12} {:<23} {:>5.1}s  hits {} sections {} overlaps {} stale {}{}",
            result.backend.as_str(),
            result_label(result.fault, result.election),
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
}

/// What a scenario faults: one private server, a Redis Cluster, or the
/// etcd cluster.
enum Target<'a> {
    /// One private server.
    Server(&'a mut PrivateServer),
    /// A private Redis Cluster (the contenders connect to its nodes).
    Cluster(&'a mut RedisCluster),
    /// The run's etcd cluster.
    Etcd(&'a mut etcd::Cluster),
}

/// `fault`, and `(election)` for an election scenario.
fn result_label(fault: Fault, election: bool) -> String {
    if election {
        format!("{} (election)", fault.as_str())
    } else {
        fault.as_str().to_owned()
    }
}

/// What the orchestrator knows about one contender, from its stdout.
#[derive(Debug, Default)]
struct Seen {
    holding_since: Option<Instant>,
    /// Answer to the last `hold`: Some(true) = HOLDING.
    hold_reply: Option<bool>,
    wakes: u32,
    acquisitions: u64,
    /// The fence of the last acquisition.
    fence: i64,
    /// Releases, and the last one's `(sent, done, confirmed)`.
    releases: u64,
    last_release: Option<(i64, i64, bool)>,
    /// Said `RELEASING` (after `end-gated`) and waits for `go`.
    releasing: bool,
    /// The current section is over (`ENDED`), its release not yet done.
    section_over: bool,
    /// Said `YIELDED` since the last `yield`.
    yielded: bool,
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

/// [`executes`] for the lease `name`: on etcd, a chunk that carries a
/// request naming the lease's key (`lease/{name}`) — a transaction:
/// acquire, release, read. The HTTP/2 frames of gRPC compress their
/// headers, so the method is not in the bytes; the keep-alives and
/// revocations name only an etcd lease id, and the contenders' HTTP/2
/// pings nothing.
fn executes_on(backend: BackendKind, name: &str, bytes: &[u8]) -> bool {
    if backend == BackendKind::Etcd {
        let key = format!("lease/{name}");
        return bytes
            .windows(key.len())
            .any(|window| window == key.as_bytes());
    }
    executes(backend, bytes)
}

/// Does this chunk a client sent make the server run a statement (or
/// script)? What `late-release` stalls: not the pings that pools send on
/// their own (a PostgreSQL `Sync`, a MySQL `COM_PING`, deadpool-redis'
/// `UNWATCH` and `PING`), and not the preparation of a statement — its first
/// use on a connection sends only its `Parse` (PostgreSQL) or
/// `COM_STMT_PREPARE` (MySQL) and waits for the answer before it sends the
/// statement itself, so a stalled preparation would keep the release from
/// ever reaching the server.
fn executes(backend: BackendKind, bytes: &[u8]) -> bool {
    match backend {
        BackendKind::PgTable | BackendKind::PgAdvisory | BackendKind::PgAdvisoryFenced => {
            // Messages: a type byte and a length (big-endian, counting itself).
            let mut at = 0;
            while at + 5 <= bytes.len() {
                if matches!(bytes[at], b'E' | b'Q') {
                    return true;
                }
                let len = u32::from_be_bytes([
                    bytes[at + 1],
                    bytes[at + 2],
                    bytes[at + 3],
                    bytes[at + 4],
                ]);
                at += 1 + usize::try_from(len).unwrap_or(usize::MAX).max(4);
            }
            false
        }
        BackendKind::MySqlTable => {
            // Packets: a 3-byte length, a sequence number, then the command.
            let mut at = 0;
            while at + 5 <= bytes.len() {
                let len = usize::from(bytes[at])
                    | usize::from(bytes[at + 1]) << 8
                    | usize::from(bytes[at + 2]) << 16;
                // COM_QUERY, COM_STMT_EXECUTE.
                if bytes[at + 3] == 0 && matches!(bytes[at + 4], 0x03 | 0x17) {
                    return true;
                }
                at += 4 + len;
            }
            false
        }
        BackendKind::Redis => {
            let text = String::from_utf8_lossy(bytes).to_ascii_uppercase();
            text.contains("\r\nEVALSHA\r\n") || text.contains("\r\nEVAL\r\n")
        }
        // No proxy between the contenders and the cluster.
        BackendKind::RedisCluster => false,
        // Needs the lease's name: see `executes_on`.
        BackendKind::Etcd => false,
    }
}

struct Scenario<'a> {
    config: &'a Config,
    backend: BackendKind,
    fault: Fault,
    /// The contenders run `Lease::elect`.
    election: bool,
    target: Target<'a>,
    checker: &'a Checker,
    prefix: &'a str,
    key: String,
    name: String,
    proxies: Vec<FaultProxy>,
    workers: Vec<Worker>,
    generation: usize,
    /// Holders killed by the nemesis, and when the kill was reaped (the
    /// latest instant at which they could have acted).
    killed: HashMap<String, i64>,
    /// The slot (and so the proxy) of every holder.
    slots: HashMap<String, usize>,
    /// When every contender process was started (for the timelines).
    started: HashMap<String, i64>,
}

impl<'a> Scenario<'a> {
    async fn new(
        config: &'a Config,
        backend: BackendKind,
        fault: Fault,
        election: bool,
        target: Target<'a>,
        checker: &'a Checker,
        prefix: &'a str,
    ) -> Result<Scenario<'a>, RunError> {
        let key = format!(
            "{}/{}",
            backend.as_str(),
            result_label(fault, election).replace(' ', "-")
        );
        checker
            .add_resource(&key)
            .await
            .map_err(|e| RunError::Failed(format!("checker: {e}")))?;
        let mut proxies = Vec::new();
        for _ in 0..config.workers {
            // A contender's link: to the server, or to every member.
            let proxy = match &target {
                Target::Server(server) => FaultProxy::start(server.addr()).await,
                // Unused: the contenders connect to the nodes themselves.
                Target::Cluster(cluster) => {
                    FaultProxy::start(std::net::SocketAddr::from((
                        [127, 0, 0, 1],
                        cluster.ports()[0],
                    )))
                    .await
                }
                Target::Etcd(cluster) => FaultProxy::start_many(&cluster.client_addrs()).await,
            };
            // When each answer left the server: where a grant's validity starts.
            proxy.record_replies();
            proxies.push(proxy);
        }
        let mut scenario = Scenario {
            config,
            backend,
            fault,
            election,
            target,
            checker,
            prefix,
            key,
            name: crate::unique("faults"),
            proxies,
            workers: Vec::new(),
            generation: 0,
            killed: HashMap::new(),
            slots: HashMap::new(),
            started: HashMap::new(),
        };
        for slot in 0..config.workers {
            let worker = scenario.spawn(slot).map_err(RunError::Failed)?;
            scenario.workers.push(worker);
        }
        Ok(scenario)
    }

    /// The private server (every backend but etcd).
    fn server(&self) -> Result<&PrivateServer, String> {
        match &self.target {
            Target::Server(server) => Ok(server),
            Target::Cluster(_) | Target::Etcd(_) => {
                Err("this fault needs a single server".to_owned())
            }
        }
    }

    /// The etcd cluster.
    fn cluster(&mut self) -> Result<&mut etcd::Cluster, String> {
        match &mut self.target {
            Target::Etcd(cluster) => Ok(cluster),
            Target::Server(_) | Target::Cluster(_) => {
                Err("BUG: no etcd cluster for this backend".to_owned())
            }
        }
    }

    fn spawn(&mut self, slot: usize) -> Result<Worker, String> {
        self.generation += 1;
        let holder = format!(
            "{}-{}-w{slot}-{}",
            self.backend.as_str(),
            self.fault.as_str(),
            self.generation
        );
        self.slots.insert(holder.clone(), slot);
        self.started.insert(holder.clone(), monotonic_us());
        let port = self.proxies[slot].addr().port();
        let url = match (self.backend, &self.target) {
            (_, Target::Cluster(cluster)) => cluster.nodes().join(","),
            (BackendKind::MySqlTable, _) => format!("mysql://w{slot}@127.0.0.1:{port}/test"),
            // Every member, through the contender's proxy.
            (_, Target::Etcd(_)) => self.proxies[slot]
                .addrs()
                .iter()
                .map(|a| format!("http://{a}"))
                .collect::<Vec<_>>()
                .join(","),
            (_, Target::Server(server)) => server.url_at(port),
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
            self.election,
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
                let mut words = line.split_whitespace();
                let mut number = || words.next().and_then(|w| w.parse::<i64>().ok());
                match line.split_whitespace().next() {
                    Some("ACQ") => {
                        number();
                        seen.fence = number().unwrap_or(0);
                        seen.holding_since = Some(Instant::now());
                        seen.section_over = false;
                        seen.acquisitions += 1;
                    }
                    Some("REL") => {
                        number();
                        let (sent, done) = (number().unwrap_or(0), number().unwrap_or(0));
                        seen.last_release = Some((sent, done, line.ends_with(" ok")));
                        seen.releases += 1;
                        seen.holding_since = None;
                        seen.releasing = false;
                    }
                    Some("HOLDING") => seen.hold_reply = Some(true),
                    Some("IDLE") => seen.hold_reply = Some(false),
                    Some("WAKE") => seen.wakes += 1,
                    Some("RELEASING") => seen.releasing = true,
                    Some("ENDED") => seen.section_over = true,
                    Some("YIELDED") => seen.yielded = true,
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
            // Not one whose section is over and whose release is under way:
            // it still counts as holding until the release is done, but it
            // would answer every `hold` with IDLE.
            if let Some(slot) = self.workers.iter().position(|w| {
                let seen = w.seen();
                !seen.section_over
                    && seen
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
            // Its section was ending: give the next one a moment to start.
            tokio::time::sleep(Duration::from_millis(20)).await;
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

    /// Wait, for at most `limit`, until `condition` holds of the contender in `slot`.
    async fn wait_for(
        &self,
        slot: usize,
        limit: Duration,
        condition: impl Fn(&Seen) -> bool,
    ) -> bool {
        let limit = Instant::now() + limit;
        while Instant::now() < limit {
            if condition(&self.workers[slot].seen()) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    /// Have every contender but the one in `slot` stop acquiring (for at
    /// most 30 s), and wait until none of theirs is under way (a section
    /// they are in ends first: at most 2 s and its release).
    async fn hold_back_others(&mut self, slot: usize) -> Result<(), String> {
        for (i, worker) in self.workers.iter_mut().enumerate() {
            if i != slot {
                worker.seen().yielded = false;
                worker.send("yield 30000").await;
            }
        }
        for i in (0..self.workers.len()).filter(|&i| i != slot) {
            if !self
                .wait_for(i, Duration::from_secs(4), |s| s.yielded)
                .await
            {
                return Err(format!(
                    "contender {} did not yield",
                    self.workers[i].holder
                ));
            }
        }
        Ok(())
    }

    /// Let every contender acquire again.
    async fn let_others_go(&mut self) {
        for worker in &mut self.workers {
            worker.send("yield 0").await;
        }
    }

    /// Wait until no request of the contender in `slot` is under way and
    /// its next renewal is not due soon: its proxy has been quiet for 15 ms,
    /// but saw traffic (a renewal) within the last ttl/6. Renewals come every
    /// ttl/3, so the next one is at least ttl/6 away.
    async fn wait_quiet(&self, slot: usize) -> bool {
        let proxy = &self.proxies[slot];
        let recent = us(self.config.ttl / 6);
        let limit = Instant::now() + self.config.ttl * 2;
        while Instant::now() < limit {
            let idle = monotonic_us() - proxy.last_activity_us();
            if (15_000..=recent).contains(&idle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        false
    }

    async fn run(&mut self) -> Result<Vec<Event>, String> {
        let ttl = self.config.ttl;
        let mut events = Vec::new();
        self.wait_holder().await?;
        for k in 0..self.config.injections_for(self.fault) {
            events.extend(self.inject(k).await?);
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

    /// Inject the fault (its `k`-th time); the events it made (more than one
    /// where the nemesis tries again after a miss).
    async fn inject(&mut self, k: u32) -> Result<Vec<Event>, String> {
        let ttl = self.config.ttl;
        let variant = usize::try_from(k).unwrap_or(0) % self.fault.variants().len();
        let mut event = Event {
            variant,
            ..Event::default()
        };
        match self.fault {
            Fault::Kill => {
                // Held, like every victim: a section that ended between
                // choosing the victim and killing it would be a miss by chance.
                let slot = self.victim(ttl * 3).await?;
                let victim = self.workers[slot].holder.clone();
                event.t = monotonic_us();
                let _ = self.workers[slot].child.start_kill();
                let _ = self.workers[slot].child.wait().await;
                // Reaped: it cannot have acted after this. It died earlier:
                // no later than the last of its connections that closed
                // after the SIGKILL (the kernel closes them at its exit; a
                // lock that ends with the session, PgAdvisory's, is free
                // only after the server saw that close). The reaping alone
                // can come milliseconds later on a busy machine, and a
                // contender's grant in between is no overlap.
                let reaped = monotonic_us();
                let died = self.proxies[slot]
                    .client_closes_between(event.t, reaped)
                    .into_iter()
                    .max()
                    .unwrap_or(reaped);
                self.killed.insert(victim.clone(), died);
                self.workers[slot] = self.spawn(slot)?;
                self.wait_takeover(&victim, ttl * 3).await;
                event.victim = Some(victim);
            }
            Fault::Stop => return self.pauses(event).await,
            Fault::ConnKill => {
                let slot = self.victim(ttl * 3).await?;
                let victim = self.workers[slot].holder.clone();
                event.t = monotonic_us();
                event.count = self.kill_connections(slot, &victim).await?;
                if event.count == 0 {
                    event.missed = Some("no connection of the holder was killed".to_owned());
                }
                event.victim = Some(victim);
                tokio::time::sleep(ttl * 2).await;
            }
            Fault::Steal => {
                let slot = self.victim(ttl * 3).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = monotonic_us();
                event.count = self.steal().await?;
                if event.count == 0 {
                    event.missed = Some("no live lease on the server to steal".to_owned());
                }
                tokio::time::sleep(ttl * 2).await;
            }
            Fault::Latency => {
                let slot = self.victim(ttl * 4).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = monotonic_us();
                let delay = if variant == 1 { ttl / 12 } else { ttl / 6 };
                for (i, proxy) in self.proxies.iter().enumerate() {
                    if variant != 2 || i == slot {
                        proxy.set_mode(Mode::Delay(delay));
                    }
                }
                tokio::time::sleep(ttl * 3).await;
                for proxy in &self.proxies {
                    proxy.set_mode(Mode::Pass);
                }
                event.t_lifted = Some(monotonic_us());
                tokio::time::sleep(ttl / 2).await;
            }
            Fault::BlackHole => {
                let slot = self.victim(ttl * 5).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = monotonic_us();
                self.proxies[slot].set_mode(Mode::BlackHole);
                tokio::time::sleep(ttl * 2).await;
                self.proxies[slot].set_mode(Mode::Pass);
                event.t_lifted = Some(monotonic_us());
                tokio::time::sleep(ttl).await;
            }
            Fault::BlackHoleConn => {
                return self.black_hole_connections(event).await.map(|e| vec![e]);
            }
            Fault::Reset => {
                let slot = self.victim(ttl * 3).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = monotonic_us();
                if !breaks::on("kill-nothing") {
                    for (i, proxy) in self.proxies.iter().enumerate() {
                        let reset = proxy.reset();
                        if i == slot {
                            event.count = reset;
                        }
                    }
                }
                if event.count == 0 {
                    event.missed = Some("no connection of the holder was reset".to_owned());
                }
                tokio::time::sleep(ttl * 2).await;
            }
            Fault::LateRelease => return self.late_releases().await,
            Fault::MasterKill => return self.master_kill(event).await.map(|e| vec![e]),
            Fault::LeaderKill | Fault::LeaderPause | Fault::Partition => {
                self.member_fault(&mut event).await?;
            }
            Fault::Restart | Fault::RestartNoPersistence => {
                let slot = self.victim(ttl * 4).await?;
                event.victim = Some(self.workers[slot].holder.clone());
                event.t = monotonic_us();
                let down = if variant == 0 {
                    ttl * 3 / 2
                } else {
                    Duration::ZERO
                };
                let down = match &mut self.target {
                    Target::Server(server) => server.restart_after(down).await?,
                    // Every member crashes (SIGKILL) and restarts.
                    Target::Etcd(cluster) => cluster.crash_all(down).await?,
                    Target::Cluster(_) => {
                        return Err("BUG: restart is not run on the Redis Cluster".to_owned());
                    }
                };
                event.downtime = Some(down);
                event.t_lifted = Some(monotonic_us());
                tokio::time::sleep(ttl * 2).await;
            }
        }
        Ok(vec![event])
    }

    /// The faults of an etcd member ([`Fault::LeaderKill`],
    /// [`Fault::LeaderPause`], [`Fault::Partition`]), while a contender
    /// holds (and keeps holding through the fault); the cluster is healthy
    /// again (every member up and in touch) when this returns.
    async fn member_fault(&mut self, event: &mut Event) -> Result<(), String> {
        let ttl = self.config.ttl;
        let fault = self.fault;
        let slot = self.victim(ttl * 6).await?;
        event.victim = Some(self.workers[slot].holder.clone());
        let cluster = self.cluster()?;
        let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
        // Longer than an election timeout: the others elect a new leader.
        let cut = etcd::ELECTION_TIMEOUT * 3;
        event.t = monotonic_us();
        match fault {
            Fault::LeaderKill => {
                cluster.kill(leader);
                tokio::time::sleep(ttl * 2).await;
                cluster.restart(leader).await?;
            }
            Fault::LeaderPause => {
                cluster.pause(leader);
                tracing::info!(leader, "paused the leader member");
                tokio::time::sleep(cut).await;
                cluster.resume(leader);
                tracing::info!(leader, "resumed the leader member");
            }
            _ => {
                let member = if event.variant == 0 {
                    leader
                } else {
                    (leader + 1) % cluster.len()
                };
                cluster.partition(member);
                tokio::time::sleep(cut).await;
                cluster.heal();
            }
        }
        event.t_lifted = Some(monotonic_us());
        event.count = 1;
        let cluster = self.cluster()?;
        cluster.ensure_healthy().await?;
        tokio::time::sleep(ttl).await;
        Ok(())
    }

    /// `stop`: SIGSTOP the holder, SIGCONT it after the variant's pause.
    /// Variant 0 pauses 2.5 ttl, so that the lease has surely expired and
    /// been taken over, and is tried up to three times until the victim
    /// wakes *in its section*: under load, a section can end (its lease
    /// lost to a late renewal) between choosing the victim and the pause,
    /// and such a pause shows nothing. Variant 1 pauses 0.6 to 1.4 ttl,
    /// around the holder's local deadline; either outcome shows something.
    async fn pauses(&mut self, event: Event) -> Result<Vec<Event>, String> {
        let ttl = self.config.ttl;
        let long = event.variant == 0;
        let mut events = Vec::new();
        for _ in 0..3 {
            let mut event = Event {
                variant: event.variant,
                ..Event::default()
            };
            let slot = self.victim(ttl * 10).await?;
            let pid = self.workers[slot].child.id().ok_or("victim gone")?;
            let wakes = self.workers[slot].seen().wakes;
            event.victim = Some(self.workers[slot].holder.clone());
            let pause = if long {
                ttl * 5 / 2
            } else {
                ttl.mul_f64(0.6 + 0.8 * fraction())
            };
            event.t = monotonic_us();
            signal(pid, "STOP");
            tokio::time::sleep(pause).await;
            signal(pid, "CONT");
            event.t_lifted = Some(monotonic_us());
            if !long {
                tokio::time::sleep(ttl).await;
                events.push(event);
                break;
            }
            let limit = Instant::now() + Duration::from_secs(5);
            while Instant::now() < limit && self.workers[slot].seen().wakes == wakes {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let woke = self.workers[slot].seen().wakes != wakes;
            if !woke {
                event.missed = Some("the victim's section had ended before the pause".to_owned());
            }
            events.push(event);
            if woke {
                break;
            }
            // Let the contenders settle before trying again.
            for worker in &mut self.workers {
                worker.send("hold 0").await;
            }
            tokio::time::sleep(ttl).await;
        }
        Ok(events)
    }

    /// `late-release`, tried up to three times until it happens: the
    /// holder's release is stalled in the network, the same holder acquires
    /// the name again, then the stalled release is delivered.
    async fn late_releases(&mut self) -> Result<Vec<Event>, String> {
        let ttl = self.config.ttl;
        // Statements get prepared (and Redis scripts loaded) by their first
        // use: let a few releases happen first, so that a stalled release is
        // the statement itself, not its preparation.
        let limit = Instant::now() + ttl * 15;
        while self.workers.iter().map(|w| w.seen().releases).sum::<u64>() < 3
            && Instant::now() < limit
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut events = Vec::new();
        for _ in 0..3 {
            let event = self.late_release().await?;
            let happened = event.missed.is_none();
            events.push(event);
            if happened {
                break;
            }
        }
        Ok(events)
    }

    async fn late_release(&mut self) -> Result<Event, String> {
        let ttl = self.config.ttl;
        let mut event = Event::default();
        let slot = self.victim(ttl * 10).await?;
        let victim = self.workers[slot].holder.clone();
        event.victim = Some(victim.clone());
        let (old_fence, acquisitions) = {
            let seen = self.workers[slot].seen();
            (seen.fence, seen.acquisitions)
        };
        // Nobody else may take the name: the same holder must get it back.
        self.hold_back_others(slot).await?;
        // A request under way now (a renewal, or the ping after it) would
        // run into the stall instead of the release. Best effort: what was
        // stalled is checked below.
        self.wait_quiet(slot).await;
        self.workers[slot].send("end-gated").await;
        if !self
            .wait_for(slot, Duration::from_secs(3), |s| s.releasing)
            .await
        {
            return Err(format!("{victim} did not get ready to release"));
        }
        event.t = monotonic_us();
        let backend = self.backend;
        let name = self.name.clone();
        self.proxies[slot].stall_requests(move |chunk| executes_on(backend, &name, chunk));
        self.workers[slot].send("go").await;
        // The release gives up (or, on Redis, is retried on a new
        // connection); the engine keeps the name for a ttl after an
        // unconfirmed release; then the holder acquires it again.
        let released = self
            .wait_for(slot, ttl * 3, |s| {
                s.last_release.is_some_and(|(sent, _, _)| sent >= event.t)
            })
            .await;
        let acquired = self
            .wait_for(slot, ttl * 4, |s| s.acquisitions > acquisitions)
            .await;
        if acquired {
            // Keep the newer lease while the old release lands.
            self.workers[slot]
                .send(&format!("hold {}", (ttl * 3).as_millis()))
                .await;
        }
        let new_fence = self.workers[slot].seen().fence;
        let held = self.proxies[slot].deliver_stalled();
        event.t_lifted = Some(monotonic_us());
        // The others contend again: if the late release ended the newer
        // lease, one of them takes it while the holder still believes.
        self.let_others_go().await;
        let release = self.workers[slot].seen().last_release;
        let landed = |r: &StalledRequest| {
            release.is_some_and(|(sent, done, _)| sent <= r.first_at_us && r.first_at_us <= done)
                && executes_on(self.backend, &self.name, &r.bytes)
        };
        event.count = held.iter().filter(|r| landed(r)).count();
        if event.missed.is_none() {
            event.missed = if !released {
                Some("the holder did not release".to_owned())
            } else if !acquired {
                Some("the holder did not acquire again".to_owned())
            } else if event.count == 0 {
                Some(format!(
                    "no release was stalled ({} connection(s) held other requests)",
                    held.len()
                ))
            } else {
                None
            };
        }
        event.fences = Some((old_fence, new_fence));
        tokio::time::sleep(ttl * 2).await;
        Ok(event)
    }

    /// `black-hole-conn`: the holder's established connections go silent
    /// for good; then, with the others held back, it ends its section and
    /// must acquire again.
    async fn black_hole_connections(&mut self, mut event: Event) -> Result<Event, String> {
        let ttl = self.config.ttl;
        let slot = self.victim(ttl * 10).await?;
        event.victim = Some(self.workers[slot].holder.clone());
        event.t = monotonic_us();
        event.count = self.proxies[slot].black_hole_open();
        if event.count == 0 {
            event.missed = Some("the holder had no connection open".to_owned());
        }
        // Kept, or lost at the deadline and taken over by another.
        tokio::time::sleep(ttl * 2).await;
        self.hold_back_others(slot).await?;
        let acquisitions = self.workers[slot].seen().acquisitions;
        let ended = Instant::now();
        self.workers[slot].send("end").await;
        let wait = (ttl * 4).max(self.config.reconnect_bound_of(self.backend) + ttl);
        let acquired = self
            .wait_for(slot, wait, |s| s.acquisitions > acquisitions)
            .await;
        event.reacquired_after = Some(acquired.then(|| ended.elapsed()));
        event.t_lifted = Some(monotonic_us());
        self.let_others_go().await;
        tokio::time::sleep(ttl).await;
        Ok(event)
    }

    /// Kill every server connection of the holder in `slot`; how many were killed.
    async fn kill_connections(&self, slot: usize, holder: &str) -> Result<usize, String> {
        let err = |e: &dyn std::fmt::Display| format!("kill connections: {e}");
        // The `kill-nothing` break aims at nobody.
        let (holder, user) = if breaks::on("kill-nothing") {
            ("nobody".to_owned(), "nobody".to_owned())
        } else {
            (holder.to_owned(), format!("w{slot}"))
        };
        let killed = match self.backend {
            // etcd has no call to end a client's connections: the
            // contender's connections (to every member) are reset in its
            // proxy instead, a TCP RST to both ends.
            BackendKind::Etcd if breaks::on("kill-nothing") => 0,
            BackendKind::Etcd => self.proxies[slot].reset(),
            BackendKind::PgTable | BackendKind::PgAdvisory | BackendKind::PgAdvisoryFenced => {
                let mut conn = sqlx::PgConnection::connect(&self.server()?.url())
                    .await
                    .map_err(|e| err(&e))?;
                let killed: i64 = sqlx::query_scalar(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) \
                     FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(&holder)
                .fetch_one(&mut conn)
                .await
                .map_err(|e| err(&e))?;
                let _ = conn.close().await;
                usize::try_from(killed).unwrap_or(0)
            }
            BackendKind::MySqlTable => {
                let mut conn = sqlx::MySqlConnection::connect(&self.server()?.url())
                    .await
                    .map_err(|e| err(&e))?;
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST WHERE USER = ?",
                )
                .bind(&user)
                .fetch_all(&mut conn)
                .await
                .map_err(|e| err(&e))?;
                let mut killed = 0;
                for id in ids {
                    let kill = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                        .execute(&mut conn)
                        .await;
                    killed += usize::from(kill.is_ok());
                }
                let _ = conn.close().await;
                killed
            }
            BackendKind::Redis => {
                let client = redis::Client::open(self.server()?.url()).map_err(|e| err(&e))?;
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
                let mut killed = 0;
                for line in list.lines().filter(|l| l.split(' ').any(|f| f == name)) {
                    if let Some(id) = line.split(' ').find_map(|f| f.strip_prefix("id=")) {
                        let kill: Result<i64, _> = redis::cmd("CLIENT")
                            .arg("KILL")
                            .arg("ID")
                            .arg(id)
                            .query_async(&mut conn)
                            .await;
                        killed += usize::try_from(kill.unwrap_or(0)).unwrap_or(0);
                    }
                }
                killed
            }
            BackendKind::RedisCluster => return Err("no conn-kill on the Redis Cluster".to_owned()),
        };
        Ok(killed)
    }

    /// The private server of the scenario (not a cluster).
    /// `master-kill`: `SIGKILL` of the master of the lease's hash slot
    /// while the victim holds the lease; what its replica had of the lock
    /// and the fence counter at that moment (read from the replica at
    /// once); the replica takes over (variant 0: by the cluster, after the
    /// node timeout; variant 1: at once, `CLUSTER FAILOVER TAKEOVER`); then
    /// the killed node starts again and rejoins as a replica.
    async fn master_kill(&mut self, mut event: Event) -> Result<Event, String> {
        let ttl = self.config.ttl;
        let slot = self.victim(ttl * 10).await?;
        let victim = self.workers[slot].holder.clone();
        let fence = self.workers[slot].seen().fence;
        event.victim = Some(victim.clone());
        let lock = {
            let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .map_err(|e| e.to_string())?;
            Redis::new(pool).lock_key(&self.name)
        };
        let Target::Cluster(cluster) = &mut self.target else {
            return Err("master-kill needs a Redis Cluster".to_owned());
        };
        use tokio::task::block_in_place as block;
        let hash_slot = block(|| cluster.keyslot(&lock))?;
        let master = block(|| cluster.master_of(hash_slot))
            .ok_or(format!("no master serves the slot {hash_slot}"))?;
        let replica = *block(|| cluster.replicas_of(master))
            .first()
            .ok_or(format!("the master of the slot {hash_slot} has no replica"))?;
        event.t = monotonic_us();
        block(|| cluster.kill(master));
        // What replication had delivered when the master died.
        let reply = block(|| {
            cluster.command(
                replica,
                &format!("READONLY\r\nGET {lock}\r\nGET {lock}:fence"),
            )
        });
        let values = bulk_strings(&reply);
        let had_lock = values.first().cloned().flatten() == Some(format!("{fence}:{victim}"));
        let counter = values
            .get(1)
            .cloned()
            .flatten()
            .and_then(|c| c.parse::<i64>().ok())
            .unwrap_or(0);
        if event.variant == 1 {
            block(|| cluster.command(replica, "CLUSTER FAILOVER TAKEOVER"));
        }
        let limit = Instant::now() + Duration::from_secs(30);
        loop {
            let now_master = block(|| cluster.master_of(hash_slot));
            if now_master.is_some_and(|m| m != master) {
                break;
            }
            if Instant::now() > limit {
                return Err(format!(
                    "no replica took over the slot {hash_slot} within 30 s"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        block(|| cluster.wait_ok(Duration::from_secs(30)))?;
        let failover = dur(monotonic_us() - event.t);
        block(|| cluster.restart(master))?;
        let limit = Instant::now() + Duration::from_secs(30);
        // Rejoined as the new master's replica, and in sync with it (so
        // that the next injection finds a replica with the data).
        while !block(|| cluster.replicas_of(replica)).contains(&master)
            || !block(|| cluster.command(master, "INFO replication"))
                .contains("master_link_status:up")
        {
            if Instant::now() > limit {
                return Err("the killed master did not rejoin as a replica within 30 s".to_owned());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        block(|| cluster.wait_ok(Duration::from_secs(30)))?;
        event.t_lifted = Some(monotonic_us());
        event.downtime = Some(failover);
        event.replicated = Some((had_lock, counter >= fence));
        tokio::time::sleep(ttl * 2).await;
        Ok(event)
    }

    /// End the lease on the server, behind its holder's back; how many
    /// live leases (rows, keys) it ended.
    async fn steal(&self) -> Result<usize, String> {
        let err = |e: &dyn std::fmt::Display| format!("steal: {e}");
        let stolen = match self.backend {
            BackendKind::PgTable => {
                let mut conn = sqlx::PgConnection::connect(&self.server()?.url())
                    .await
                    .map_err(|e| err(&e))?;
                let done = sqlx::query(
                    "UPDATE task_leases SET expires_at = clock_timestamp() \
                     WHERE name = $1 AND expires_at > clock_timestamp()",
                )
                .bind(&self.name)
                .execute(&mut conn)
                .await
                .map_err(|e| err(&e))?;
                let _ = conn.close().await;
                done.rows_affected()
            }
            BackendKind::MySqlTable => {
                let mut conn = sqlx::MySqlConnection::connect(&self.server()?.url())
                    .await
                    .map_err(|e| err(&e))?;
                let done = sqlx::query(
                    "UPDATE task_leases SET expires_at = UTC_TIMESTAMP(6) \
                     WHERE name = ? AND expires_at > UTC_TIMESTAMP(6)",
                )
                .bind(self.name.as_bytes())
                .execute(&mut conn)
                .await
                .map_err(|e| err(&e))?;
                let _ = conn.close().await;
                done.rows_affected()
            }
            BackendKind::Redis => {
                let pool = deadpool_redis::Config::from_url(self.server()?.url())
                    .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                    .map_err(|e| err(&e))?;
                let key = Redis::new(pool.clone()).lock_key(&self.name);
                let mut conn = pool.get().await.map_err(|e| err(&e))?;
                let deleted: i64 = redis::cmd("DEL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| err(&e))?;
                u64::try_from(deleted).unwrap_or(0)
            }
            BackendKind::PgAdvisory | BackendKind::PgAdvisoryFenced => {
                return Err("no steal for advisory locks".to_owned());
            }
            BackendKind::RedisCluster => return Err("no steal on the Redis Cluster".to_owned()),
            // Revoke the key's etcd lease (etcd deletes the key with it):
            // deleting only the key would leave the holder's keep-alives
            // succeeding — see the `Etcd` docs, "Faults".
            BackendKind::Etcd => {
                let endpoints = match &self.target {
                    Target::Etcd(cluster) => cluster.endpoints(),
                    Target::Server(_) | Target::Cluster(_) => {
                        return Err("BUG: etcd without a cluster".to_owned());
                    }
                };
                let etcd = lease::backend::Etcd::connect(endpoints)
                    .await
                    .map_err(|e| err(&e))?;
                let mut client = etcd.client().clone();
                let kvs = client
                    .get(etcd.key(&self.name), None)
                    .await
                    .map_err(|e| err(&e))?
                    .take_kvs();
                let mut revoked = 0;
                for kv in kvs.iter().filter(|kv| kv.lease() != 0) {
                    revoked += u64::from(client.lease_revoke(kv.lease()).await.is_ok());
                }
                revoked
            }
        };
        Ok(usize::try_from(stolen).unwrap_or(usize::MAX))
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
        let mut sections = self.checker.sections(&self.key).await.map_err(failed)?;
        let writes = self.checker.writes(&self.key).await.map_err(failed)?;
        let resource = self.checker.resource(&self.key).await.map_err(failed)?;
        // A grant is valid from when its answer left the server — seen by
        // the contender's proxy before the contender got it (later, by the
        // proxy's delay under the latency fault).
        for s in &mut sections {
            if let Some(&slot) = self.slots.get(&s.holder) {
                s.t_granted = self.proxies[slot].last_reply_between(s.t_req, s.t_start);
            }
        }
        let mut result = analyse(
            self.config,
            self.backend,
            self.fault,
            &self.killed,
            events,
            &sections,
            &writes,
            &resource,
        );
        if self.election {
            result.election = true;
            leader_again(
                self.config,
                self.backend,
                &self.killed,
                events,
                &sections,
                &mut result,
            );
        }
        result.timeline = timeline::build(
            self.config.ttl,
            self.backend,
            self.fault,
            &self.started,
            &self.killed,
            events,
            &sections,
        );
        if let Some(t) = result.timeline.as_mut().filter(|_| result.election) {
            t.title.push_str(" (election)");
        }
        Ok(result)
    }
}

/// Election scenarios: after every landed injection, someone leads again
/// within [`Config::takeover_bound`] of the fault's end — a section other
/// than the victim's section at the fault is valid at some instant of that
/// window, or the victim's section is still valid at its end (the lease was
/// kept).
fn leader_again(
    config: &Config,
    backend: BackendKind,
    killed: &HashMap<String, i64>,
    events: &[Event],
    sections: &[Section],
    r: &mut ScenarioResult,
) {
    let bound = config.takeover_bound(backend);
    for e in events.iter().filter(|e| e.missed.is_none()) {
        let Some(victim) = e.victim.as_deref() else {
            continue;
        };
        let at_fault = section_at(sections, victim, e.t);
        let lifted = e.t_lifted.unwrap_or(e.t);
        let until = lifted + us(bound);
        let is_at_fault = |s: &Section| at_fault.is_some_and(|a| std::ptr::eq(a, s));
        let led = sections.iter().any(|s| {
            let Some(end) = valid_until(s, killed, config.ttl) else {
                return false;
            };
            if is_at_fault(s) {
                end >= until
            } else {
                valid_from(s) <= until && end >= e.t
            }
        });
        if !led {
            r.failures.push(format!(
                "election: nobody led within {bound:?} after the fault ended (injection at {} µs)",
                e.t
            ));
        }
    }
}

/// Where section `s`'s valid interval ends: the last instant its holder
/// found it valid; for a section that never ended, the moment its process
/// was reaped after the kill (the latest it could have acted).
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

/// Where section `s`'s valid interval starts: when the grant's answer left
/// the server, if the proxy saw it, else when the acquisition returned.
fn valid_from(s: &Section) -> i64 {
    s.t_granted.unwrap_or(s.t_start)
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
        election: false,
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
        valid_rejected: 0,
        fence_reissues: 0,
        connections: 0,
        late_releases: (0, 0),
        reacquires: Vec::new(),
        variants: vec![(0, 0); fault.variants().len()],
        miss_reasons: Vec::new(),
        takeovers: Vec::new(),
        cancels: Vec::new(),
        wakes: Vec::new(),
        downtimes: events.iter().filter_map(|e| e.downtime).collect(),
        taken_during_pause: 0,
        short_pauses: 0,
        overlap_lengths: Vec::new(),
        replicated: Vec::new(),
        failures: Vec::new(),
        timeline: None,
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
            (until >= valid_from(s)).then_some((s.holder.as_str(), valid_from(s), until))
        })
        .collect();
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                r.overlaps += 1;
                let length = dur(a.2.min(b.2) - a.1.max(b.1));
                r.max_overlap = r.max_overlap.max(length);
                r.overlap_lengths.push(length);
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

    // Writes rejected although their holder's lease was valid from before
    // the write until after it returned, so while it was applied: another
    // holder had written with a newer fence while this one was valid.
    // Only a revocation can explain that, and only for its victim until it
    // learns of it (one renewal period).
    let revoked = |w: &Write| {
        fault.revokes(backend)
            && events.iter().any(|e| {
                e.victim.as_deref() == Some(w.holder.as_str())
                    && e.t <= w.t_client
                    && w.t_client <= fault.revoked_from(e) + us(config.cancel_bound())
            })
    };
    let valid_rejected: Vec<&Write> = writes
        .iter()
        .filter(|w| !w.accepted && w.valid_after == Some(true))
        .collect();
    r.valid_rejected = valid_rejected.len();
    if backend.fenced() && !fault.reported_only() {
        let unexplained = valid_rejected.iter().filter(|w| !revoked(w)).count();
        if unexplained > 0 {
            r.failures.push(format!(
                "{unexplained} writes rejected while their holder's lease was valid"
            ));
        }
        if r.fence_reissues > 0 {
            r.failures.push(format!(
                "{} acquisitions got a fence not above an earlier holder's",
                r.fence_reissues
            ));
        }
    }

    // Per injection.
    for (i, e) in events.iter().enumerate() {
        let Some(victim) = e.victim.as_deref() else {
            continue;
        };
        if let Some(reason) = &e.missed {
            r.misses += 1;
            r.miss_reasons.push(reason.clone());
            continue;
        }
        // What happened after this injection and before the next one is its doing.
        let next = events.get(i + 1).map_or(i64::MAX, |n| n.t);
        let ours = |t: i64| e.t <= t && t < next;
        if fault == Fault::LateRelease {
            late_release(config, &mut r, e, victim, sections);
            continue;
        }
        let Some(section) = section_at(sections, victim, e.t) else {
            // Every victim promised to hold (and said so) before the fault.
            r.misses += 1;
            r.miss_reasons
                .push("no section of the victim's in the log".to_owned());
            r.failures.push(format!(
                "the fault landed on {victim} while it held, but no section of its in the log covers it"
            ));
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
            r.miss_reasons
                .push("the victim's section had ended".to_owned());
            continue;
        }
        r.hits += 1;
        r.connections += e.count;
        r.replicated.extend(e.replicated);
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
        if let Some(v) = r.variants.get_mut(e.variant) {
            v.0 += 1;
            v.1 += u32::from(lost);
        }
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
                // An advisory lock outlives the pause with its session: the
                // woken holder may still hold the lock, and its fence still
                // be the newest, so its write is rightly accepted. What must
                // hold there is that no write with a fence older than one
                // already written is accepted: the stale-fence count,
                // required of every fenced backend.
                if section.wake_write_accepted == Some(true) && !backend.advisory() {
                    r.failures.push(
                        "the woken holder's write with its old fence was accepted".to_owned(),
                    );
                }
                let lifted = e.t_lifted.unwrap_or(i64::MAX);
                if takeover.is_some_and(|t| e.t + t < lifted) {
                    r.taken_during_pause += 1;
                }
                if !backend.advisory() {
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
                // etcd revokes after a leader's pause only sometimes (the
                // resumed leader must find the lease expired first): a
                // victim that kept its lease, with nobody else holding
                // before its section ended, had nothing to learn. Where
                // another holder did start first, the bound applies (and
                // the overlap and fence checks, always).
                let taken_from_victim = sections.iter().any(|s| {
                    s.holder != victim
                        && ours(s.t_start)
                        && section.t_end.is_none_or(|end| s.t_start < end)
                });
                let bound = match fault {
                    Fault::BlackHole => Some(config.deadline_bound()),
                    Fault::LeaderPause if !taken_from_victim => None,
                    f if f.revokes(backend) && !f.reported_only() => {
                        Some(dur(f.revoked_from(e) - e.t) + config.cancel_bound())
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
                // Documented as "lease kept": the renewal is retried on a
                // new connection long before the deadline.
                if matches!(fault, Fault::ConnKill | Fault::Reset)
                    && !fault.revokes(backend)
                    && let Some(c) = cancel
                {
                    r.failures.push(format!(
                        "{}: the lease was lost ({c:?} after the fault); it must be kept",
                        fault.as_str()
                    ));
                }
                if fault == Fault::BlackHoleConn {
                    black_hole_conn(config, &mut r, e, cancel, takeover, backend);
                }
            }
        }
    }

    // Every documented variant of the fault must have landed.
    for (name, (landed, _)) in fault.variants().iter().zip(&r.variants) {
        if *landed == 0 && r.hits > 0 && !name.is_empty() {
            r.failures
                .push(format!("the variant \"{name}\" never landed"));
        }
    }
    if r.hits == 0 {
        r.failures.push(format!(
            "the fault never happened ({})",
            if r.miss_reasons.is_empty() {
                "no injection".to_owned()
            } else {
                r.miss_reasons.join("; ")
            }
        ));
    }
    if r.completed == 0 {
        r.failures.push("no critical section completed".to_owned());
    }
    if backend.fenced() && r.stale_accepted > 0 {
        r.failures
            .push(format!("{} stale-fence writes accepted", r.stale_accepted));
    }
    if fault.reported_only() {
        // Reported, not required: see docs/RELIABILITY.md.
    } else if fault.revokes(backend) {
        let bound = config.overlap_bound(fault, backend);
        if r.max_overlap > bound {
            r.failures.push(format!(
                "overlap of {:?} exceeds {bound:?} ({})",
                r.max_overlap,
                if bound == config.cancel_bound() {
                    "one renewal period"
                } else {
                    "the session's end is watched"
                }
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

/// One `late-release` injection that happened: the victim's release was
/// stalled, it acquired the name again, then the release was delivered.
/// Its newer lease must be kept: the old release concerns another
/// acquisition.
fn late_release(
    config: &Config,
    r: &mut ScenarioResult,
    e: &Event,
    victim: &str,
    sections: &[Section],
) {
    r.hits += 1;
    r.connections += e.count;
    if let Some(v) = r.variants.get_mut(e.variant) {
        v.0 += 1;
    }
    let (old, new) = e.fences.unwrap_or_default();
    r.late_releases.0 += 1;
    if new <= old {
        r.failures.push(format!(
            "late-release: the holder's acquisition after its release got fence {new}, not above {old}"
        ));
    }
    let lifted = e.t_lifted.unwrap_or(e.t);
    // The newer section: acquired before the delivery, held across it.
    let Some(newer) = sections
        .iter()
        .rfind(|s| s.holder == victim && s.fence == Some(new) && s.t_start <= lifted)
    else {
        r.failures
            .push("late-release: the holder's newer section is not in the log".to_owned());
        return;
    };
    let kept = newer.t_cancel.is_none() && newer.valid_end != Some(false);
    r.cancels.push(newer.t_cancel.map(|c| dur(c - lifted)));
    if kept {
        r.late_releases.1 += 1;
    } else {
        r.failures.push(format!(
            "late-release: the newer lease was lost {:?} after the old release was delivered",
            newer.t_cancel.map(|c| dur(c - lifted))
        ));
    }
    // It was held (3 ttl) well past the delivery.
    if newer.t_end.is_some_and(|end| end < lifted + us(config.ttl)) {
        r.failures
            .push("late-release: the newer section ended within a ttl of the delivery".to_owned());
    }
}

/// One `black-hole-conn` injection that happened: the lease is kept, or
/// lost at its deadline and taken over within the takeover bound; either
/// way the holder acquires again within [`Config::reconnect_bound`].
fn black_hole_conn(
    config: &Config,
    r: &mut ScenarioResult,
    e: &Event,
    cancel: Option<Duration>,
    takeover: Option<i64>,
    backend: BackendKind,
) {
    if let Some(c) = cancel {
        if c > config.deadline_bound() {
            r.failures.push(format!(
                "black-hole-conn: the victim's token was cancelled after {c:?}, bound {:?}",
                config.deadline_bound()
            ));
        }
        match takeover {
            Some(t) if dur(t) <= config.takeover_bound(backend) => {}
            other => r.failures.push(format!(
                "black-hole-conn: the lost lease was taken over after {:?}, bound {:?}",
                other.map(dur),
                config.takeover_bound(backend)
            )),
        }
    }
    let again = e.reacquired_after.flatten();
    r.reacquires.push(again);
    match again {
        Some(t) if t <= config.reconnect_bound_of(backend) => {}
        other => r.failures.push(format!(
            "black-hole-conn: the holder acquired again after {other:?}, bound {:?}",
            config.reconnect_bound_of(backend)
        )),
    }
}

#[cfg(test)]
mod tests;
