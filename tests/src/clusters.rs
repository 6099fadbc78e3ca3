//! Clusters that the tests start themselves: a 3-member etcd cluster and a
//! 3-master Redis Cluster on loopback ports, in temporary directories.
//!
//! A test binary starts each cluster once ([`etcd_cluster`],
//! [`redis_cluster`]) and its tests
//! share it, each test with its own lease names. Each member runs under a
//! small `sh` watchdog, in a process group of its own: dropping an
//! [`EtcdCluster`] or a [`RedisCluster`] kills the groups and deletes the directory; and since a
//! cluster kept for the whole test binary (a `static`) is never dropped, the
//! watchdog also kills its server and deletes the cluster's data within about
//! half a second once the test process is gone — after a panic, a normal
//! exit or a `SIGKILL` alike. Directories are named like those of
//! [`servers`](crate::servers) (`lease-servers.<pid>.<random>`), so the
//! clean-up of leftovers there covers them too.
//!
//! | server | found as | override |
//! |---|---|---|
//! | etcd | `etcd` on `PATH` (Debian's `etcd-server`) | `LEASE_ETCD` |
//! | Redis Cluster | `redis-server`, `redis-cli` on `PATH` | `LEASE_REDIS_SERVER`, `LEASE_REDIS_CLI` |

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::servers::{DIR_PREFIX, binary, free_port, kill_leftovers};

/// How long the cluster may take to become healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One member of an [`EtcdCluster`].
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    /// The watchdog `sh`, leader of the member's process group.
    child: Option<Child>,
    /// The arguments of `etcd` (to start it again).
    args: Vec<String>,
}

/// A 3-member etcd cluster on 127.0.0.1, started by this process; stopped
/// and deleted on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: PathBuf,
    etcd: PathBuf,
    members: Vec<Member>,
}

/// The etcd cluster of this test binary, started by the first caller;
/// `None` (after the `skipped:` line) when `etcd` is not installed and
/// `LEASE_REQUIRE_SERVICES` is not set.
///
/// # Panics
///
/// When the cluster does not come up and services are required.
pub fn etcd_cluster() -> Option<&'static EtcdCluster> {
    static CLUSTER: OnceLock<Result<EtcdCluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(|| EtcdCluster::start(3)) {
        Ok(cluster) => Some(cluster),
        Err(e) if crate::services_required() => panic!("no etcd cluster: {e}"),
        Err(e) => {
            println!("skipped: no etcd cluster ({e})");
            None
        }
    }
}

impl EtcdCluster {
    /// Start `n` members with short raft timers (heartbeat 50 ms, election
    /// 500 ms: etcd's minimum lease TTL is then 1 s) and wait until every
    /// member reports itself healthy.
    ///
    /// # Errors
    ///
    /// When `etcd` is missing or the cluster does not become healthy; the
    /// message includes the members' logs.
    pub fn start(n: usize) -> Result<Self, String> {
        kill_leftovers();
        let etcd = binary("LEASE_ETCD", &["etcd"], &[])?;
        let dir = temp_dir("etcd")?;
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_, String>>()?;
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let token = crate::unique("cluster");
        let mut cluster = Self {
            dir,
            etcd,
            members: Vec::new(),
        };
        for (i, &(client, peer)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let data = cluster.dir.join(&name);
            let args = vec![
                format!("--name={name}"),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls=http://127.0.0.1:{client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-cluster={}", initial.join(",")),
                format!("--initial-cluster-token={token}"),
                "--initial-cluster-state=new".to_owned(),
                "--heartbeat-interval=50".to_owned(),
                "--election-timeout=500".to_owned(),
                "--logger=zap".to_owned(),
                format!(
                    "--log-outputs={}",
                    cluster.dir.join(format!("{name}.log")).display()
                ),
            ];
            cluster.members.push(Member {
                name,
                client_port: client,
                child: None,
                args,
            });
        }
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_healthy(READY_TIMEOUT)?;
        Ok(cluster)
    }

    /// The client URLs of the members, `http://127.0.0.1:<port>`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The directory of the cluster (data and logs).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Start member `i` under its watchdog, in a process group of its own.
    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let member = &self.members[i];
        let child = watched(&self.dir, &self.etcd, &member.args)
            .map_err(|e| format!("start etcd member {}: {e}", member.name))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    fn wait_healthy(&self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if self.members.iter().all(|m| health(m.client_port)) {
                return Ok(());
            }
            if start.elapsed() > timeout {
                let logs: Vec<String> = self
                    .members
                    .iter()
                    .map(|m| format!("{}: {}", m.name, self.log_tail(&m.name)))
                    .collect();
                return Err(format!(
                    "the etcd cluster is not healthy after {timeout:?}:\n{}",
                    logs.join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_tail(&self, name: &str) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }

    fn kill_member(member: &mut Member) {
        if let Some(child) = member.child.take() {
            kill_group(child);
        }
    }
}

/// Run `program args` under a `sh` watchdog, in a process group of its own
/// (led by the watchdog), in `dir`: once this process or the program is
/// gone, the watchdog kills the program and — if this process is gone —
/// deletes `dir`.
pub(crate) fn watched(dir: &Path, program: &Path, args: &[String]) -> Result<Child, String> {
    watched_for(std::process::id(), dir, program, args)
}

/// [`watched`], for the process `owner` (tests use another owner).
fn watched_for(owner: u32, dir: &Path, program: &Path, args: &[String]) -> Result<Child, String> {
    use std::os::unix::process::CommandExt;
    // `kill -0` alone would count a dead but unreaped owner (a zombie) as
    // alive: its parent may not have waited for it yet, or it was orphaned
    // under an init that never reaps (as in some containers).
    let script = "owner=$1; dir=$2; shift 2; \"$@\" & m=$!; \
         alive() { kill -0 \"$1\" 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' /proc/\"$1\"/status; }; \
         while alive \"$owner\" && kill -0 \"$m\" 2>/dev/null; do sleep 0.5; done; \
         kill -9 \"$m\" 2>/dev/null; wait \"$m\" 2>/dev/null; \
         alive \"$owner\" || rm -rf \"$dir\"";
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(owner.to_string())
        .arg(dir)
        .arg(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| e.to_string())
}

/// Kill the process group led by `child` (a [`watched`] watchdog and its program).
pub(crate) fn kill_group(mut child: Child) {
    // `--`: procps' `kill -KILL -PGID` (without it) exits 0 having killed
    // nothing, and the `wait` below would then wait for ever.
    let _ = Command::new("kill")
        .arg("-KILL")
        .arg("--")
        .arg(format!("-{}", child.id()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
}

/// A temporary directory named like those of [`servers`](crate::servers).
pub(crate) fn temp_dir(what: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "{DIR_PREFIX}{}.{}",
        std::process::id(),
        crate::unique(what)
    ));
    std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A Redis Cluster on 127.0.0.1 (no persistence), made with `redis-cli
/// --cluster create`: 3 masters for the conformance tests
/// ([`redis_cluster`]), 3 masters with a replica each for the fault suite
/// ([`RedisCluster::with_replicas`]); stopped and deleted on drop.
#[derive(Debug)]
pub struct RedisCluster {
    dir: PathBuf,
    server: PathBuf,
    ports: Vec<u16>,
    /// The arguments of each node's `redis-server` (to start it again).
    args: Vec<Vec<String>>,
    /// Each node's watchdog; `None` while the node is killed.
    children: Vec<Option<Child>>,
}

/// The Redis Cluster of this test binary, started by the first caller;
/// `None` (after the `skipped:` line) when `redis-server` or `redis-cli`
/// is missing and `LEASE_REQUIRE_SERVICES` is not set.
///
/// # Panics
///
/// When the cluster does not come up and services are required.
pub fn redis_cluster() -> Option<&'static RedisCluster> {
    static CLUSTER: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(|| RedisCluster::start(3)) {
        Ok(cluster) => Some(cluster),
        Err(e) if crate::services_required() => panic!("no redis cluster: {e}"),
        Err(e) => {
            println!("skipped: no redis cluster ({e})");
            None
        }
    }
}

impl RedisCluster {
    /// Start `n` masters and join them into one cluster (every hash slot
    /// served), waiting until each node reports `cluster_state:ok`.
    ///
    /// # Errors
    ///
    /// When the binaries are missing or the cluster does not come up.
    pub fn start(n: usize) -> Result<Self, String> {
        Self::start_with(n, 0, 2000)
    }

    /// Start `masters` masters with one replica each, and a
    /// `cluster-node-timeout` of `node_timeout_ms`: a master that stops
    /// answering for that long is failed over to its replica (the fault
    /// suite's `master-kill`).
    ///
    /// # Errors
    ///
    /// When the binaries are missing or the cluster does not come up.
    pub fn with_replicas(masters: usize, node_timeout_ms: u32) -> Result<Self, String> {
        Self::start_with(masters, 1, node_timeout_ms)
    }

    fn start_with(masters: usize, replicas: usize, node_timeout_ms: u32) -> Result<Self, String> {
        kill_leftovers();
        let server = binary("LEASE_REDIS_SERVER", &["redis-server"], &[])?;
        let cli = binary("LEASE_REDIS_CLI", &["redis-cli"], &[])?;
        let dir = temp_dir("redis-cluster")?;
        let mut cluster = Self {
            dir,
            server,
            ports: Vec::new(),
            args: Vec::new(),
            children: Vec::new(),
        };
        for i in 0..masters * (1 + replicas) {
            let (port, bus) = (free_port()?, free_port()?);
            let args = vec![
                "--bind".to_owned(),
                "127.0.0.1".to_owned(),
                "--port".to_owned(),
                port.to_string(),
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-port".to_owned(),
                bus.to_string(),
                "--cluster-config-file".to_owned(),
                cluster
                    .dir
                    .join(format!("nodes-{i}.conf"))
                    .display()
                    .to_string(),
                "--cluster-node-timeout".to_owned(),
                node_timeout_ms.to_string(),
                "--save".to_owned(),
                String::new(),
                "--appendonly".to_owned(),
                "no".to_owned(),
                "--dir".to_owned(),
                cluster.dir.display().to_string(),
                "--logfile".to_owned(),
                cluster
                    .dir
                    .join(format!("redis-{i}.log"))
                    .display()
                    .to_string(),
            ];
            cluster
                .children
                .push(Some(watched(&cluster.dir, &cluster.server, &args)?));
            cluster.args.push(args);
            cluster.ports.push(port);
        }
        let start = Instant::now();
        while !cluster.ports.iter().all(|&p| ping(p)) {
            if start.elapsed() > READY_TIMEOUT {
                return Err("the redis nodes did not start".to_owned());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        cluster.wait_ok(READY_TIMEOUT)?;
        // Replicas are told their master by `--cluster create`; wait until
        // each has one and is in sync with it.
        while replicas > 0 && cluster.nodes_table().iter().filter(|n| n.master).count() != masters {
            if start.elapsed() > READY_TIMEOUT {
                return Err("the redis cluster's replicas did not attach".to_owned());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    /// The nodes' URLs, `redis://127.0.0.1:<port>`.
    pub fn nodes(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The nodes' ports, in the order of [`nodes`](RedisCluster::nodes).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The directory of the cluster (nodes' configurations and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Wait until every running node reports `cluster_state:ok`.
    ///
    /// # Errors
    ///
    /// When that takes longer than `timeout`.
    pub fn wait_ok(&self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        while !self.running().all(|i| cluster_ok(self.ports[i])) {
            if start.elapsed() > timeout {
                return Err(format!("the redis cluster is not ok after {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The indexes of the nodes that are not killed.
    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.ports.len()).filter(|&i| self.children[i].is_some())
    }

    /// `CLUSTER NODES` as some running node sees it.
    fn nodes_table(&self) -> Vec<NodeLine> {
        for i in self.running() {
            let reply = redis_inline(self.ports[i], "CLUSTER NODES");
            let table: Vec<NodeLine> = reply.lines().filter_map(NodeLine::parse).collect();
            if !table.is_empty() {
                return table;
            }
        }
        Vec::new()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT` on a running node).
    ///
    /// # Errors
    ///
    /// When no running node answers.
    pub fn keyslot(&self, key: &str) -> Result<u16, String> {
        for i in self.running() {
            let reply = redis_inline(self.ports[i], &format!("CLUSTER KEYSLOT {key}"));
            if let Some(slot) = reply
                .lines()
                .next()
                .and_then(|l| l.strip_prefix(':'))
                .and_then(|n| n.trim().parse().ok())
            {
                return Ok(slot);
            }
        }
        Err(format!("no node answered CLUSTER KEYSLOT {key}"))
    }

    /// The node (index) that the running nodes see as the master of `slot`,
    /// if it is not marked failed.
    pub fn master_of(&self, slot: u16) -> Option<usize> {
        let table = self.nodes_table();
        let master = table
            .iter()
            .find(|n| n.master && !n.failed && n.slots.iter().any(|r| r.contains(&slot)))?;
        self.ports.iter().position(|&p| p == master.port)
    }

    /// The replicas (indexes) of the node at `index`.
    pub fn replicas_of(&self, index: usize) -> Vec<usize> {
        let table = self.nodes_table();
        let Some(id) = table
            .iter()
            .find(|n| n.port == self.ports[index])
            .map(|n| n.id.clone())
        else {
            return Vec::new();
        };
        table
            .iter()
            .filter(|n| n.master_id == id)
            .filter_map(|n| self.ports.iter().position(|&p| p == n.port))
            .collect()
    }

    /// Send one inline command to the node at `index`; its reply.
    pub fn command(&self, index: usize, command: &str) -> String {
        redis_inline(self.ports[index], command)
    }

    /// `SIGKILL` the node at `index` (and its watchdog).
    pub fn kill(&mut self, index: usize) {
        if let Some(child) = self.children[index].take() {
            kill_group(child);
        }
    }

    /// Start the node at `index` again, with its configuration file (it
    /// rejoins the cluster; its data is gone: no persistence); waits until
    /// it answers `PING`.
    ///
    /// # Errors
    ///
    /// When it does not start within 10 s.
    pub fn restart(&mut self, index: usize) -> Result<(), String> {
        self.kill(index);
        self.children[index] = Some(watched(&self.dir, &self.server, &self.args[index])?);
        let start = Instant::now();
        while !ping(self.ports[index]) {
            if start.elapsed() > Duration::from_secs(10) {
                return Err(format!("redis node {index} did not start again"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    /// The id of its master, for a replica (`-` for a master).
    master_id: String,
    slots: Vec<std::ops::RangeInclusive<u16>>,
}

impl NodeLine {
    /// `<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`
    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 || fields[0].len() != 40 {
            return None;
        }
        let addr = fields[1].split('@').next()?;
        let port = addr.rsplit(':').next()?.parse().ok()?;
        let flags: Vec<&str> = fields[2].split(',').collect();
        let slots = fields[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some(a.parse().ok()?..=b.parse().ok()?),
                None => {
                    let n = s.parse().ok()?;
                    Some(n..=n)
                }
            })
            .collect();
        Some(Self {
            id: fields[0].to_owned(),
            port,
            master: flags.contains(&"master"),
            failed: flags.iter().any(|f| *f == "fail" || *f == "fail?"),
            master_id: fields[3].to_owned(),
            slots,
        })
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in self.children.drain(..).flatten() {
            kill_group(child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Send one inline command to the Redis at `port`; its reply (best effort).
fn redis_inline(port: u16, command: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    ) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream
        .write_all(format!("{command}\r\nQUIT\r\n").as_bytes())
        .is_err()
    {
        return String::new();
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply
}

fn ping(port: u16) -> bool {
    redis_inline(port, "PING").starts_with("+PONG")
}

fn cluster_ok(port: u16) -> bool {
    redis_inline(port, "CLUSTER INFO").contains("cluster_state:ok")
}

/// `GET /health` of the member at `port` answers healthy.
pub(crate) fn health(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    ) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.contains("\"health\":\"true\"")
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            Self::kill_member(member);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::servers::{process_group, running};

    /// The running processes of process group `pgid`, other than its leader.
    fn members(pgid: u32) -> Vec<u32> {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != pgid && process_group(pid) == Some(pgid) && running(pid))
            .collect()
    }

    /// An owner process, a directory named after it, and a watched `sleep`
    /// whose command line (like Redis', which renames itself) does not name
    /// the directory.
    fn setup() -> (Child, PathBuf, Child, u32) {
        let owner = Command::new("sleep").arg("600").spawn().expect("owner");
        let dir = std::env::temp_dir().join(format!(
            "{DIR_PREFIX}{}.{}",
            owner.id(),
            crate::unique("watchdog-test")
        ));
        std::fs::create_dir(&dir).expect("dir");
        let sleep = binary("SLEEP", &["sleep"], &[]).expect("sleep");
        let watchdog =
            watched_for(owner.id(), &dir, &sleep, &["600".to_owned()]).expect("watchdog");
        let start = Instant::now();
        let program = loop {
            if let Some(&pid) = members(watchdog.id()).first() {
                break pid;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the program did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        (owner, dir, watchdog, program)
    }

    fn gone_within(pid: u32, limit: Duration) -> bool {
        let start = Instant::now();
        while running(pid) {
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// The clean-up of leftovers, run the moment the owner is gone (before
    /// its watchdog's next look), ends the watched program too — which does
    /// not name the directory on its command line — not only the watchdog.
    #[test]
    fn leftovers_are_killed_with_their_whole_group() {
        let (mut owner, dir, watchdog, program) = setup();
        owner.kill().expect("kill owner");
        owner.wait().expect("reap owner");
        kill_leftovers();
        let gone = gone_within(program, Duration::from_secs(3));
        kill_group(watchdog);
        crate::servers::signal(program, "KILL");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            gone,
            "the watched program outlived the clean-up of its watchdog"
        );
    }

    /// An owner that died but was not reaped (a zombie: its parent has not
    /// waited for it, or it was orphaned under an init that never reaps)
    /// counts as gone: the watchdog ends its program.
    #[test]
    fn a_zombie_owner_counts_as_gone() {
        let (mut owner, dir, watchdog, program) = setup();
        owner.kill().expect("kill owner");
        let gone = gone_within(program, Duration::from_secs(5));
        let _ = owner.wait();
        kill_group(watchdog);
        crate::servers::signal(program, "KILL");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            gone,
            "the watchdog kept its program while the owner was a zombie"
        );
    }
}
