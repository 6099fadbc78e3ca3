//! One scenario: the contender processes of one backend × fault, what the
//! orchestrator knows of each from its stdout ([`Seen`]), the waits the
//! nemesis builds on (a holder, a victim that promised to hold, a
//! takeover, others held back), the loop of injections ([`Scenario::run`])
//! and the analysis of its records ([`Scenario::analyse`]). The injections
//! themselves are in `nemesis.rs`.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::time::Instant;

use super::checker::Checker;
use super::{
    BackendKind, Config, Event, Fault, RunError, ScenarioResult, analyse, etcd, leader_again,
    monotonic_us, timeline, us, worker,
};
use crate::clusters::RedisCluster;
use crate::proxy::{FaultProxy, Mode};
use crate::servers::PrivateServer;

/// Run one scenario on `target` and analyse it.
pub(super) async fn run_scenario(
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

/// What a scenario faults: one private server, a Redis Cluster, or the
/// etcd cluster.
pub(super) enum Target<'a> {
    /// One private server.
    Server(&'a mut PrivateServer),
    /// A private Redis Cluster (the contenders connect to its nodes).
    Cluster(&'a mut RedisCluster),
    /// The run's etcd cluster.
    Etcd(&'a mut etcd::Cluster),
}

/// `fault`, and `(election)` for an election scenario.
pub(super) fn result_label(fault: Fault, election: bool) -> String {
    if election {
        format!("{} (election)", fault.as_str())
    } else {
        fault.as_str().to_owned()
    }
}

/// What the orchestrator knows about one contender, from its stdout.
#[derive(Debug, Default)]
pub(super) struct Seen {
    pub(super) holding_since: Option<Instant>,
    /// Answer to the last `hold`: Some(true) = HOLDING.
    pub(super) hold_reply: Option<bool>,
    pub(super) wakes: u32,
    pub(super) acquisitions: u64,
    /// The fence of the last acquisition.
    pub(super) fence: i64,
    /// Releases, and the last one's `(sent, done, confirmed)`.
    pub(super) releases: u64,
    pub(super) last_release: Option<(i64, i64, bool)>,
    /// Said `RELEASING` (after `end-gated`) and waits for `go`.
    pub(super) releasing: bool,
    /// The current section is over (`ENDED`), its release not yet done.
    pub(super) section_over: bool,
    /// Said `YIELDED` since the last `yield`.
    pub(super) yielded: bool,
    /// When the current section's acquisition was requested (µs).
    pub(super) t_req: i64,
    /// `stop-in-txn`: the last `INTXN` (its word: `ok`, `refused`, `err`)
    /// and `TXN` answers.
    pub(super) in_txn: Option<String>,
    pub(super) txn_done: Option<String>,
    /// The answer to the last `clock`: the worker's own clock, and when
    /// the answer was read here (µs).
    pub(super) clock: Option<(i64, i64)>,
    pub(super) exited: bool,
}

pub(super) struct Worker {
    pub(super) holder: String,
    pub(super) child: Child,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) seen: Arc<Mutex<Seen>>,
    /// A drifting worker's `clock-map`: a reading of its clock and the
    /// real one at the same instant, `(real, own)`.
    pub(super) clock_map: Option<(i64, i64)>,
}

impl Worker {
    pub(super) fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) async fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
            let _ = stdin.flush().await;
        }
    }

    /// A reading of the worker's own clock and of the real one at the same
    /// instant, `(real, own)`, and its uncertainty: of 8 `clock` exchanges,
    /// the one with the shortest round trip, paired with its middle.
    pub(super) async fn read_clock(&mut self) -> Result<((i64, i64), i64), String> {
        let mut best: Option<((i64, i64), i64)> = None;
        for _ in 0..8 {
            self.seen().clock = None;
            let sent = monotonic_us();
            self.send("clock").await;
            let limit = Instant::now() + Duration::from_secs(2);
            let (own, received) = loop {
                if let Some(reply) = self.seen().clock {
                    break reply;
                }
                if Instant::now() > limit {
                    return Err(format!("{} did not answer `clock`", self.holder));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            let round_trip = received - sent;
            if best.is_none_or(|(_, rt)| round_trip < rt) {
                best = Some(((sent + round_trip / 2, own), round_trip));
            }
        }
        best.ok_or_else(|| "BUG: no clock reading".to_owned())
    }
}

pub(super) struct Scenario<'a> {
    pub(super) config: &'a Config,
    pub(super) backend: BackendKind,
    pub(super) fault: Fault,
    /// The contenders run `Lease::elect`.
    pub(super) election: bool,
    pub(super) target: Target<'a>,
    pub(super) checker: &'a Checker,
    pub(super) prefix: &'a str,
    pub(super) key: String,
    pub(super) name: String,
    pub(super) proxies: Vec<FaultProxy>,
    pub(super) workers: Vec<Worker>,
    pub(super) generation: usize,
    /// Holders killed by the nemesis, and when the kill was reaped (the
    /// latest instant at which they could have acted).
    pub(super) killed: HashMap<String, i64>,
    /// The slot (and so the proxy) of every holder.
    pub(super) slots: HashMap<String, usize>,
    /// When every contender process was started (for the timelines).
    pub(super) started: HashMap<String, i64>,
}

impl<'a> Scenario<'a> {
    pub(super) async fn new(
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
        if fault == Fault::StopInTxn {
            let Target::Server(server) = &target else {
                return Err(RunError::Failed("stop-in-txn needs a server".to_owned()));
            };
            super::txn::create(server, &key)
                .await
                .map_err(RunError::Failed)?;
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
            let worker = scenario.start(slot).await.map_err(RunError::Failed)?;
            scenario.workers.push(worker);
        }
        Ok(scenario)
    }

    /// The private server (every backend but etcd).
    pub(super) fn server(&self) -> Result<&PrivateServer, String> {
        match &self.target {
            Target::Server(server) => Ok(server),
            Target::Cluster(_) | Target::Etcd(_) => {
                Err("this fault needs a single server".to_owned())
            }
        }
    }

    /// The etcd cluster.
    pub(super) fn cluster(&mut self) -> Result<&mut etcd::Cluster, String> {
        match &mut self.target {
            Target::Etcd(cluster) => Ok(cluster),
            Target::Server(_) | Target::Cluster(_) => {
                Err("BUG: no etcd cluster for this backend".to_owned())
            }
        }
    }

    /// Does the contender in `slot` run with slowed clocks (`drift`: slot 0)?
    pub(super) fn drifts(&self, slot: usize) -> bool {
        self.fault == Fault::Drift && slot == 0
    }

    /// Start a contender process in `slot`; a drifting one gets its
    /// `clock-map` before it contends.
    pub(super) async fn start(&mut self, slot: usize) -> Result<Worker, String> {
        let mut worker = self.spawn(slot)?;
        if self.drifts(slot) {
            let ((real, own), _) = worker.read_clock().await?;
            worker.send(&format!("clock-map {real} {own}")).await;
            worker.clock_map = Some((real, own));
        }
        Ok(worker)
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
        let args = worker::Args {
            backend: self.backend,
            url,
            name: self.name.clone(),
            holder: holder.clone(),
            ttl,
            checker_url: self.config.checker_url.clone(),
            prefix: self.prefix.to_owned(),
            key: self.key.clone(),
            section_min: ttl / 4,
            section_max: ttl * 2,
            run_for: Duration::from_secs(600),
            pool_ping: self.config.pool_ping,
            elect: self.election,
            max_hold: (self.fault == Fault::MaxHold).then(|| self.config.max_hold()),
            clock_rate: if self.drifts(slot) {
                self.config.drift_rate
            } else {
                1.0
            },
            txn: self.fault == Fault::StopInTxn,
        };
        let mut command = if self.drifts(slot) {
            // libfaketime: every clock of the process (tokio's too) runs at
            // the rate from its start on. A rate alone ("x0.8") is not
            // applied by libfaketime 0.9.10: it needs the offset.
            let mut command = Command::new("faketime");
            command
                .args(["-m", "-f", &format!("+0 x{}", self.config.drift_rate)])
                .arg(&self.config.worker_exe);
            command
        } else {
            Command::new(&self.config.worker_exe)
        };
        let mut child = command
            .arg("worker")
            .args(args.command_line())
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
                        number();
                        seen.t_req = number().unwrap_or(0);
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
                    Some("INTXN") => seen.in_txn = words.nth(1).map(str::to_owned),
                    Some("TXN") => seen.txn_done = words.nth(1).map(str::to_owned),
                    Some("CLOCK") => {
                        number();
                        let received = monotonic_us();
                        seen.clock = number().map(|own| (own, received));
                    }
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
            clock_map: None,
        })
    }

    /// A contender that has held the lease for at least 30 ms.
    pub(super) async fn wait_holder(&self) -> Result<usize, String> {
        self.wait_holder_in(None).await
    }

    /// [`wait_holder`](Scenario::wait_holder), in `only` that slot if given.
    async fn wait_holder_in(&self, only: Option<usize>) -> Result<usize, String> {
        let limit = Instant::now() + self.config.ttl * 15;
        while Instant::now() < limit {
            // Not one whose section is over and whose release is under way:
            // it still counts as holding until the release is done, but it
            // would answer every `hold` with IDLE.
            if let Some(slot) = self.workers.iter().enumerate().position(|(i, w)| {
                let seen = w.seen();
                only.is_none_or(|o| o == i)
                    && !seen.section_over
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
    pub(super) async fn victim(&mut self, hold: Duration) -> Result<usize, String> {
        self.victim_in(None, hold).await
    }

    /// [`victim`](Scenario::victim), in `only` that slot if given.
    pub(super) async fn victim_in(
        &mut self,
        only: Option<usize>,
        hold: Duration,
    ) -> Result<usize, String> {
        for _ in 0..30 {
            let slot = self.wait_holder_in(only).await?;
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
    pub(super) async fn wait_takeover(&self, victim: &str, limit: Duration) {
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
    pub(super) async fn wait_for(
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
    pub(super) async fn hold_back_others(&mut self, slot: usize) -> Result<(), String> {
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
    pub(super) async fn let_others_go(&mut self) {
        for worker in &mut self.workers {
            worker.send("yield 0").await;
        }
    }

    /// Wait until no request of the contender in `slot` is under way and
    /// its next renewal is not due soon: its proxy has been quiet for 15 ms,
    /// but saw traffic (a renewal) within the last ttl/6. Renewals come every
    /// ttl/3, so the next one is at least ttl/6 away.
    pub(super) async fn wait_quiet(&self, slot: usize) -> bool {
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

    pub(super) async fn run(&mut self) -> Result<Vec<Event>, String> {
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

    /// Stop every contender (they finish their section) and wait for them.
    pub(super) async fn shutdown(&mut self) {
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

    pub(super) async fn analyse(&self, events: &[Event]) -> Result<ScenarioResult, RunError> {
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
        if self.fault == Fault::StopInTxn {
            let server = self.server().map_err(RunError::Failed)?;
            let log = super::txn::log(server, &self.key)
                .await
                .map_err(RunError::Failed)?;
            result.unfenced(&log);
        }
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
