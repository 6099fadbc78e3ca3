//! Clusters that the tests start themselves: a 3-member etcd cluster on
//! loopback ports, in a temporary directory.
//!
//! A test binary starts its cluster once ([`etcd_cluster`]) and its tests
//! share it, each test with its own lease names. Each member runs under a
//! small `sh` watchdog, in a process group of its own: dropping an
//! [`EtcdCluster`] kills the groups and deletes the directory; and since a
//! cluster kept for the whole test binary (a `static`) is never dropped, the
//! watchdog also kills its member and deletes the member's data within about
//! half a second once the test process is gone — after a panic, a normal
//! exit or a `SIGKILL` alike. Directories are named like those of
//! [`servers`](crate::servers) (`lease-servers.<pid>.<random>`), so the
//! clean-up of leftovers there covers them too.
//!
//! | server | found as | override |
//! |---|---|---|
//! | etcd | `etcd` on `PATH` (Debian's `etcd-server`) | `LEASE_ETCD` |

use std::path::PathBuf;
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
        let dir = std::env::temp_dir().join(format!(
            "{DIR_PREFIX}{}.{}",
            std::process::id(),
            crate::unique("etcd")
        ));
        std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
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
        use std::os::unix::process::CommandExt;
        let member = &self.members[i];
        // The watchdog: runs etcd, and kills it and deletes its data once
        // this process (the owner) or etcd is gone.
        let script = "owner=$1; data=$2; shift 2; \"$@\" & m=$!; \
             while kill -0 \"$owner\" 2>/dev/null && kill -0 \"$m\" 2>/dev/null; do sleep 0.5; done; \
             kill -9 \"$m\" 2>/dev/null; wait \"$m\" 2>/dev/null; \
             kill -0 \"$owner\" 2>/dev/null || rm -rf \"$data\"";
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(std::process::id().to_string())
            .arg(&self.dir)
            .arg(&self.etcd)
            .args(&member.args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
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
        if let Some(mut child) = member.child.take() {
            // The whole group: the watchdog and etcd.
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(format!("-{}", child.id()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = child.wait();
        }
    }
}

/// `GET /health` of the member at `port` answers healthy.
fn health(port: u16) -> bool {
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
