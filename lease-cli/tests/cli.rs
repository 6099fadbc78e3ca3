//! The `lease` binary, run as a user runs it, against SQLite, PostgreSQL,
//! MariaDB, Redis, a Redis Cluster and an etcd cluster (`redis+cluster://`,
//! `etcd://`, on the clusters of `lease_tests::clusters`): every behaviour of `lease run` the README promises
//! (one of two concurrent runs runs; the conflict exit code; the
//! environment; CMD's exit status; loss stops CMD; SIGTERM releases at
//! once; a SIGKILLed run's lease is seen by `list`/`show` and freed by
//! `release --force`; an unreachable backend is 75), and that it never
//! prints a password.
//!
//! Servers as in the other integration tests (`lease_tests`): skipped when
//! absent, a failure with `LEASE_REQUIRE_SERVICES=1`. The test over TLS is
//! in `tls.rs`.

#![allow(clippy::unwrap_used)]

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use lease_tests::{TempDb, unique};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};

/// A password that must never appear in `lease`'s output.
const SECRET: &str = "pw-h17-do-not-print";

/// Where the leases of a test are: the URL (given as `LEASE_URL`).
struct Target {
    url: String,
    /// A URL of the same backend that cannot be reached, with [`SECRET`]
    /// as its password where the scheme has one.
    unreachable: String,
    /// Keeps the SQLite file for the test.
    _file: Option<TempDb>,
}

impl Target {
    /// `lease ARGS` with `LEASE_URL` set to this target, output captured.
    fn lease(&self, args: &[&str]) -> Command {
        lease_at(&self.url, args)
    }

    /// `lease ARGS` to its end: exit code, stdout, stderr.
    async fn output(&self, args: &[&str]) -> (i32, String, String) {
        output(self.lease(args)).await
    }
}

fn lease_at(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lease"));
    command
        .args(args)
        .env("LEASE_URL", url)
        .env_remove("LEASE_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn output(mut command: Command) -> (i32, String, String) {
    let out = timeout(Duration::from_secs(60), command.output())
        .await
        .expect("lease did not finish within 60 s")
        .expect("run lease");
    (
        code(out.status),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn code(status: ExitStatus) -> i32 {
    status.code().expect("lease exits, it is not killed")
}

/// The first line `child` prints on stdout (within 30 s).
async fn first_line(child: &mut Child) -> String {
    let stdout = child.stdout.as_mut().expect("piped");
    let mut line = String::new();
    timeout(
        Duration::from_secs(30),
        BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .expect("no line within 30 s")
    .expect("read stdout");
    line.trim().to_owned()
}

/// The rest of `child`'s stderr and its exit code, within `within`.
async fn finish(mut child: Child, within: Duration) -> (i32, String) {
    let status = timeout(within, child.wait())
        .await
        .unwrap_or_else(|_| panic!("lease still running after {within:?}"))
        .expect("wait");
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        use tokio::io::AsyncReadExt;
        let _ = err.read_to_string(&mut stderr).await;
    }
    (code(status), stderr)
}

/// Whether any process of the process group `pgid` is alive (zombies
/// aside), from `/proc`.
fn group_alive(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // After the command's name in parentheses: state, ppid, pgrp.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string()
    })
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

// ------------------------------------------------------------------ targets

async fn sqlite() -> Option<Target> {
    let file = TempDb::new("lease-cli");
    Some(Target {
        url: format!("sqlite:{}", file.path().display()),
        unreachable: "sqlite:/nonexistent-h17/dir/leases.db".to_owned(),
        _file: Some(file),
    })
}

/// A table backend's target, its table made by `lease schema --create`.
async fn table(url: String, unreachable: String) -> Target {
    let target = Target {
        url,
        unreachable,
        _file: None,
    };
    let (code, _, err) = target.output(&["schema", "--create"]).await;
    assert_eq!(code, 0, "lease schema --create: {err}");
    target
}

async fn postgres() -> Option<Target> {
    drop(lease_tests::postgres().await?);
    let unreachable = format!("postgres://postgres:{SECRET}@127.0.0.1:1/test");
    Some(table(lease_tests::postgres_url(), unreachable).await)
}

async fn mariadb() -> Option<Target> {
    drop(lease_tests::mysql().await?);
    let unreachable = format!("mysql://root:{SECRET}@127.0.0.1:1/test");
    Some(table(lease_tests::mysql_url(), unreachable).await)
}

async fn redis() -> Option<Target> {
    drop(lease_tests::redis().await?);
    Some(Target {
        url: lease_tests::redis_url(),
        unreachable: format!("redis://:{SECRET}@127.0.0.1:1"),
        _file: None,
    })
}

/// `redis+cluster://` with every node of the test binary's Redis Cluster.
async fn redis_cluster() -> Option<Target> {
    let cluster = lease_tests::clusters::redis_cluster()?;
    let hosts: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.trim_start_matches("redis://").to_owned())
        .collect();
    Some(Target {
        url: format!("redis+cluster://{}", hosts.join(",")),
        unreachable: format!("redis+cluster://:{SECRET}@127.0.0.1:1,127.0.0.1:2"),
        _file: None,
    })
}

/// `etcd://` with every member of the test binary's etcd cluster, and a
/// prefix of this test binary's own (the path).
async fn etcd() -> Option<Target> {
    let cluster = lease_tests::clusters::etcd_cluster()?;
    let hosts: Vec<String> = cluster
        .endpoints()
        .iter()
        .map(|e| e.trim_start_matches("http://").to_owned())
        .collect();
    Some(Target {
        url: format!("etcd://{}/{}/", hosts.join(","), unique("cli")),
        unreachable: format!("etcd://root:{SECRET}@127.0.0.1:1,127.0.0.1:2/x/"),
        _file: None,
    })
}

// --------------------------------------------------------------- behaviours

/// Two `lease run`s of one name at once: exactly one runs CMD; the other
/// says so on stderr and exits 0.
async fn of_two_concurrent_runs_one_runs(t: &Target) {
    let name = unique("cli-two");
    let cmd = [
        "run",
        "--name",
        &name,
        "--ttl",
        "10s",
        "--",
        "sh",
        "-c",
        "echo ran; sleep 2",
    ];
    let (a, b) = tokio::join!(t.output(&cmd), t.output(&cmd));
    let ran = [&a, &b]
        .iter()
        .filter(|(_, out, _)| out.contains("ran"))
        .count();
    assert_eq!(ran, 1, "a: {a:?}, b: {b:?}");
    let skipped = if a.1.contains("ran") { &b } else { &a };
    assert_eq!(skipped.0, 0, "{skipped:?}");
    assert!(skipped.2.contains("held elsewhere"), "{skipped:?}");
    assert_eq!(if a.1.contains("ran") { &a } else { &b }.0, 0);
}

/// `--conflict-exit-code N` is the exit code when the lease is held.
async fn held_elsewhere_exits_with_the_conflict_exit_code(t: &Target) {
    let name = unique("cli-conflict");
    let mut holder = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "10s",
            "--",
            "sh",
            "-c",
            "echo started; sleep 30",
        ])
        .spawn()
        .unwrap();
    assert_eq!(first_line(&mut holder).await, "started");
    let (code, out, err) = t
        .output(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "10s",
            "--conflict-exit-code",
            "3",
            "--",
            "echo",
            "ran",
        ])
        .await;
    assert_eq!((code, out.as_str()), (3, ""), "{err}");
    assert!(
        err.contains(&name) && err.contains("held elsewhere"),
        "{err}"
    );
    signal(holder.id().unwrap(), "TERM");
    finish(holder, Duration::from_secs(10)).await;
}

/// CMD sees `LEASE_NAME`, `LEASE_HOLDER` and `LEASE_FENCING_TOKEN`.
async fn cmd_gets_the_lease_in_its_environment(t: &Target) {
    let name = unique("cli-env");
    let holder = unique("cli-holder");
    let show = r#"echo "$LEASE_NAME|$LEASE_HOLDER|${LEASE_FENCING_TOKEN-unset}""#;
    let (code, out, err) = t
        .output(&[
            "run", "--name", &name, "--ttl", "10s", "--holder", &holder, "--", "sh", "-c", show,
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    let parts: Vec<&str> = out.trim().split('|').collect();
    assert_eq!(parts[..2], [name.as_str(), holder.as_str()], "{out}");
    let fence: u64 = parts[2]
        .parse()
        .unwrap_or_else(|_| panic!("fencing token {out}"));
    assert!(fence >= 1);
    // The next acquisition has a larger one.
    let (_, again, _) = t
        .output(&[
            "run", "--name", &name, "--ttl", "10s", "--", "sh", "-c", show,
        ])
        .await;
    let next: u64 = again.trim().rsplit('|').next().unwrap().parse().unwrap();
    assert!(next > fence, "{fence} then {next}");
}

/// CMD's exit status is `lease`'s; a signal N that ends CMD is 128 + N.
async fn cmd_exit_status_is_passed_through(t: &Target) {
    let name = unique("cli-status");
    let run = |script: &'static str| {
        let name = name.clone();
        async move {
            t.output(&[
                "run", "--name", &name, "--ttl", "10s", "--", "sh", "-c", script,
            ])
            .await
        }
    };
    assert_eq!(run("exit 7").await.0, 7);
    assert_eq!(run("exit 0").await.0, 0);
    assert_eq!(run("kill -KILL $$").await.0, 128 + 9);
    let (code, _, err) = t
        .output(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "10s",
            "--",
            "/nonexistent-h17/cmd",
        ])
        .await;
    assert_eq!(code, 127, "{err}");
}

/// The lease taken away (`release --force` from elsewhere) while CMD runs:
/// CMD's whole process group gets SIGTERM — ignored here — then SIGKILL
/// after `--kill-after`, and `lease` exits 76; within ttl/3 + kill-after
/// + slack.
async fn a_lost_lease_stops_cmd(t: &Target) {
    let name = unique("cli-lost");
    let (ttl, kill_after) = (Duration::from_secs(3), Duration::from_secs(1));
    let script = r#"trap "" TERM; echo $$; while :; do sleep 0.1; done"#;
    let mut run = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            script,
        ])
        .spawn()
        .unwrap();
    let group: i32 = first_line(&mut run).await.parse().unwrap();
    assert!(group_alive(group));
    let (code, out, err) = t.output(&["release", "--force", &name]).await;
    assert_eq!(
        (code, out.trim()),
        (0, format!("released {name}").as_str()),
        "{err}"
    );
    let released = Instant::now();
    let slack = Duration::from_secs(3);
    let (code, err) = finish(run, ttl / 3 + kill_after + slack).await;
    let took = released.elapsed();
    assert_eq!(code, 76, "{err}");
    assert!(err.contains("lost the lease"), "{err}");
    assert!(
        took >= kill_after,
        "SIGKILL came {took:?} after the loss, before --kill-after"
    );
    assert!(
        !group_alive(group),
        "CMD's process group outlived the lease"
    );
    eprintln!("lost lease: lease exited {took:?} after the forced release");
}

/// SIGTERM to `lease run` reaches CMD, and the lease is free as soon as
/// `lease` exits (not at its ttl).
async fn sigterm_is_passed_on_and_releases_at_once(t: &Target) {
    let name = unique("cli-term");
    let mut run = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "60s",
            "--",
            "sh",
            "-c",
            "echo started; exec sleep 30",
        ])
        .spawn()
        .unwrap();
    assert_eq!(first_line(&mut run).await, "started");
    signal(run.id().unwrap(), "TERM");
    let (code, err) = finish(run, Duration::from_secs(10)).await;
    assert_eq!(code, 128 + 15, "CMD ended by the SIGTERM passed on: {err}");
    let (code, out, _) = t.output(&["show", &name]).await;
    assert_eq!(code, 1, "released at once: {out}");
    assert!(out.contains("free"), "{out}");
    let (code, out, err) = t
        .output(&["run", "--name", &name, "--ttl", "10s", "--", "echo", "next"])
        .await;
    assert_eq!((code, out.trim()), (0, "next"), "{err}");
}

/// A `lease run` killed with SIGKILL leaves its lease held: `list` and
/// `show` show it with its holder, and `release --force` frees it.
async fn a_killed_runs_lease_is_listed_and_force_released(t: &Target) {
    let name = unique("cli-killed");
    let holder = unique("cli-killed-holder");
    let mut run = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "60s",
            "--holder",
            &holder,
            "--",
            "sh",
            "-c",
            "echo $$; exec sleep 60",
        ])
        .spawn()
        .unwrap();
    let orphan: i32 = first_line(&mut run).await.parse().unwrap();
    signal(run.id().unwrap(), "KILL");
    let _ = run.wait().await;

    let (code, out, err) = t.output(&["list"]).await;
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))
        .unwrap_or_else(|| panic!("{name} not in\n{out}"));
    assert!(line.contains("held") && line.contains(&holder), "{line}");
    let (code, out, err) = t.output(&["show", &name]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("state: held") && out.contains(&holder),
        "{out}"
    );

    let (code, out, err) = t.output(&["release", "--force", &name]).await;
    assert_eq!(
        (code, out.trim()),
        (0, format!("released {name}").as_str()),
        "{err}"
    );
    let (code, out, _) = t.output(&["show", &name]).await;
    assert_eq!(code, 1, "{out}");
    let (code, out, _) = t.output(&["release", "--force", &name]).await;
    assert_eq!(code, 1, "nothing left to release: {out}");
    let (code, out, err) = t
        .output(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "10s",
            "--",
            "echo",
            "taken over",
        ])
        .await;
    assert_eq!((code, out.trim()), (0, "taken over"), "{err}");
    // The orphan: nothing told it (see the README); end it.
    signal(u32::try_from(orphan).unwrap(), "KILL");
}

/// `--wait`: a second run waits for the first to finish, then runs.
async fn wait_runs_once_the_holder_is_done(t: &Target) {
    let name = unique("cli-wait");
    let mut first = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "30s",
            "--",
            "sh",
            "-c",
            "echo started; sleep 1",
        ])
        .spawn()
        .unwrap();
    assert_eq!(first_line(&mut first).await, "started");
    let (code, out, err) = t
        .output(&[
            "run", "--name", &name, "--ttl", "30s", "--wait", "20s", "--", "echo", "second",
        ])
        .await;
    assert_eq!((code, out.trim()), (0, "second"), "{err}");
    let (code, err) = finish(first, Duration::from_secs(10)).await;
    assert_eq!(code, 0, "{err}");
}

/// An unreachable backend: exit 75, CMD not run, and the password of the
/// URL nowhere in the output.
async fn an_unreachable_backend_exits_75(t: &Target) {
    let name = unique("cli-down");
    let args = [
        "run",
        "--connect-timeout",
        "2s",
        "--name",
        &name,
        "--ttl",
        "10s",
        "--",
        "echo",
        "ran",
    ];
    let started = Instant::now();
    let (code, out, err) = output(lease_at(&t.unreachable, &args)).await;
    assert_eq!((code, out.as_str()), (75, ""), "{err}");
    assert!(
        err.contains("cannot acquire") || err.contains("cannot open"),
        "{err}"
    );
    // The URL is shown, so that the operator sees which backend; its password is not.
    assert!(
        err.contains("127.0.0.1:1") || err.contains("nonexistent-h17"),
        "{err}"
    );
    assert!(!err.contains(SECRET), "the password was printed: {err}");
    assert!(started.elapsed() < Duration::from_secs(30));
    for args in [&["list"][..], &["show", "x"], &["release", "--force", "x"]] {
        let mut command = lease_at(&t.unreachable, args);
        command.args(["--connect-timeout", "2s"]);
        let (code, out, err) = output(command).await;
        assert_eq!(code, 75, "{args:?}: {out} {err}");
        assert!(!err.contains(SECRET) && !out.contains(SECRET), "{err}");
    }
}

macro_rules! cli_tests {
    ($($backend:ident),* $(,)?) => {$(
        mod $backend {
            cli_tests!(@tests $backend, [
                of_two_concurrent_runs_one_runs,
                held_elsewhere_exits_with_the_conflict_exit_code,
                cmd_gets_the_lease_in_its_environment,
                cmd_exit_status_is_passed_through,
                a_lost_lease_stops_cmd,
                sigterm_is_passed_on_and_releases_at_once,
                a_killed_runs_lease_is_listed_and_force_released,
                an_unreachable_backend_exits_75,
                wait_runs_once_the_holder_is_done,
            ]);
        }
    )*};
    (@tests $backend:ident, [$($test:ident),* $(,)?]) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            if let Some(target) = super::$backend().await {
                super::$test(&target).await;
            }
        }
    )*};
}

cli_tests!(sqlite, postgres, mariadb, redis, redis_cluster, etcd);

/// `etcd://`: the path is the key prefix — a lease taken through one prefix
/// is not seen through another, nor through `--prefix` with a different
/// one — and the prefix is given once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_prefix_is_the_path() {
    let Some(t) = etcd().await else { return };
    let name = unique("cli-prefix");
    let mut run = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "30s",
            "--",
            "sh",
            "-c",
            "echo started; exec sleep 30",
        ])
        .spawn()
        .unwrap();
    assert_eq!(first_line(&mut run).await, "started");
    let (code, out, err) = t.output(&["show", &name]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("state: held"), "{out}");
    // `etcd://HOSTS` and `/PREFIX/`.
    let hosts_end = "etcd://".len() + t.url["etcd://".len()..].find('/').unwrap();
    let (bare, path) = t.url.split_at(hosts_end);
    let prefix = &path[1..];
    // The same members, the default prefix `lease/`: another key.
    let (code, out, _) = output(lease_at(bare, &["show", &name])).await;
    assert_eq!(code, 1, "{bare}: {out}");
    let (code, _, err) = output(lease_at(&t.url, &["show", "--prefix", "other/", &name])).await;
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("given twice"), "{err}");
    let mut with_flag = lease_at(bare, &["show", &name]);
    with_flag.args(["--prefix", prefix]);
    let (code, out, err) = output(with_flag).await;
    assert_eq!(code, 0, "--prefix {prefix}: {err}");
    assert!(out.contains("state: held"), "{out}");
    signal(run.id().unwrap(), "TERM");
    let (code, err) = finish(run, Duration::from_secs(10)).await;
    assert_eq!(code, 128 + 15, "{err}");
}

/// `--advisory` (`PgAdvisory`): `show` names the holding session, `list`
/// shows the lock by key (the name cannot be recovered from `pg_locks`),
/// and `release --force` ends the session: the run loses its lease (76).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_locks_are_shown_and_force_released() {
    let Some(t) = postgres().await else { return };
    let name = unique("cli-advisory");
    let mut run = t
        .lease(&[
            "run",
            "--advisory",
            "--name",
            &name,
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            "echo started; exec sleep 30",
        ])
        .spawn()
        .unwrap();
    assert_eq!(first_line(&mut run).await, "started");
    let (code, out, err) = t.output(&["show", "--advisory", &name]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("state: held (no expiry)") && out.contains("pid "),
        "{out}"
    );
    let (code, out, err) = t.output(&["list", "--advisory"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains('#'), "{out}");
    assert!(err.contains("keys, not names"), "{err}");
    let (code, out, err) = t.output(&["release", "--force", "--advisory", &name]).await;
    assert_eq!(
        (code, out.trim()),
        (0, format!("released {name}").as_str()),
        "{err}"
    );
    // ttl/3 + kill-after + slack.
    let (code, err) = finish(run, Duration::from_secs(1 + 1 + 5)).await;
    assert_eq!(code, 76, "{err}");
    let (code, _, _) = t.output(&["show", "--advisory", &name]).await;
    assert_eq!(code, 1);
}

// ------------------------------------------------------------ no backend

/// `--help` shows where the URL comes from, never its value.
#[tokio::test]
async fn help_never_shows_the_password() {
    let url = format!("postgres://app:{SECRET}@db.example/app");
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["list", "--help"],
        &["release", "--help"],
    ] {
        let (code, out, err) = output(lease_at(&url, args)).await;
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains("LEASE_URL"), "{args:?}: {out}");
        assert!(
            !out.contains(SECRET) && !err.contains(SECRET),
            "{args:?}: {out}"
        );
    }
}

/// A URL that cannot be used: exit 78, the URL shown without its password.
#[tokio::test]
async fn an_unusable_url_exits_78_without_the_password() {
    let url = format!("postgresql+tcp://app:{SECRET}@db.example/app");
    let (code, _, err) = output(lease_at(&url, &["list"])).await;
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("app:***@db.example"),
        "the URL is shown: {err}"
    );
    assert!(!err.contains(SECRET), "{err}");
    let (code, _, err) = output(lease_at("", &["list"])).await;
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("LEASE_URL"), "{err}");
}
