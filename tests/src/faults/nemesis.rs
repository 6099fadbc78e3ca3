//! The nemesis: what each fault does to a scenario ([`Scenario::inject`]
//! and the functions it calls), and what it saw ([`Event`]). The facts
//! about each fault (its variants, the backends it runs on) are in its row
//! of [`super::kinds::FAULTS`]; the checks of what followed are in
//! `analysis.rs`.

use std::time::Duration;

use leasehold::backend::Redis;
use sqlx::Connection;
use tokio::time::Instant;

use super::scenario::{Scenario, Target};
use super::{BackendKind, Fault, LONG_BLACK_HOLE, breaks, dur, etcd, fraction, monotonic_us, us};
use crate::proxy::{Mode, StalledRequest};
use crate::servers::signal;

/// One injection of a fault, as the nemesis did it.
#[derive(Debug, Clone, Default)]
pub(super) struct Event {
    /// When the fault landed (µs).
    pub(super) t: i64,
    /// When it was lifted (SIGCONT, heal, server up again, stalled bytes delivered).
    pub(super) t_lifted: Option<i64>,
    /// The holder the fault was aimed at.
    pub(super) victim: Option<String>,
    /// Which of [`Fault::variants`].
    pub(super) variant: usize,
    /// Why the fault did not happen, as far as the nemesis could see (no
    /// connection killed or reset, nothing stalled, ...): then it is a miss.
    pub(super) missed: Option<String>,
    /// Connections killed, reset or black-holed; rows or keys stolen.
    pub(super) count: usize,
    /// How long the server was down (restarts).
    pub(super) downtime: Option<Duration>,
    /// `late-release`: the victim's fence before and after it acquired again.
    pub(super) fences: Option<(i64, i64)>,
    /// `black-hole-conn`: from the end of the victim's section to its next
    /// acquisition (`None`: not within the nemesis' wait).
    pub(super) reacquired_after: Option<Option<Duration>>,
    /// `master-kill`: whether the replica had the victim's lock, and the
    /// fence counter at least at the victim's fence, when the master died.
    pub(super) replicated: Option<(bool, bool)>,
    /// `drift`: the victim's clock as measured over the injection.
    pub(super) clock: Option<DriftClock>,
}

/// `drift`: the victim's clock, measured by two readings of it paired with
/// the real one ([`super::scenario::Worker::read_clock`]), at the injection
/// and a few ttl later.
#[derive(Debug, Clone, Copy)]
pub(super) struct DriftClock {
    /// Its speed: its time elapsed between the readings over the real.
    pub(super) rate: f64,
    /// How far from the real time the worker's mapping (its `clock-map`)
    /// put the second reading: the error of the times it recorded.
    pub(super) error: Duration,
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
pub(super) fn executes(backend: BackendKind, bytes: &[u8]) -> bool {
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

impl Scenario<'_> {
    /// Inject the fault (its `k`-th time); the events it made (more than one
    /// where the nemesis tries again after a miss).
    pub(super) async fn inject(&mut self, k: u32) -> Result<Vec<Event>, String> {
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
                self.workers[slot] = self.start(slot).await?;
                self.wait_takeover(&victim, ttl * 3).await;
                event.victim = Some(victim);
            }
            Fault::Stop => return self.pauses(event).await,
            Fault::StopInTxn => return self.stop_in_txn(event).await.map(|e| vec![e]),
            Fault::ForceRelease => {
                let slot = self.victim(ttl * 3).await?;
                let victim = self.workers[slot].holder.clone();
                event.victim = Some(victim.clone());
                event.t = monotonic_us();
                event.count = usize::from(self.force_release().await?);
                if event.count == 0 {
                    event.missed = Some("no live lease on the server to force-release".to_owned());
                }
                self.wait_takeover(&victim, self.config.takeover_bound(self.backend) + ttl)
                    .await;
                tokio::time::sleep(ttl).await;
            }
            Fault::Deploy => return self.deploy(event).await.map(|e| vec![e]),
            Fault::MaxHold => return self.max_hold(event).await.map(|e| vec![e]),
            Fault::Drift => return self.drift(event).await.map(|e| vec![e]),
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
            Fault::BlackHoleLong => {
                let slot = self.victim(ttl * 5).await?;
                let victim = self.workers[slot].holder.clone();
                event.victim = Some(victim.clone());
                event.t = monotonic_us();
                self.proxies[slot].set_mode(Mode::BlackHole);
                // By its deadline the victim has lost the lease; from then
                // on it starts no acquisition (those under way time out
                // long before the heal), so that the lock, once free, is
                // the others'.
                tokio::time::sleep(self.config.deadline_bound()).await;
                self.workers[slot].send("yield 30000").await;
                tokio::time::sleep(LONG_BLACK_HOLE.saturating_sub(self.config.deadline_bound()))
                    .await;
                self.proxies[slot].set_mode(Mode::Pass);
                event.t_lifted = Some(monotonic_us());
                self.wait_takeover(&victim, ttl * 3).await;
                self.workers[slot].send("yield 0").await;
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

    /// `stop-in-txn`: the holder's body opens a transaction and checks it
    /// in with its lease (`txn-hold`); once it says so, `SIGSTOP` for 2.5
    /// ttl, `SIGCONT`, and `commit`: it writes to the unfenced table in
    /// that transaction and commits. A check-in refused, or a write that
    /// did not commit, is a miss.
    async fn stop_in_txn(&mut self, mut event: Event) -> Result<Event, String> {
        let ttl = self.config.ttl;
        let slot = self.victim(ttl * 3).await?;
        let pid = self.workers[slot].child.id().ok_or("victim gone")?;
        event.victim = Some(self.workers[slot].holder.clone());
        {
            let mut seen = self.workers[slot].seen();
            seen.in_txn = None;
            seen.txn_done = None;
        }
        self.workers[slot].send("txn-hold").await;
        let limit = Duration::from_secs(2);
        self.wait_for(slot, limit, |s| s.in_txn.is_some()).await;
        event.t = monotonic_us();
        let in_txn = self.workers[slot].seen().in_txn.clone();
        if in_txn.as_deref() != Some("ok") {
            event.missed = Some(format!("the victim's check-in: {in_txn:?}"));
            self.workers[slot].send("commit").await;
            return Ok(event);
        }
        signal(pid, "STOP");
        tokio::time::sleep(ttl * 5 / 2).await;
        signal(pid, "CONT");
        event.t_lifted = Some(monotonic_us());
        self.workers[slot].send("commit").await;
        self.wait_for(slot, ttl * 4, |s| s.txn_done.is_some()).await;
        let done = self.workers[slot].seen().txn_done.clone();
        if done.as_deref() != Some("ok") {
            event.missed = Some(format!("the victim's write after SIGCONT: {done:?}"));
        }
        event.count = 1;
        tokio::time::sleep(ttl).await;
        Ok(event)
    }

    /// `force-release`: `Backend::force_release` of the lease's name, as
    /// an operator would (under the `force-release-now` break,
    /// `force_release_now`); whether a live lease was evicted.
    async fn force_release(&self) -> Result<bool, String> {
        use leasehold::Backend;
        async fn evict(backend: &impl Backend, name: &str) -> Result<bool, leasehold::Error> {
            if breaks::on("force-release-now") {
                backend.force_release_now(name).await
            } else {
                backend.force_release(name).await
            }
        }
        let err = |e: &dyn std::fmt::Display| format!("force-release: {e}");
        let name = self.name.as_str();
        let evicted = match (self.backend, &self.target) {
            (BackendKind::PgTable, Target::Server(server)) => {
                let pool = sqlx::PgPool::connect(&server.url())
                    .await
                    .map_err(|e| err(&e))?;
                let evicted = evict(&leasehold::backend::PgTable::new(pool.clone()), name).await;
                pool.close().await;
                evicted
            }
            (BackendKind::MySqlTable, Target::Server(server)) => {
                let pool = sqlx::MySqlPool::connect(&server.url())
                    .await
                    .map_err(|e| err(&e))?;
                let evicted = evict(&leasehold::backend::MySqlTable::new(pool.clone()), name).await;
                pool.close().await;
                evicted
            }
            (BackendKind::Redis, Target::Server(server)) => {
                let pool = deadpool_redis::Config::from_url(server.url())
                    .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                    .map_err(|e| err(&e))?;
                evict(&Redis::new(pool), name).await
            }
            (BackendKind::Etcd, Target::Etcd(cluster)) => {
                let etcd = leasehold::backend::Etcd::connect(cluster.endpoints())
                    .await
                    .map_err(|e| err(&e))?;
                evict(&etcd, name).await
            }
            (backend, _) => return Err(format!("no force-release on {}", backend.as_str())),
        };
        evicted.map_err(|e| err(&e))
    }

    /// `deploy`: `SIGTERM` to the holder; its worker calls `shutdown()`,
    /// its body winds down, and it exits; a new contender process replaces
    /// it. A victim that does not exit in time is killed (and the analysis
    /// fails the injection).
    async fn deploy(&mut self, mut event: Event) -> Result<Event, String> {
        let ttl = self.config.ttl;
        let slot = self.victim(ttl * 3).await?;
        let victim = self.workers[slot].holder.clone();
        let pid = self.workers[slot].child.id().ok_or("victim gone")?;
        event.victim = Some(victim.clone());
        event.t = monotonic_us();
        signal(pid, "TERM");
        let limit = self.config.exit_bound() + Duration::from_secs(5);
        let child = &mut self.workers[slot].child;
        if tokio::time::timeout(limit, child.wait()).await.is_ok() {
            event.t_lifted = Some(monotonic_us());
        } else {
            let _ = child.start_kill();
            let _ = child.wait().await;
            self.killed.insert(victim.clone(), monotonic_us());
        }
        self.workers[slot] = self.start(slot).await?;
        self.wait_takeover(&victim, ttl * 3).await;
        Ok(event)
    }

    /// `max-hold`: a holder held past its job's `max_hold` (every
    /// contender's, in this scenario): the fault is the moment its
    /// `max_hold` is over, counted from its acquisition's request; lifted
    /// when it has released.
    async fn max_hold(&mut self, mut event: Event) -> Result<Event, String> {
        let ttl = self.config.ttl;
        let slot = self.victim(ttl * 3).await?;
        let (t_req, releases) = {
            let seen = self.workers[slot].seen();
            (seen.t_req, seen.releases)
        };
        event.victim = Some(self.workers[slot].holder.clone());
        event.t = t_req + us(self.config.max_hold());
        let limit = dur(event.t - monotonic_us())
            + self.config.grace()
            + self.config.handover_bound()
            + ttl;
        if self.wait_for(slot, limit, |s| s.releases > releases).await {
            event.t_lifted = Some(monotonic_us());
        }
        tokio::time::sleep(ttl).await;
        Ok(event)
    }

    /// `drift`: as `black-hole`, on the contender whose clocks run slow
    /// (slot 0); its clock is read before and after, to measure its speed
    /// and check the mapping of its times. An injection on a clock that
    /// did not run at the rate asked for is a miss.
    async fn drift(&mut self, mut event: Event) -> Result<Event, String> {
        let ttl = self.config.ttl;
        let slot = self.victim_in(Some(0), ttl * 5).await?;
        event.victim = Some(self.workers[slot].holder.clone());
        let (before, _) = self.workers[slot].read_clock().await?;
        event.t = monotonic_us();
        self.proxies[slot].set_mode(Mode::BlackHole);
        tokio::time::sleep(ttl * 2).await;
        self.proxies[slot].set_mode(Mode::Pass);
        event.t_lifted = Some(monotonic_us());
        tokio::time::sleep(ttl).await;
        let ((real, own), _) = self.workers[slot].read_clock().await?;
        let rate = (own - before.1) as f64 / (real - before.0) as f64;
        let (map_real, map_own) = self.workers[slot]
            .clock_map
            .ok_or("BUG: a drifting worker without its clock-map")?;
        let mapped = map_real + ((own - map_own) as f64 / self.config.drift_rate) as i64;
        event.clock = Some(DriftClock {
            rate,
            error: dur((mapped - real).abs()),
        });
        if (rate - self.config.drift_rate).abs() > 0.02 {
            event.missed = Some(format!(
                "the victim's clock ran at {rate:.3}× real speed, not {}×",
                self.config.drift_rate
            ));
        }
        Ok(event)
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
                let etcd = leasehold::backend::Etcd::connect(endpoints)
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
}
