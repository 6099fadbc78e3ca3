//! The backends and faults of the suite, and the facts about each in one
//! table: [`BACKENDS`] (a [`BackendSpec`] per backend) and [`FAULTS`] (a
//! [`FaultSpec`] per fault). A new fault is a row of [`FAULTS`], its
//! injection in `nemesis.rs` and, if it needs one, its check in
//! `analysis.rs`; everything else (which backends, revocation, bounds,
//! report and timeline wording) is read off its row.

use std::str::FromStr;

use super::Event;

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
    /// one replica ([`crate::clusters::RedisCluster::with_replicas`]).
    RedisCluster,
    /// `Etcd` on a private 3-member etcd cluster ([`super::etcd::Cluster`]).
    Etcd,
}

/// Which private server a backend runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// The private PostgreSQL.
    Postgres,
    /// The private MariaDB.
    MariaDb,
    /// The private Redis (with `appendfsync always`; without persistence
    /// for `restart-no-persistence`).
    Redis,
    /// The private Redis Cluster: the contenders talk to its nodes
    /// directly, so the proxy's faults do not apply.
    RedisCluster,
    /// The run's 3-member etcd cluster.
    Etcd,
}

/// How the lease of a holder that died ends on the server: what the
/// takeover after a kill waits for ([`super::Config::takeover_bound`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    /// At its expiry: at most a ttl after the last renewal.
    Expiry,
    /// With the session that holds the lock (`PgAdvisory`): at once when
    /// the process dies; there is no expiry.
    Session,
    /// At the etcd lease's expiry, which etcd rounds up to whole seconds
    /// and finds by a periodic check ([`super::Config::etcd_takeover_bound`]).
    EtcdLease,
}

/// The facts about one backend: a row of [`BACKENDS`].
#[derive(Debug)]
pub struct BackendSpec {
    /// The backend.
    pub kind: BackendKind,
    /// The name used on command lines and in reports.
    pub name: &'static str,
    /// The type's name in the `leasehold` crate, for the report.
    pub type_name: &'static str,
    /// It hands out fencing tokens.
    pub fenced: bool,
    /// A session advisory lock (`PgAdvisory`), which ends with its session
    /// and has no expiry.
    pub advisory: bool,
    /// The private server it runs on.
    pub server: Server,
    /// How a dead holder's lease ends.
    pub lease_end: LeaseEnd,
}

/// Every backend, in report order (the order of [`BackendKind::ALL`]).
pub const BACKENDS: [BackendSpec; 7] = [
    BackendSpec {
        kind: BackendKind::PgTable,
        name: "pg-table",
        type_name: "PgTable",
        fenced: true,
        advisory: false,
        server: Server::Postgres,
        lease_end: LeaseEnd::Expiry,
    },
    BackendSpec {
        kind: BackendKind::MySqlTable,
        name: "mysql-table",
        type_name: "MySqlTable (MariaDB)",
        fenced: true,
        advisory: false,
        server: Server::MariaDb,
        lease_end: LeaseEnd::Expiry,
    },
    BackendSpec {
        kind: BackendKind::PgAdvisory,
        name: "pg-advisory",
        type_name: "PgAdvisory",
        fenced: false,
        advisory: true,
        server: Server::Postgres,
        lease_end: LeaseEnd::Session,
    },
    BackendSpec {
        kind: BackendKind::PgAdvisoryFenced,
        name: "pg-advisory-fenced",
        type_name: "PgAdvisory (fenced)",
        fenced: true,
        advisory: true,
        server: Server::Postgres,
        lease_end: LeaseEnd::Session,
    },
    BackendSpec {
        kind: BackendKind::Redis,
        name: "redis",
        type_name: "Redis",
        fenced: true,
        advisory: false,
        server: Server::Redis,
        lease_end: LeaseEnd::Expiry,
    },
    BackendSpec {
        kind: BackendKind::RedisCluster,
        name: "redis-cluster",
        type_name: "Redis (Cluster)",
        fenced: true,
        advisory: false,
        server: Server::RedisCluster,
        lease_end: LeaseEnd::Expiry,
    },
    BackendSpec {
        kind: BackendKind::Etcd,
        name: "etcd",
        type_name: "Etcd (3 members)",
        fenced: true,
        advisory: false,
        server: Server::Etcd,
        lease_end: LeaseEnd::EtcdLease,
    },
];

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

    /// Its row of [`BACKENDS`].
    pub fn spec(self) -> &'static BackendSpec {
        &BACKENDS[self as usize]
    }

    /// The name used on command lines and in reports.
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// The type's name in the `leasehold` crate.
    pub fn type_name(self) -> &'static str {
        self.spec().type_name
    }

    /// Does it hand out fencing tokens?
    pub fn fenced(self) -> bool {
        self.spec().fenced
    }

    /// Is it `PgAdvisory` (with fencing or without): a session advisory
    /// lock, which ends with its session and has no expiry?
    pub fn advisory(self) -> bool {
        self.spec().advisory
    }

    /// Does it run on the private PostgreSQL?
    pub fn postgres(self) -> bool {
        self.spec().server == Server::Postgres
    }

    /// The faults that apply to this backend, in report order.
    pub fn faults(self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|f| f.spec().on.contains(&self))
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

/// A fault the nemesis injects; what each one does is in its row of
/// [`FAULTS`] and `docs/RELIABILITY.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// `SIGKILL` of the current holder (a new contender process replaces it).
    Kill,
    /// `SIGSTOP` of the current holder for 2.5 ttl, then `SIGCONT`.
    Stop,
    /// Table backends: the holder's body opens a transaction, checks it in
    /// with its lease (`LeaseGuard::check_in`), and is `SIGSTOP`ped in it
    /// for 2.5 ttl; after `SIGCONT` it writes to a plain (unfenced) table
    /// in that transaction and commits. The check-in's share lock on the
    /// lease's row keeps the next grant waiting until the transaction ends.
    StopInTxn,
    /// `SIGTERM` to the current holder, a rolling deploy: its worker calls
    /// `Lease::shutdown()`, its body winds down, and the process exits (a
    /// new contender process replaces it).
    Deploy,
    /// The contenders' jobs have a `max_hold` ([`super::Config::max_hold`])
    /// shorter than the victim's section: its token fires, its body winds
    /// down, the lease is released.
    MaxHold,
    /// Kill the holder's server connections (`pg_terminate_backend`,
    /// MariaDB `KILL CONNECTION USER`, Redis `CLIENT KILL ID`).
    ConnKill,
    /// Take the lease away from its holder on the server (expire its row,
    /// delete its Redis key) — what an operator or a buggy peer could do;
    /// the holder must notice at its next renewal (on etcd, by its watch,
    /// about a round trip later).
    Steal,
    /// Added latency for 3 ttl, in turn: ttl/6 each way on every
    /// contender's link (a round trip of ttl/3, the renewal timeout); ttl/12
    /// each way on every link; ttl/6 each way on the holder's link only, so
    /// that the others, undelayed, take the lease the moment the server lets
    /// them — any belief of the holder's past that moment is an overlap.
    Latency,
    /// The holder's link becomes a black hole for 2 ttl, then heals.
    BlackHole,
    /// As [`Fault::BlackHole`], on a holder whose clocks run slow: one
    /// contender (slot 0) runs under libfaketime at
    /// [`super::Config::drift_rate`] × real speed, and is the victim.
    Drift,
    /// `PgAdvisory`: the holder's link becomes a black hole for
    /// [`super::LONG_BLACK_HOLE`] — longer than the heartbeat's timeout plus any
    /// limit (5 s) on what the holder may still send on the connection of
    /// the lock it lost — then heals; from the first deadline bound on the
    /// victim starts no acquisition. Within the takeover bound of the heal
    /// another contender must hold the lock: a lost lock must not come
    /// back with its connection into the holder's pool (issue 29).
    BlackHoleLong,
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
    /// asking every member, [`super::etcd::Cluster::leader`]), stays down for 2 ttl,
    /// and is started again on its data.
    LeaderKill,
    /// etcd: the leader member is `SIGSTOP`ped for 3 election timeouts
    /// ([`super::etcd::ELECTION_TIMEOUT`]), then `SIGCONT`.
    LeaderPause,
    /// etcd: one member is cut off from the two others in both directions
    /// ([`super::etcd::Cluster::partition`]) for 3 election timeouts, then healed;
    /// in turn the leader and a follower. Clients still reach it.
    Partition,
    /// An operator's `Backend::force_release` (the kind with a lock delay)
    /// of the holder's lease while its body runs: its renewals fail, so its
    /// token fires within a renewal period, and nobody is granted the name
    /// before the expiry the server last set.
    ForceRelease,
}

/// Whether a fault is a *revocation*: the server itself ends the lease
/// behind a live holder's back, which the holder can only learn at its next
/// renewal (or sooner, where the backend hears of it). Two holders then
/// believe they hold for up to one renewal period, and only fencing
/// protects the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revokes {
    /// Never.
    No,
    /// On every backend it runs on: the lease's record is gone.
    Always,
    /// On `PgAdvisory`: the session that holds the lock ends, and with it
    /// the lock; the backend watches the session, so the holder learns it
    /// at once ([`super::PROMPT_LOSS`]).
    Session,
    /// On etcd, counted from the fault's lifting: the resumed old leader's
    /// lessor still counts each lease from the last keep-alive *it* saw,
    /// finds those of a pause longer than their TTL expired and proposes
    /// their revocation, which the new leader commits (etcd issue #15247;
    /// the leadership check of 3.4.28 / 3.5.11 narrows the window,
    /// measured in docs/RELIABILITY.md). No client request ends it, so no
    /// client can prevent it. Not on every injection: only where another
    /// holder started before the victim's section ended are its bounds
    /// required.
    ResumedLeader,
}

/// Whether the victim's token must be cancelled by its local deadline,
/// [`super::Config::deadline_bound`] after the fault (its renewals cannot
/// get through).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByDeadline {
    /// No such bound.
    No,
    /// Always: the link is cut for longer than the deadline.
    Always,
    /// If the lease is lost at all (it may be kept).
    IfLost,
}

/// The facts about one fault: a row of [`FAULTS`].
#[derive(Debug)]
pub struct FaultSpec {
    /// The fault.
    pub fault: Fault,
    /// The name used on command lines and in reports.
    pub name: &'static str,
    /// The documented variants, which injections take in turn (injection
    /// `k` is variant `k % len`): every run must land each at least once.
    /// `[""]`: one kind only.
    pub variants: &'static [&'static str],
    /// The backends it applies to.
    pub on: &'static [BackendKind],
    /// Whether it is a revocation, and on which backends.
    pub revokes: Revokes,
    /// Reported as measured, with no required property but the fenced
    /// resource's own (no stale-fence write accepted), and the report's
    /// result for it: faults that lose keys the lease depends on.
    pub reported_only: Option<&'static str>,
    /// The victim's token is cancelled by its local deadline.
    pub by_deadline: ByDeadline,
    /// The lease must be kept (not revoked, not lost): renewals are retried
    /// on a new connection long before the deadline.
    pub keeps_lease: bool,
    /// The victim's token is cancelled at the fault, within the slack
    /// (`deploy`'s `shutdown()`, `max-hold`).
    pub cancels_at_once: bool,
    /// The victim's body returns by itself and the lease is handed over:
    /// granted again (to anyone) within [`super::Config::handover_bound`]
    /// of the body's return (to another holder before it: an overlap).
    pub hands_over: bool,
    /// The takeover column shows [`super::Config::takeover_bound`], which
    /// the analysis requires of it.
    pub takeover_bound: bool,
    /// What the timeline says the fault was: `{who}` (the victim's lane),
    /// `{variant}` (` (variant)`, if it has variants) and `{count}` (what
    /// it counted) are filled in.
    pub caption: &'static str,
    /// What the timeline says when the fault is lifted (`None`: not drawn).
    pub lifted: Option<&'static str>,
    /// The short run (CI's, [`super::Config::short`]) runs it only on
    /// these backends (`None`: on every one of [`on`](FaultSpec::on)),
    /// to keep CI's time; the full run on all.
    pub short_on: Option<&'static [BackendKind]>,
    /// The victim's process is `SIGSTOP`ped: overlaps with its frozen body,
    /// which nobody can stop, are reported apart.
    pub freezes: bool,
    /// The victim's token is cancelled at its next renewal, which the
    /// server refuses: within [`super::Config::cancel_bound`] of the fault.
    /// Not a revocation: nobody else may hold before the lease would have
    /// expired (a lock delay), so every overlap is still required zero.
    pub cancels_at_renewal: bool,
}

use BackendKind::{Etcd, MySqlTable, PgAdvisory, PgAdvisoryFenced, PgTable, Redis, RedisCluster};

/// Every backend.
const EVERY: &[BackendKind] = &BackendKind::ALL;
/// Every backend that the contenders reach through their proxies (all but
/// the Redis Cluster, whose nodes they reach directly).
const PROXIED: &[BackendKind] = &[
    PgTable,
    MySqlTable,
    PgAdvisory,
    PgAdvisoryFenced,
    Redis,
    Etcd,
];
/// The backends whose lease is a record on the server, with a fence to
/// match a late release against (not `PgAdvisory`, whose lock cannot be
/// taken away without ending its session — that is `conn-kill` — and
/// which has no fence without fencing; with fencing it runs the same
/// faults as without, to compare the two).
const RECORDS: &[BackendKind] = &[PgTable, MySqlTable, Redis, Etcd];
const ADVISORY: &[BackendKind] = &[PgAdvisory, PgAdvisoryFenced];
/// The table backends, whose leases a transaction of the lease's database
/// can check in (`LeaseGuard::check_in`).
const TABLES: &[BackendKind] = &[PgTable, MySqlTable];

/// A row with the defaults: no revocation, nothing reported only, no
/// deadline bound, no kept lease, no takeover bound shown.
const fn fault(
    fault: Fault,
    name: &'static str,
    on: &'static [BackendKind],
    caption: &'static str,
) -> FaultSpec {
    FaultSpec {
        fault,
        name,
        variants: &[""],
        on,
        revokes: Revokes::No,
        reported_only: None,
        by_deadline: ByDeadline::No,
        keeps_lease: false,
        cancels_at_once: false,
        hands_over: false,
        takeover_bound: false,
        caption,
        lifted: Some("fault lifted"),
        short_on: None,
        freezes: false,
        cancels_at_renewal: false,
    }
}

/// Every fault, in report order (the order of [`Fault::ALL`]).
pub const FAULTS: [FaultSpec; 21] = [
    FaultSpec {
        takeover_bound: true,
        ..fault(Fault::Kill, "kill", EVERY, "SIGKILL of {who}")
    },
    FaultSpec {
        variants: &["pause 2.5 ttl", "pause 0.6–1.4 ttl"],
        takeover_bound: true,
        lifted: Some("SIGCONT"),
        freezes: true,
        ..fault(Fault::Stop, "stop", EVERY, "SIGSTOP of {who}{variant}")
    },
    FaultSpec {
        lifted: Some("SIGCONT: its write commits"),
        freezes: true,
        short_on: Some(&[PgTable]),
        ..fault(
            Fault::StopInTxn,
            "stop-in-txn",
            TABLES,
            "SIGSTOP of {who} in its checked-in transaction",
        )
    },
    FaultSpec {
        cancels_at_once: true,
        hands_over: true,
        lifted: Some("its process exited"),
        short_on: Some(&[PgTable, Redis]),
        ..fault(
            Fault::Deploy,
            "deploy",
            EVERY,
            "SIGTERM to {who}: shutdown()",
        )
    },
    FaultSpec {
        cancels_at_once: true,
        hands_over: true,
        lifted: Some("it released"),
        short_on: Some(&[Redis]),
        ..fault(
            Fault::MaxHold,
            "max-hold",
            EVERY,
            "max_hold of {who} over: its token fires",
        )
    },
    FaultSpec {
        revokes: Revokes::Session,
        keeps_lease: true,
        ..fault(
            Fault::ConnKill,
            "conn-kill",
            PROXIED,
            "{count} server connection(s) of {who} killed",
        )
    },
    FaultSpec {
        revokes: Revokes::Always,
        ..fault(
            Fault::Steal,
            "steal",
            RECORDS,
            "the lease of {who} ended on the server",
        )
    },
    FaultSpec {
        variants: &[
            "ttl/6 each way",
            "ttl/12 each way",
            "ttl/6 each way, holder's link only",
        ],
        ..fault(Fault::Latency, "latency", PROXIED, "added latency{variant}")
    },
    FaultSpec {
        by_deadline: ByDeadline::Always,
        ..fault(
            Fault::BlackHole,
            "black-hole",
            PROXIED,
            "the link of {who} black-holed",
        )
    },
    FaultSpec {
        by_deadline: ByDeadline::Always,
        short_on: Some(&[PgTable]),
        ..fault(
            Fault::Drift,
            "drift",
            PROXIED,
            "the link of {who} (its clock slowed) black-holed",
        )
    },
    FaultSpec {
        by_deadline: ByDeadline::Always,
        // A session lock's connection after a stall; the others' leases
        // expire on the server whatever the connection does.
        ..fault(
            Fault::BlackHoleLong,
            "black-hole-long",
            ADVISORY,
            "the link of {who} black-holed for long",
        )
    },
    FaultSpec {
        by_deadline: ByDeadline::IfLost,
        takeover_bound: true,
        // Lifted when the victim had acquired again: nothing to draw.
        lifted: None,
        // The backends that promise to replace a silent connection; see
        // `docs/RELIABILITY.md` for the others.
        ..fault(
            Fault::BlackHoleConn,
            "black-hole-conn",
            &[Redis, Etcd],
            "the open connections of {who} silent for good",
        )
    },
    FaultSpec {
        revokes: Revokes::Session,
        keeps_lease: true,
        ..fault(
            Fault::Reset,
            "reset",
            PROXIED,
            "every connection reset (TCP RST)",
        )
    },
    FaultSpec {
        lifted: Some("held-back release delivered"),
        ..fault(
            Fault::LateRelease,
            "late-release",
            RECORDS,
            "the release of {who} held back in the network",
        )
    },
    FaultSpec {
        variants: &["down 1.5 ttl", "restarted at once"],
        revokes: Revokes::Session,
        lifted: Some("server up again"),
        ..fault(Fault::Restart, "restart", PROXIED, "server crash{variant}")
    },
    FaultSpec {
        variants: &["down 1.5 ttl", "restarted at once"],
        revokes: Revokes::Always,
        reported_only: Some("not required (no persistence)"),
        lifted: Some("server up again"),
        ..fault(
            Fault::RestartNoPersistence,
            "restart-no-persistence",
            &[Redis],
            "server crash, no persistence{variant}",
        )
    },
    FaultSpec {
        variants: &[
            "failover after the node timeout",
            "replica takes over at once",
        ],
        // The promoted replica may not have the lock.
        revokes: Revokes::Always,
        reported_only: Some("reported, not required (asynchronous replication)"),
        lifted: Some("killed master back, as a replica"),
        ..fault(
            Fault::MasterKill,
            "master-kill",
            &[RedisCluster],
            "SIGKILL of the master of the lease's slot{variant}",
        )
    },
    FaultSpec {
        lifted: Some("member restarted"),
        ..fault(
            Fault::LeaderKill,
            "leader-kill",
            &[Etcd],
            "SIGKILL of the etcd leader member",
        )
    },
    FaultSpec {
        revokes: Revokes::ResumedLeader,
        lifted: Some("SIGCONT"),
        ..fault(
            Fault::LeaderPause,
            "leader-pause",
            &[Etcd],
            "SIGSTOP of the etcd leader member",
        )
    },
    FaultSpec {
        variants: &["the leader", "a follower"],
        lifted: Some("healed"),
        ..fault(
            Fault::Partition,
            "partition",
            &[Etcd],
            "one etcd member partitioned{variant}",
        )
    },
    FaultSpec {
        takeover_bound: true,
        cancels_at_renewal: true,
        lifted: None,
        short_on: Some(&[PgTable]),
        // The backends whose `force_release` keeps a lock delay.
        ..fault(
            Fault::ForceRelease,
            "force-release",
            RECORDS,
            "the lease of {who} force-released (lock delay)",
        )
    },
];

impl Fault {
    /// The faults of the election scenarios ([`super::Config::elections`]): the
    /// holder killed, paused, its connections killed, its link cut.
    pub const ELECTION: [Fault; 4] = [Fault::Kill, Fault::Stop, Fault::ConnKill, Fault::BlackHole];

    /// Every fault, in report order.
    pub const ALL: [Fault; 21] = [
        Fault::Kill,
        Fault::Stop,
        Fault::StopInTxn,
        Fault::Deploy,
        Fault::MaxHold,
        Fault::ConnKill,
        Fault::Steal,
        Fault::Latency,
        Fault::BlackHole,
        Fault::Drift,
        Fault::BlackHoleLong,
        Fault::BlackHoleConn,
        Fault::Reset,
        Fault::LateRelease,
        Fault::Restart,
        Fault::RestartNoPersistence,
        Fault::MasterKill,
        Fault::LeaderKill,
        Fault::LeaderPause,
        Fault::Partition,
        Fault::ForceRelease,
    ];

    /// Its row of [`FAULTS`].
    pub fn spec(self) -> &'static FaultSpec {
        &FAULTS[self as usize]
    }

    /// The name used on command lines and in reports.
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// The documented variants of this fault, which injections take in
    /// turn (injection `k` is variant `k % len`): every run must land each at
    /// least once.
    pub fn variants(self) -> &'static [&'static str] {
        self.spec().variants
    }

    /// Is this fault, on this backend, a *revocation* ([`Revokes`])?
    pub fn revokes(self, backend: BackendKind) -> bool {
        match self.spec().revokes {
            Revokes::No => false,
            Revokes::Always => true,
            Revokes::Session => backend.advisory(),
            Revokes::ResumedLeader => backend == BackendKind::Etcd,
        }
    }

    /// When a revocation by this fault can happen, for the bounds of
    /// [`Fault::revokes`]: at the injection, or, for `leader-pause`, up to
    /// its lifting (the resumed leader revokes).
    pub(super) fn revoked_from(self, e: &Event) -> i64 {
        match self.spec().revokes {
            Revokes::ResumedLeader => e.t_lifted.unwrap_or(e.t),
            _ => e.t,
        }
    }

    /// Is the holder told of this fault's revocation on this backend at
    /// once, not at its next renewal? Then overlaps are bounded by
    /// [`super::PROMPT_LOSS`].
    pub fn revokes_promptly(self, backend: BackendKind) -> bool {
        match self.spec().revokes {
            Revokes::Session => backend.advisory(),
            // `Etcd` watches its keys: a deleted key or a revoked etcd lease
            // (a steal, or a resumed leader's revocation) reaches the holder
            // about a round trip after it commits.
            Revokes::Always | Revokes::ResumedLeader => backend == BackendKind::Etcd,
            Revokes::No => false,
        }
    }

    /// Is the outcome of this fault reported as measured, with no required
    /// property but the fenced resource's own (no stale-fence write
    /// accepted)? Faults that lose keys the lease depends on: a restart
    /// without persistence, a failover to a replica that may lack them.
    pub fn reported_only(self) -> bool {
        self.spec().reported_only.is_some()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_are_in_the_order_of_the_enums() {
        for (i, b) in BackendKind::ALL.into_iter().enumerate() {
            assert_eq!(BACKENDS[i].kind, b);
            assert_eq!(b as usize, i);
        }
        for (i, f) in Fault::ALL.into_iter().enumerate() {
            assert_eq!(FAULTS[i].fault, f);
            assert_eq!(f as usize, i);
        }
    }

    /// The faults each backend runs (a changed row of the table shows
    /// here; the first list before `deploy`, `max-hold` and `drift` is what
    /// the matches the table replaced gave).
    #[test]
    fn each_backend_runs_its_faults() {
        let names =
            |b: BackendKind| -> Vec<&str> { b.faults().iter().map(|f| f.as_str()).collect() };
        assert_eq!(
            names(RedisCluster),
            ["kill", "stop", "deploy", "max-hold", "master-kill"]
        );
        let common = [
            "kill",
            "stop",
            "stop-in-txn",
            "deploy",
            "max-hold",
            "conn-kill",
            "steal",
            "latency",
            "black-hole",
            "drift",
            "reset",
            "late-release",
            "restart",
            "force-release",
        ];
        assert_eq!(names(PgTable), common);
        assert_eq!(names(MySqlTable), common);
        let advisory = [
            "kill",
            "stop",
            "deploy",
            "max-hold",
            "conn-kill",
            "latency",
            "black-hole",
            "drift",
            "black-hole-long",
            "reset",
            "restart",
        ];
        assert_eq!(names(PgAdvisory), advisory);
        assert_eq!(names(PgAdvisoryFenced), advisory);
        assert_eq!(
            names(Redis),
            [
                "kill",
                "stop",
                "deploy",
                "max-hold",
                "conn-kill",
                "steal",
                "latency",
                "black-hole",
                "drift",
                "black-hole-conn",
                "reset",
                "late-release",
                "restart",
                "restart-no-persistence",
                "force-release",
            ]
        );
        assert_eq!(
            names(Etcd),
            [
                "kill",
                "stop",
                "deploy",
                "max-hold",
                "conn-kill",
                "steal",
                "latency",
                "black-hole",
                "drift",
                "black-hole-conn",
                "reset",
                "late-release",
                "restart",
                "leader-kill",
                "leader-pause",
                "partition",
                "force-release",
            ]
        );
    }
}
