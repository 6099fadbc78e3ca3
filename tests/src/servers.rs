//! Private database servers that a test (or a benchmark) starts, faults and
//! tears down itself: PostgreSQL, MariaDB/MySQL and Redis (also as a
//! one-node Redis Cluster), each on a free port of 127.0.0.1 with its data
//! in a fresh temporary directory.
//!
//! The shared test servers (`LEASE_*_URL`) serve every test binary of the
//! workspace at once, so a test must never stop them or kill their clients'
//! connections. A fault-injection test runs the backend under test on one of
//! these instead, where it may [`crash`](PrivateServer::crash) and
//! [`restart`](PrivateServer::restart) the server and kill any connection.
//!
//! ```no_run
//! # async fn f() -> Result<(), String> {
//! use lease_tests::servers::PrivateServer;
//!
//! let mut pg = PrivateServer::postgres().await?;
//! let pool = sqlx::PgPool::connect(&pg.url()).await.map_err(|e| e.to_string())?;
//! let down = pg.restart().await?; // immediate shutdown, then start again
//! println!("{} was down for {down:?}", pg.version().await);
//! drop(pg); // stops the server and deletes its directory
//! # drop(pool); Ok(()) }
//! ```
//!
//! # Binaries
//!
//! | server | found as | override |
//! |---|---|---|
//! | PostgreSQL | `initdb`, `postgres` in the newest `/usr/lib/postgresql/*/bin`, else on `PATH` | `LEASE_PG_BIN` (a directory) |
//! | MariaDB | `mariadb-install-db` and `mariadbd` (`/usr/sbin` or `PATH`) | `LEASE_MARIADBD`, `LEASE_MARIADB_INSTALL_DB` |
//! | Redis | `redis-server` on `PATH` | `LEASE_REDIS_SERVER` |
//!
//! PostgreSQL and MariaDB refuse to run as root: when this process is root,
//! they run as the `postgres` and `mysql` accounts (their directories are
//! handed to those accounts).
//!
//! # Cleaning up
//!
//! Dropping a [`PrivateServer`] kills its process and deletes its directory,
//! also while a panic unwinds. A process that is itself killed cannot do
//! that; the directories are named `lease-servers.<pid>.<random>` after the
//! process that made them, and every new `PrivateServer` first kills the
//! servers (and deletes the directories) of such processes that no longer
//! exist.
//!
//! # Durability settings
//!
//! PostgreSQL runs with `fsync=off`: every commit is still written to the
//! WAL (the operating system's cache) before it is acknowledged, so a crash
//! of the server *process* — which is what [`crash`](PrivateServer::crash)
//! does — loses nothing; only a crash of the whole machine could. MariaDB
//! keeps its defaults (`innodb_flush_log_at_trx_commit=1`). Redis persists
//! only if asked ([`RedisPersistence`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;

/// How long a server may take to accept connections after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Prefix of the directories of private servers in the temporary directory.
pub(crate) const DIR_PREFIX: &str = "lease-servers.";

/// What a private Redis keeps across a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisPersistence {
    /// `--save "" --appendonly no`: a restart loses every key.
    None,
    /// `--appendonly yes --appendfsync always`: every write is in the
    /// append-only file before it is acknowledged, so a crash loses nothing.
    AppendFsyncAlways,
}

/// Which server a [`PrivateServer`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// PostgreSQL (`initdb` + `postgres`).
    Postgres,
    /// MariaDB (`mariadb-install-db` + `mariadbd`).
    MariaDb,
    /// Redis (`redis-server`).
    Redis(RedisPersistence),
}

/// A database server that this process started on a free port, in a
/// directory of its own; stopped and deleted on drop.
#[derive(Debug)]
pub struct PrivateServer {
    kind: ServerKind,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    /// The account the server runs as (`None`: this process's own).
    account: Option<(u32, u32)>,
    /// Redis only: started with `--cluster-enabled yes` ([`redis_cluster`](Self::redis_cluster)).
    cluster: bool,
}

impl PrivateServer {
    /// Initialise a PostgreSQL cluster (`initdb`, trust authentication,
    /// superuser `postgres`) and start it; connect to [`url`](Self::url)
    /// (database `postgres`).
    ///
    /// # Errors
    ///
    /// When the binaries are missing or the server does not come up; the
    /// message says which and includes the server's log.
    pub async fn postgres() -> Result<Self, String> {
        let mut server = Self::prepare(ServerKind::Postgres, Some("postgres"))?;
        let bin = pg_bin()?;
        let data = server.dir.join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
            .arg("--locale=C");
        server.run_to_end(initdb, "initdb")?;
        server.start().await?;
        Ok(server)
    }

    /// Initialise a MariaDB data directory (`mariadb-install-db`) and start
    /// `mariadbd`. [`url`](Self::url) connects as `root` (no password) to
    /// the database `test`, which is created; [`mariadb_user`](Self::mariadb_user)
    /// adds more accounts.
    ///
    /// # Errors
    ///
    /// When the binaries are missing or the server does not come up.
    pub async fn mariadb() -> Result<Self, String> {
        let mut server = Self::prepare(ServerKind::MariaDb, Some("mysql"))?;
        let install = binary(
            "LEASE_MARIADB_INSTALL_DB",
            &["mariadb-install-db", "mysql_install_db"],
            &[],
        )?;
        let mut cmd = Command::new(install);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", server.dir.join("data").display()))
            // Its own temporary directory: a server starting (bootstrap
            // included) deletes the temporary tables it finds in its
            // `tmpdir`, also those of another server installing at that
            // moment, which then fails ("File '/tmp/#sql-temptable-..' not found").
            .arg(format!("--tmpdir={}", server.dir.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        server.run_to_end(cmd, "mariadb-install-db")?;
        server.start().await?;
        let mut conn = server.mysql_root("mysql").await?;
        sqlx::raw_sql("CREATE DATABASE IF NOT EXISTS test")
            .execute(&mut conn)
            .await
            .map_err(|e| format!("create database test: {e}"))?;
        let _ = conn.close().await;
        Ok(server)
    }

    /// Start `redis-server` with the given persistence.
    ///
    /// # Errors
    ///
    /// When the binary is missing or the server does not come up.
    pub async fn redis(persistence: RedisPersistence) -> Result<Self, String> {
        let mut server = Self::prepare(ServerKind::Redis(persistence), None)?;
        server.start().await?;
        Ok(server)
    }

    /// Start `redis-server` as a Redis Cluster of one node (no persistence)
    /// that serves every hash slot, and wait until the cluster is up
    /// (`cluster_state:ok`). It refuses a command over keys of several hash
    /// slots with `CROSSSLOT`, as every cluster node does; a client that
    /// knows nothing of clusters can use it like a plain server otherwise.
    /// Needs Redis 7.0 or later (`--cluster-port`, `CLUSTER ADDSLOTSRANGE`).
    ///
    /// # Errors
    ///
    /// When the binary is missing or the server or its cluster does not come up.
    pub async fn redis_cluster() -> Result<Self, String> {
        let mut server = Self::prepare(ServerKind::Redis(RedisPersistence::None), None)?;
        server.cluster = true;
        server.start().await?;
        let client = redis::Client::open(server.url()).map_err(|e| e.to_string())?;
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query_async(&mut c)
            .await
            .map_err(|e| format!("CLUSTER ADDSLOTSRANGE: {e}"))?;
        let start = Instant::now();
        loop {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut c)
                .await
                .map_err(|e| format!("CLUSTER INFO: {e}"))?;
            if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                return Ok(server);
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(format!(
                    "the cluster is not up after {READY_TIMEOUT:?}: {info}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn prepare(kind: ServerKind, account: Option<&str>) -> Result<Self, String> {
        kill_leftovers();
        // Redis flushes its append-only file at every write (`appendfsync
        // always`): on a disk busy with the build, a flush took up to 550 ms,
        // longer than a renewal's time limit at the suite's ttl of 1 s, and
        // the holder lost a lease the fault should not have cost it. Its
        // directory is in memory where the machine has /dev/shm (the file
        // still outlives the server's restarts, which is what it is for).
        let root = match kind {
            ServerKind::Redis(_) => server_roots().pop().unwrap_or_else(std::env::temp_dir),
            _ => std::env::temp_dir(),
        };
        let dir = root.join(format!(
            "{DIR_PREFIX}{}.{}",
            std::process::id(),
            crate::unique("s")
        ));
        std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let account = match account {
            Some(name) if running_as_root() => {
                let ids = account_ids(name).ok_or_else(|| {
                    format!(
                        "running as root, but there is no `{name}` account to run the server as"
                    )
                })?;
                std::os::unix::fs::chown(&dir, Some(ids.0), Some(ids.1))
                    .map_err(|e| format!("chown {}: {e}", dir.display()))?;
                Some(ids)
            }
            _ => None,
        };
        Ok(Self {
            kind,
            dir,
            port: 0,
            child: None,
            account,
            cluster: false,
        })
    }

    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(program);
        if let Some((uid, gid)) = self.account {
            cmd.uid(uid).gid(gid);
        }
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        cmd
    }

    /// Run a set-up program to its end, as the server's account.
    fn run_to_end(&self, template: Command, what: &str) -> Result<(), String> {
        let mut cmd = self.command(template.get_program());
        cmd.args(template.get_args());
        let log = self.dir.join(format!("{what}.log"));
        let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let status = cmd
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(|e| format!("{what}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{what} failed ({status}): {}", tail(&log)))
        }
    }

    /// Start the server (again) on its port — a free one the first time —
    /// and wait until it accepts connections.
    ///
    /// # Errors
    ///
    /// When it is already running or does not come up within 60 s.
    pub async fn start(&mut self) -> Result<(), String> {
        if self.child.is_some() {
            return Err("the server is already running".to_owned());
        }
        let first = self.port == 0;
        for attempt in 1..=3 {
            if first {
                self.port = free_port()?;
            }
            let child = self.spawn()?;
            self.child = Some(child);
            match self.wait_ready().await {
                Ok(()) => return Ok(()),
                // Somebody else took the free port in the meantime: try another.
                Err(e) if first && attempt < 3 && e.contains("exited") => {}
                Err(e) => {
                    self.kill();
                    return Err(e);
                }
            }
            self.kill();
        }
        Err("the server did not start".to_owned())
    }

    fn spawn(&self) -> Result<Child, String> {
        let log_name = match self.kind {
            ServerKind::Postgres => "postgres.log",
            ServerKind::MariaDb => "mariadbd.log",
            ServerKind::Redis(_) => "redis.log",
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(log_name))
            .map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let port = self.port.to_string();
        let mut cmd = match self.kind {
            ServerKind::Postgres => {
                let mut cmd = self.command(pg_bin()?.join("postgres"));
                cmd.arg("-D")
                    .arg(self.dir.join("data"))
                    .args(["-p", &port, "-k"])
                    .arg(&self.dir)
                    .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
                    .args(["-c", "max_connections=200", "-c", "shared_buffers=32MB"]);
                cmd
            }
            ServerKind::MariaDb => {
                let mut cmd = self.command(binary(
                    "LEASE_MARIADBD",
                    &["mariadbd", "mysqld"],
                    &["/usr/sbin"],
                )?);
                cmd.arg("--no-defaults")
                    .arg(format!("--datadir={}", self.dir.join("data").display()))
                    .arg(format!("--port={port}"))
                    .arg(format!(
                        "--socket={}",
                        self.dir.join("mysqld.sock").display()
                    ))
                    .arg(format!(
                        "--pid-file={}",
                        self.dir.join("mysqld.pid").display()
                    ))
                    .arg(format!("--tmpdir={}", self.dir.display()))
                    .args([
                        "--bind-address=127.0.0.1",
                        "--skip-name-resolve",
                        "--skip-log-bin",
                    ])
                    .args(["--innodb-buffer-pool-size=32M", "--max-connections=300"]);
                cmd
            }
            ServerKind::Redis(persistence) => {
                let mut cmd = self.command(binary("LEASE_REDIS_SERVER", &["redis-server"], &[])?);
                cmd.args(["--port", &port, "--bind", "127.0.0.1", "--dir"])
                    .arg(&self.dir)
                    .args(["--save", "", "--daemonize", "no", "--protected-mode", "no"]);
                match persistence {
                    RedisPersistence::None => cmd.args(["--appendonly", "no"]),
                    RedisPersistence::AppendFsyncAlways => {
                        cmd.args(["--appendonly", "yes", "--appendfsync", "always"])
                    }
                };
                if self.cluster {
                    // A bus port of its own: the default, port + 10,000,
                    // may be taken or beyond 65,535.
                    cmd.args(["--cluster-enabled", "yes", "--cluster-config-file"])
                        .arg(self.dir.join("nodes.conf"))
                        .args(["--cluster-port", &free_port()?.to_string()]);
                }
                cmd
            }
        };
        cmd.stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("start {:?}: {e}", self.kind))
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < READY_TIMEOUT {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "{:?} exited at start ({status}): {}",
                    self.kind,
                    self.log_tail()
                ));
            }
            match self.ping().await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "{:?} not ready after {READY_TIMEOUT:?}: {last}; {}",
            self.kind,
            self.log_tail()
        ))
    }

    /// One round trip to the server.
    async fn ping(&self) -> Result<(), String> {
        let attempt = async {
            match self.kind {
                ServerKind::Postgres => {
                    let mut c = sqlx::PgConnection::connect(&self.url())
                        .await
                        .map_err(|e| e.to_string())?;
                    sqlx::query("SELECT 1")
                        .execute(&mut c)
                        .await
                        .map_err(|e| e.to_string())?;
                    let _ = c.close().await;
                    Ok(())
                }
                ServerKind::MariaDb => {
                    let mut c = self.mysql_root("mysql").await?;
                    sqlx::query("SELECT 1")
                        .execute(&mut c)
                        .await
                        .map_err(|e| e.to_string())?;
                    let _ = c.close().await;
                    Ok(())
                }
                ServerKind::Redis(_) => {
                    let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
                    let mut c = client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(|e| e.to_string())?;
                    // Answers LOADING while the append-only file is replayed.
                    redis::cmd("PING")
                        .query_async::<String>(&mut c)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(())
                }
            }
        };
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(r) => r,
            Err(_) => Err("no answer within 5 s".to_owned()),
        }
    }

    async fn mysql_root(&self, db: &str) -> Result<sqlx::MySqlConnection, String> {
        let url = format!("mysql://root@127.0.0.1:{}/{db}", self.port);
        sqlx::MySqlConnection::connect(&url)
            .await
            .map_err(|e| e.to_string())
    }

    /// Create a MariaDB account `user` (no password) with every privilege on
    /// the database `test`, so that its connections can be told apart (and
    /// killed with `KILL CONNECTION USER`). A no-op for other servers.
    ///
    /// # Errors
    ///
    /// When the statements fail.
    pub async fn mariadb_user(&self, user: &str) -> Result<(), String> {
        if self.kind != ServerKind::MariaDb {
            return Ok(());
        }
        let mut conn = self.mysql_root("mysql").await?;
        for sql in [
            format!("CREATE USER IF NOT EXISTS '{user}'@'%'"),
            format!("GRANT ALL ON test.* TO '{user}'@'%'"),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .map_err(|e| format!("create user {user}: {e}"))?;
        }
        let _ = conn.close().await;
        Ok(())
    }

    /// The URL to connect to as the superuser: `postgres://postgres@127.0.0.1:<port>/postgres`,
    /// `mysql://root@127.0.0.1:<port>/test` or `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.url_at(self.port)
    }

    /// [`url`](Self::url) with another port (a proxy's) and, for MariaDB, another user.
    pub fn url_at(&self, port: u16) -> String {
        match self.kind {
            ServerKind::Postgres => format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            ServerKind::MariaDb => format!("mysql://root@127.0.0.1:{port}/test"),
            ServerKind::Redis(_) => format!("redis://127.0.0.1:{port}"),
        }
    }

    /// The server's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// What this server is.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The directory holding the server's data and log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's version string (for reports), or `unknown`.
    pub async fn version(&self) -> String {
        let version = async {
            match self.kind {
                ServerKind::Postgres => {
                    let mut c = sqlx::PgConnection::connect(&self.url()).await.ok()?;
                    let v: String = sqlx::query_scalar("SHOW server_version")
                        .fetch_one(&mut c)
                        .await
                        .ok()?;
                    Some(format!("PostgreSQL {v}"))
                }
                ServerKind::MariaDb => {
                    let mut c = self.mysql_root("test").await.ok()?;
                    let v: String = sqlx::query_scalar("SELECT VERSION()")
                        .fetch_one(&mut c)
                        .await
                        .ok()?;
                    Some(format!("MariaDB {v}"))
                }
                ServerKind::Redis(_) => {
                    let client = redis::Client::open(self.url()).ok()?;
                    let mut c = client.get_multiplexed_async_connection().await.ok()?;
                    let info: String = redis::cmd("INFO")
                        .arg("server")
                        .query_async(&mut c)
                        .await
                        .ok()?;
                    let v = info
                        .lines()
                        .find_map(|l| l.strip_prefix("redis_version:"))?;
                    Some(format!("Redis {}", v.trim()))
                }
            }
        };
        version.await.unwrap_or_else(|| "unknown".to_owned())
    }

    /// Crash the server process and wait until it is gone: `SIGKILL` for
    /// MariaDB and Redis; for PostgreSQL an immediate shutdown (`SIGQUIT`
    /// to the postmaster, which ends every session without a checkpoint:
    /// the next start runs crash recovery), since a `SIGKILL`ed postmaster
    /// would leave its backends running for a while. Every client connection
    /// breaks.
    pub async fn crash(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        match self.kind {
            ServerKind::Postgres => signal(child.id(), "QUIT"),
            _ => {
                let _ = child.kill();
            }
        }
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if start.elapsed() > Duration::from_secs(10) => {
                    let _ = child.kill();
                }
                Ok(None) => {}
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.child = None;
    }

    /// [`crash`](Self::crash) the server, start it again on the same port
    /// and data, and return how long it did not accept connections.
    ///
    /// # Errors
    ///
    /// When it does not come up again.
    pub async fn restart(&mut self) -> Result<Duration, String> {
        self.restart_after(Duration::ZERO).await
    }

    /// Like [`restart`](Self::restart), staying down for `down` before starting again.
    ///
    /// # Errors
    ///
    /// When it does not come up again.
    pub async fn restart_after(&mut self, down: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        self.crash().await;
        tokio::time::sleep(down).await;
        self.start().await?;
        Ok(start.elapsed())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.kind == ServerKind::Postgres {
                signal(child.id(), "QUIT");
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(5) {
                    if !matches!(child.try_wait(), Ok(None)) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_tail(&self) -> String {
        let name = match self.kind {
            ServerKind::Postgres => "postgres.log",
            ServerKind::MariaDb => "mariadbd.log",
            ServerKind::Redis(_) => "redis.log",
        };
        tail(&self.dir.join(name))
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Send `signal` (a name such as `STOP`, `CONT`, `QUIT`) to the process
/// `pid` with the `kill` program; errors are ignored (the process may be gone).
pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Send `signal` to the process group `pgid`.
fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Is `pid` a running process: neither gone nor a zombie (dead, not yet
/// reaped)?
pub(crate) fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        !s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    })
}

/// The process group of `pid`, if it exists.
pub(crate) fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// The last lines of a log file.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// A free port on 127.0.0.1 for a private server, which may be crashed and
/// started again on it: below the kernel's ephemeral range, so that no
/// outgoing connection's local port takes it between the crash and the
/// restart (seen once in a full fault run: an etcd member's restart failed
/// with "bind: address already in use" on a port the kernel had handed
/// out as ephemeral). Falls back to a port the kernel picks.
pub(crate) fn free_port() -> Result<u16, String> {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u32, ephemeral_start.min(65_536));
    if high > low + 1_000 {
        let mut x = u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        for _ in 0..100 {
            // A linear congruential step: spread, not secret.
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let port = low + ((x >> 33) as u32 % (high - low));
            let port = u16::try_from(port).map_err(|e| e.to_string())?;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// `(uid, gid)` of a local account, from `/etc/passwd`.
fn account_ids(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&name) && fields.len() > 3)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    })
}

/// The PostgreSQL binaries' directory.
fn pg_bin() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("LEASE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let initdb = binary("LEASE_PG_BIN_INITDB", &["initdb"], &[])?;
    Ok(initdb.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// The first of `names` found in `$var`, `extra` directories or `PATH`.
pub(crate) fn binary(var: &str, names: &[&str], extra: &[&str]) -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var(var) {
        return Ok(PathBuf::from(path));
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = extra
        .iter()
        .map(PathBuf::from)
        .chain(std::env::split_paths(&path))
        .collect();
    names
        .iter()
        .flat_map(|name| dirs.iter().map(move |d| d.join(name)))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("none of {names:?} found (set {var})"))
}

/// Kill the servers of earlier processes that died without cleaning up, and
/// delete their directories. Only processes whose command line names a
/// `lease-servers.<pid>.` directory of a process that no longer exists are
/// touched.
/// Where private servers keep their directories: the temporary directory,
/// and `/dev/shm` where there is one (Redis's, see `prepare`), last.
fn server_roots() -> Vec<PathBuf> {
    let mut roots = vec![std::env::temp_dir()];
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        roots.push(shm);
    }
    roots
}

pub(crate) fn kill_leftovers() {
    let markers: Vec<String> = server_roots()
        .iter()
        .map(|root| root.join(DIR_PREFIX).to_string_lossy().into_owned())
        .collect();
    let owner_alive = |owner: &str| owner.parse().is_ok_and(running);
    let owner_of = |text: &str| -> Option<String> {
        markers.iter().find_map(|marker| {
            let rest = &text[text.find(marker.as_str())? + marker.len()..];
            let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
            (!pid.is_empty()).then_some(pid)
        })
    };
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if let Some(owner) = owner_of(&cmdline)
            && !owner_alive(&owner)
        {
            // A watchdog of `clusters` leads a process group with its
            // server, whose command line may not name the directory (Redis
            // renames itself): kill the whole group, or the server would
            // outlive its watchdog.
            if process_group(pid) == Some(pid) {
                signal_group(pid, "KILL");
            }
            signal(pid, "KILL");
        }
    }
    for entry in server_roots()
        .iter()
        .flat_map(|root| std::fs::read_dir(root).into_iter().flatten().flatten())
    {
        let path = entry.path();
        let text = path.to_string_lossy().into_owned();
        if let Some(owner) = owner_of(&text)
            && !owner_alive(&owner)
        {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}
