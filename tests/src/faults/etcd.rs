//! The etcd cluster of the fault suite: [`Cluster`], 3 members on loopback
//! ports whose raft peer traffic passes through fault proxies, so that a
//! member can be cut off from the others in both directions; and the
//! nemesis' tools for it (find the leader, kill, pause or partition a
//! member, crash them all).
//!
//! # The peer network
//!
//! etcd member `i` sends its raft messages to member `j` over connections
//! that `i` opens to `j`'s advertised peer URL — and receives `j`'s messages
//! for it over connections that `i` opened too (a stream is a `GET` whose
//! answer never ends). Cutting what arrives at one member's peer URL would
//! therefore cut only half of its traffic: it would still send to the
//! others, and hear from them, on the connections it opened itself.
//!
//! So each member advertises a peer URL that is a *dispatcher* of this
//! module, not its own listening port. The dispatcher of member `j` finds
//! out which member opened each connection it accepts — the kernel knows:
//! the connecting socket (its local port is the accepted connection's
//! remote port) is listed in `/proc/net/tcp` with an inode, and that inode
//! is an open file of exactly one member process (`/proc/<pid>/fd`) — and
//! hands the connection to the [`FaultProxy`] of the ordered pair `(i, j)`,
//! which forwards it to `j`'s real peer port. [`Cluster::partition`]
//! black-holes every pair that has the member at either end: nothing gets
//! from it to the others or back, on any connection, whoever opened it; its
//! clients still reach it. [`Cluster::heal`] delivers what was held, as TCP
//! would once a partition heals. A connection whose opener cannot be found
//! (none has been seen; [`Cluster::unidentified`] counts them) goes straight
//! to the member, and would not be cut.
//!
//! Each member runs under the watchdog of [`crate::clusters`] (which also
//! cleans up after a crash of this process); its etcd process is found as
//! the watchdog's child, to signal it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::clusters::{health, kill_group, temp_dir, watched};
use crate::proxy::{FaultProxy, Mode};
use crate::servers::{binary, free_port, kill_leftovers, signal};

/// The members' raft heartbeat (`--heartbeat-interval`).
pub const HEARTBEAT: Duration = Duration::from_millis(50);
/// The members' election timeout (`--election-timeout`): a follower that
/// hears nothing from its leader for this long starts an election. With
/// [`HEARTBEAT`], etcd's minimum lease TTL is 1.5 election timeouts rounded
/// up to whole seconds: 1 s.
pub const ELECTION_TIMEOUT: Duration = Duration::from_millis(500);
/// How often etcd's leader looks for expired leases (its lessor's loop
/// checks every 500 ms, a constant of etcd's); an expired lease is then
/// revoked through raft.
pub const EXPIRY_CHECK: Duration = Duration::from_millis(500);

/// The HTTP/2 keep-alive of the clients' connections, as
/// `leasehold::backend::Etcd::connect` sets it: a PING this often, and this long
/// for its answer before the connection is closed.
pub const CLIENT_KEEP_ALIVE: (Duration, Duration) =
    (Duration::from_secs(5), Duration::from_secs(2));

/// How long the cluster may take to become healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One member of a [`Cluster`].
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    /// The arguments of `etcd` (to start it again).
    args: Vec<String>,
    /// The watchdog `sh`, leader of the member's process group.
    child: Option<Child>,
    /// Stopped by [`Cluster::pause`].
    paused: bool,
}

/// Connections member `i` opened to member `j`'s peer URL, by `(i, j)`.
type Links = Vec<Vec<Option<FaultProxy>>>;

/// A 3-member etcd cluster whose peer traffic goes through fault proxies
/// (see the [module docs](self)); stopped and deleted on drop.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    etcd: PathBuf,
    members: Vec<Member>,
    /// The etcd process of each member while it runs.
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    links: Arc<Links>,
    unidentified: Arc<AtomicUsize>,
    dispatchers: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    /// Start `n` members (heartbeat [`HEARTBEAT`], election timeout
    /// [`ELECTION_TIMEOUT`]) with their peer traffic through the proxies,
    /// and wait until every member reports itself healthy.
    ///
    /// # Errors
    ///
    /// When `etcd` is missing or the cluster does not become healthy.
    pub async fn start(n: usize) -> Result<Self, String> {
        kill_leftovers();
        let etcd = binary("LEASE_ETCD", &["etcd"], &[])?;
        let dir = temp_dir("etcd-faults")?;
        let mut listeners = Vec::new();
        let mut advertised = Vec::new();
        let mut real = Vec::new();
        for _ in 0..n {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| e.to_string())?;
            advertised.push(listener.local_addr().map_err(|e| e.to_string())?);
            listeners.push(listener);
            real.push(SocketAddr::from(([127, 0, 0, 1], free_port()?)));
        }
        let mut links: Links = Vec::new();
        for i in 0..n {
            let mut row = Vec::new();
            for (j, &to) in real.iter().enumerate() {
                row.push(if i == j {
                    None
                } else {
                    Some(FaultProxy::start(to).await)
                });
            }
            links.push(row);
        }
        let links = Arc::new(links);
        let pids = Arc::new(Mutex::new(vec![None; n]));
        let unidentified = Arc::new(AtomicUsize::new(0));
        let mut dispatchers = Vec::new();
        for (j, listener) in listeners.into_iter().enumerate() {
            dispatchers.push(tokio::spawn(dispatch(
                listener,
                j,
                real[j],
                links.clone(),
                pids.clone(),
                unidentified.clone(),
            )));
        }
        let initial: Vec<String> = advertised
            .iter()
            .enumerate()
            .map(|(i, a)| format!("m{i}=http://{a}"))
            .collect();
        let token = crate::unique("faults");
        let mut members = Vec::new();
        for i in 0..n {
            let name = format!("m{i}");
            let client_port = free_port()?;
            let args = vec![
                format!("--name={name}"),
                format!("--data-dir={}", dir.join(&name).display()),
                format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
                format!("--listen-peer-urls=http://{}", real[i]),
                format!("--initial-advertise-peer-urls=http://{}", advertised[i]),
                format!("--initial-cluster={}", initial.join(",")),
                format!("--initial-cluster-token={token}"),
                "--initial-cluster-state=new".to_owned(),
                format!("--heartbeat-interval={}", HEARTBEAT.as_millis()),
                format!("--election-timeout={}", ELECTION_TIMEOUT.as_millis()),
                "--logger=zap".to_owned(),
                format!(
                    "--log-outputs={}",
                    dir.join(format!("{name}.log")).display()
                ),
            ];
            members.push(Member {
                name,
                client_port,
                args,
                child: None,
                paused: false,
            });
        }
        let mut cluster = Self {
            dir,
            etcd,
            members,
            pids,
            links,
            unidentified,
            dispatchers,
        };
        for i in 0..n {
            cluster.start_member(i).await?;
        }
        cluster.wait_healthy().await?;
        Ok(cluster)
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never: a cluster has members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members' client addresses (not proxied).
    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.members
            .iter()
            .map(|m| SocketAddr::from(([127, 0, 0, 1], m.client_port)))
            .collect()
    }

    /// The members' client URLs, `http://127.0.0.1:<port>`.
    pub fn endpoints(&self) -> Vec<String> {
        self.client_addrs()
            .iter()
            .map(|a| format!("http://{a}"))
            .collect()
    }

    /// The etcd process of member `i` while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.pids.lock().unwrap_or_else(|e| e.into_inner())[i]
    }

    /// The directory of the cluster (data and logs).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// `etcd --version`'s first line, for reports.
    pub fn version(&self) -> String {
        std::process::Command::new(&self.etcd)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .map(|l| l.replace("etcd Version:", "etcd").trim().to_owned())
            })
            .unwrap_or_else(|| "etcd (unknown version)".to_owned())
    }

    /// Peer connections whose opener could not be found (they bypass the
    /// partition: see the [module docs](self)).
    pub fn unidentified(&self) -> usize {
        self.unidentified.load(Ordering::Relaxed)
    }

    /// Connections member `from` opened to member `to`'s peer URL so far.
    pub fn peer_connections(&self, from: usize, to: usize) -> u64 {
        self.links[from][to]
            .as_ref()
            .map_or(0, FaultProxy::accepted)
    }

    /// Start member `i` (again) under its watchdog and find its etcd process.
    async fn start_member(&mut self, i: usize) -> Result<(), String> {
        let member = &self.members[i];
        let child = watched(&self.dir, &self.etcd, &member.args)
            .map_err(|e| format!("start etcd member {}: {e}", member.name))?;
        let watchdog = child.id();
        self.members[i].child = Some(child);
        self.members[i].paused = false;
        let limit = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(pid) = child_of(watchdog, "etcd") {
                self.pids.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(pid);
                return Ok(());
            }
            if Instant::now() > limit {
                return Err(format!(
                    "etcd member {} did not start",
                    self.members[i].name
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `SIGKILL` member `i` (and its watchdog) and wait until it is gone.
    pub fn kill(&mut self, i: usize) {
        if let Some(child) = self.members[i].child.take() {
            kill_group(child);
        }
        self.members[i].paused = false;
        self.pids.lock().unwrap_or_else(|e| e.into_inner())[i] = None;
    }

    /// Start member `i` again after [`kill`](Self::kill), on its data.
    ///
    /// # Errors
    ///
    /// When it cannot be started.
    pub async fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.members[i].child.is_none() {
            self.start_member(i).await?;
        }
        Ok(())
    }

    /// `SIGSTOP` member `i`'s etcd process.
    pub fn pause(&mut self, i: usize) {
        if let Some(pid) = self.pid(i) {
            signal(pid, "STOP");
            self.members[i].paused = true;
        }
    }

    /// `SIGCONT` member `i`'s etcd process.
    pub fn resume(&mut self, i: usize) {
        if let Some(pid) = self.pid(i) {
            signal(pid, "CONT");
        }
        self.members[i].paused = false;
    }

    /// Cut member `i` off from every other member, in both directions, on
    /// every connection (see the [module docs](self)); its clients still
    /// reach it.
    pub fn partition(&self, i: usize) {
        for j in (0..self.len()).filter(|&j| j != i) {
            for (a, b) in [(i, j), (j, i)] {
                if let Some(link) = &self.links[a][b] {
                    link.set_mode(Mode::BlackHole);
                }
            }
        }
    }

    /// End every partition: what was held back is delivered.
    pub fn heal(&self) {
        for link in self.links.iter().flatten().flatten() {
            link.set_mode(Mode::Pass);
        }
    }

    /// `SIGKILL` every member, wait `down`, start them all again, and wait
    /// until the cluster is healthy; returns how long that took.
    ///
    /// # Errors
    ///
    /// When the cluster does not come back.
    pub async fn crash_all(&mut self, down: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        for i in 0..self.len() {
            self.kill(i);
        }
        tokio::time::sleep(down).await;
        for i in 0..self.len() {
            self.start_member(i).await?;
        }
        self.wait_healthy().await?;
        Ok(start.elapsed())
    }

    /// Undo every fault (heal, `SIGCONT`, start the members that are down)
    /// and wait until every member reports itself healthy.
    ///
    /// # Errors
    ///
    /// When the cluster does not become healthy.
    pub async fn ensure_healthy(&mut self) -> Result<(), String> {
        self.heal();
        for i in 0..self.len() {
            if self.members[i].paused {
                self.resume(i);
            }
            self.restart(i).await?;
        }
        self.wait_healthy().await
    }

    async fn wait_healthy(&self) -> Result<(), String> {
        let ports: Vec<u16> = self.members.iter().map(|m| m.client_port).collect();
        let limit = Instant::now() + READY_TIMEOUT;
        loop {
            let ports = ports.clone();
            let healthy = tokio::task::spawn_blocking(move || ports.iter().all(|&p| health(p)))
                .await
                .unwrap_or(false);
            if healthy {
                return Ok(());
            }
            if Instant::now() > limit {
                let logs: Vec<String> = self
                    .members
                    .iter()
                    .map(|m| format!("{}: {}", m.name, self.log_tail(&m.name)))
                    .collect();
                return Err(format!(
                    "the etcd cluster is not healthy after {READY_TIMEOUT:?}:\n{}",
                    logs.join("\n")
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tail(&self, name: &str) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }

    /// Member `i`'s answer to a maintenance `Status`: its own member id and
    /// the leader it knows of (0: none); `None` if it does not answer within
    /// 500 ms (down, paused).
    pub async fn status(&self, i: usize) -> Option<(u64, u64)> {
        self.status_term(i)
            .await
            .map(|(id, leader, _)| (id, leader))
    }

    /// [`status`](Self::status) and the raft term member `i` is in.
    pub async fn status_term(&self, i: usize) -> Option<(u64, u64, u64)> {
        let url = format!("http://127.0.0.1:{}", self.members[i].client_port);
        let ask = async {
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_millis(500))
                .with_timeout(Duration::from_millis(500));
            let mut client = etcd_client::Client::connect([url], Some(options))
                .await
                .ok()?;
            let status = client.status().await.ok()?;
            let header = status.header()?;
            Some((header.member_id(), status.leader(), header.raft_term()))
        };
        tokio::time::timeout(Duration::from_millis(500), ask)
            .await
            .ok()
            .flatten()
    }

    /// The member that leads now, by asking every member
    /// ([`status`](Self::status)): the one that answers and names itself
    /// leader, and that most of the cluster names too — a majority, so that
    /// a cut-off member that still believes it leads is not taken for the
    /// leader, nor a dead or paused leader that the others have not missed
    /// yet. `None` while there is no such member.
    pub async fn leader(&self) -> Option<usize> {
        let mut answers = Vec::new();
        for i in 0..self.len() {
            answers.push(self.status(i).await);
        }
        let majority = self.len() / 2 + 1;
        answers.iter().position(|answer| {
            answer.is_some_and(|(id, leader)| {
                id == leader
                    && answers
                        .iter()
                        .filter(|a| a.is_some_and(|(_, named)| named == id))
                        .count()
                        >= majority
            })
        })
    }

    /// [`leader`](Self::leader), waiting for one for at most `limit`.
    ///
    /// # Errors
    ///
    /// When no leader is found in time.
    pub async fn wait_leader(&self, limit: Duration) -> Result<usize, String> {
        let until = Instant::now() + limit;
        loop {
            if let Some(leader) = self.leader().await {
                return Ok(leader);
            }
            if Instant::now() > until {
                return Err(format!("the etcd cluster had no leader within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for task in &self.dispatchers {
            task.abort();
        }
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if std::env::var_os("LEASE_FAULTS_TRACE").is_some() {
            // Kept for the person reading the run: the members' logs.
            tracing::info!(dir = %self.dir.display(), "etcd cluster directory kept");
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The dispatcher at member `to`'s advertised peer URL: each connection goes
/// to the proxy of the member that opened it and `to` (see the [module
/// docs](self)).
async fn dispatch(
    listener: TcpListener,
    to: usize,
    upstream: SocketAddr,
    links: Arc<Links>,
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    unidentified: Arc<AtomicUsize>,
) {
    let Ok(local) = listener.local_addr() else {
        return;
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut inbound, peer)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let links = links.clone();
                let pids = pids.clone();
                let unidentified = unidentified.clone();
                connections.spawn(async move {
                    let from = opener(&pids, peer.port(), local.port()).await;
                    let target = match from.and_then(|i| links[i][to].as_ref()) {
                        Some(link) => link.addr(),
                        None => {
                            unidentified.fetch_add(1, Ordering::Relaxed);
                            upstream
                        }
                    };
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Which member's process holds the socket with local port `port`
/// connected to port `to` (tried for up to 50 ms: the table can lag).
async fn opener(pids: &Mutex<Vec<Option<u32>>>, port: u16, to: u16) -> Option<usize> {
    for _ in 0..10 {
        if let Some(inode) = socket_inode(port, to) {
            let link = format!("socket:[{inode}]");
            let pids = pids.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(i) = pids
                .iter()
                .position(|pid| pid.is_some_and(|pid| holds(pid, &link)))
            {
                return Some(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// The inode of the TCP socket with local port `port` and remote port `to`,
/// from `/proc/net/tcp` and `/proc/net/tcp6`.
fn socket_inode(port: u16, to: u16) -> Option<String> {
    let port_of = |address: &str| {
        address
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .into_iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .find_map(|text| {
            text.lines().skip(1).find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                (fields.len() > 9
                    && port_of(fields[1]) == Some(port)
                    && port_of(fields[2]) == Some(to)
                    && fields[9] != "0")
                    .then(|| fields[9].to_owned())
            })
        })
}

/// Does process `pid` have `link` (`socket:[<inode>]`) open?
fn holds(pid: u32, link: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == link))
}

/// The child process of `parent` named `name`, from `/proc/<pid>/stat`.
fn child_of(parent: u32, name: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // `pid (comm) state ppid ...`: comm may hold spaces.
                let Some((head, rest)) = stat.rsplit_once(')') else {
                    return false;
                };
                head.split_once('(').is_some_and(|(_, comm)| comm == name)
                    && rest
                        .split_whitespace()
                        .nth(1)
                        .and_then(|p| p.parse::<u32>().ok())
                        == Some(parent)
            })
        })
}
