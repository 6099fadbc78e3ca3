//! The `lease` binary, run as a user runs it, against SQLite, PostgreSQL,
//! MariaDB, Redis, a Redis Cluster and an etcd cluster (`redis+cluster://`,
//! `etcd://`, on the clusters of `lease_tests::clusters`): every behaviour of `lease run` the README promises
//! (one of two concurrent runs runs, even under one `--holder`; the
//! conflict exit code; the environment; CMD's exit status; loss stops CMD;
//! SIGTERM releases at once; `--min-hold`; a SIGKILLed run's lease is seen
//! by `list`/`show` and freed by `release --force`; an unreachable backend
//! is 75), and that it never prints a password. Without a server (SQLite):
//! CMD owns a terminal it is run from, a stopped CMD gets signals passed on,
//! a SIGKILLed run takes CMD with it; with PostgreSQL behind a freezing
//! proxy, losing the server does not delay exit 76.
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
    // Who holds it, and until when (a time, as `date -u` would say it).
    assert!(err.contains(" by ") && err.contains(" until "), "{err}");
    let (_, shown, _) = t.output(&["show", &name]).await;
    let holder_name = shown
        .lines()
        .find_map(|l| l.strip_prefix("holder: "))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(err.contains(&format!("by {holder_name} until ")), "{err}");
    signal(holder.id().unwrap(), "TERM");
    finish(holder, Duration::from_secs(10)).await;
}

/// Two runs with one `--holder` (a cron line's `--holder $(hostname)`, two
/// ticks overlapping on one host): the second does not run CMD, as each run
/// is a holder of its own.
async fn two_runs_with_one_holder_do_not_overlap(t: &Target) {
    let name = unique("cli-one-holder");
    let holder = unique("cli-one-holder");
    let mut first = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "10s",
            "--holder",
            &holder,
            "--",
            "sh",
            "-c",
            "echo started; sleep 30",
        ])
        .spawn()
        .unwrap();
    assert_eq!(first_line(&mut first).await, "started");
    let (code, out, err) = t
        .output(&[
            "run", "--name", &name, "--ttl", "10s", "--holder", &holder, "--", "echo", "ran",
        ])
        .await;
    assert_eq!(
        (code, out.as_str()),
        (0, ""),
        "the second run ran CMD while the first ran it: {err}"
    );
    assert!(err.contains("held elsewhere"), "{err}");
    signal(first.id().unwrap(), "TERM");
    finish(first, Duration::from_secs(10)).await;
}

/// `--min-hold 5s`: a fast CMD's run keeps the lease until 5 s after it
/// took it, so a second run started after CMD ended but within those 5 s (a
/// host whose cron fires a little later) does not run CMD; then it lets go.
async fn min_hold_keeps_the_lease_after_a_fast_cmd(t: &Target) {
    let name = unique("cli-min-hold");
    let started = Instant::now();
    let mut first = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "10s",
            "--min-hold",
            "5s",
            "--",
            "echo",
            "first",
        ])
        .spawn()
        .unwrap();
    assert_eq!(first_line(&mut first).await, "first");
    // `echo` has ended by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, out, err) = t
        .output(&[
            "run", "--name", &name, "--ttl", "10s", "--", "echo", "second",
        ])
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the second run came too late to tell"
    );
    assert_eq!(
        (code, out.as_str()),
        (0, ""),
        "the second run ran CMD within --min-hold: {err}"
    );
    let (code, err) = finish(first, Duration::from_secs(20)).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "the first run ended before --min-hold was over"
    );
    // Released when it ended, not at its ttl.
    let (code, out, err) = t
        .output(&[
            "run", "--name", &name, "--ttl", "10s", "--", "echo", "third",
        ])
        .await;
    assert_eq!((code, out.trim()), (0, "third"), "{err}");
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
    assert_eq!(parts[0], name, "{out}");
    // This run's own holder: `--holder`, then `-PID-RANDOM`.
    assert!(parts[1].starts_with(&format!("{holder}-")), "{out}");
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
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with(&format!("released {name}")), "{out}");
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
            "echo started; exec sleep 60",
        ])
        .spawn()
        .unwrap();
    assert_eq!(first_line(&mut run).await, "started");
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

    // Its holder is known to be dead: `--now`, no lock delay.
    let (code, out, err) = t.output(&["release", "--force", "--now", &name]).await;
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

/// `--once-per`: a cron line on every host runs CMD once per slot. The
/// second run in the same slot (the lease free by then) does not run CMD,
/// says why, and exits with the conflict code; `lease show` names the slot.
async fn once_per_runs_cmd_once_per_slot(t: &Target) {
    let name = unique("cli-once-per");
    let once = ["run", "--name", &name, "--ttl", "10s", "--once-per", "1h"];
    let (code, out, err) = t
        .output(&[&once[..], &["--", "echo", "first"]].concat())
        .await;
    assert_eq!((code, out.trim()), (0, "first"), "{err}");
    let (code, out, err) = t
        .output(
            &[
                &once[..],
                &["--conflict-exit-code", "3", "--", "echo", "second"],
            ]
            .concat(),
        )
        .await;
    assert_eq!((code, out.as_str()), (3, ""), "the slot ran twice: {err}");
    assert!(err.contains("has run already"), "{err}");
    let (_, out, err) = t.output(&["show", &name]).await;
    assert!(out.contains("last slot run:"), "{out} {err}");
}

/// `--retry-failed`: a run whose CMD failed leaves its slot to the next
/// tick; one that exited 0 uses it up.
async fn retry_failed_reruns_a_failed_slot(t: &Target) {
    let name = unique("cli-retry");
    let once = [
        "run",
        "--name",
        &name,
        "--ttl",
        "10s",
        "--once-per",
        "1h",
        "--retry-failed",
    ];
    let (code, _, err) = t
        .output(&[&once[..], &["--", "sh", "-c", "exit 4"]].concat())
        .await;
    assert_eq!(code, 4, "{err}");
    let (code, out, err) = t
        .output(&[&once[..], &["--", "echo", "again"]].concat())
        .await;
    assert_eq!(
        (code, out.trim()),
        (0, "again"),
        "the failed slot was not run again: {err}"
    );
    let (code, out, err) = t
        .output(&[&once[..], &["--", "echo", "third"]].concat())
        .await;
    assert_eq!(
        (code, out.as_str()),
        (0, ""),
        "a succeeded slot ran again: {err}"
    );
}

/// `release --force` keeps a lock delay: the holder's CMD is stopped and
/// nobody gets the lease before its expiry (`show` says when it is free);
/// `--now` frees it at once.
async fn a_forced_release_keeps_a_lock_delay_unless_now(t: &Target) {
    let name = unique("cli-delay");
    let mut run = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "6s",
            "--",
            "sh",
            "-c",
            "echo started; exec sleep 60",
        ])
        .spawn()
        .unwrap();
    assert_eq!(first_line(&mut run).await, "started");
    let (code, out, err) = t.output(&["release", "--force", &name]).await;
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("free at"), "{out}");
    let (code, _) = finish(run, Duration::from_secs(10)).await;
    assert_eq!(code, 76, "the evicted run was not stopped");
    let (code, out, _) = t.output(&["show", &name]).await;
    assert_eq!(code, 0, "still kept from new holders: {out}");
    assert!(out.contains("force-released"), "{out}");
    let (code, out, err) = t
        .output(&[
            "run", "--name", &name, "--ttl", "6s", "--", "echo", "too-soon",
        ])
        .await;
    assert_eq!(
        (code, out.as_str()),
        (0, ""),
        "ran within the lock delay: {err}"
    );
    let (code, out, err) = t.output(&["release", "--force", "--now", &name]).await;
    assert_eq!(code, 0, "{out} {err}");
    let (code, out, err) = t
        .output(&["run", "--name", &name, "--ttl", "6s", "--", "echo", "now"])
        .await;
    assert_eq!((code, out.trim()), (0, "now"), "{err}");
}

macro_rules! cli_tests {
    ($($backend:ident),* $(,)?) => {$(
        mod $backend {
            cli_tests!(@tests $backend, [
                of_two_concurrent_runs_one_runs,
                held_elsewhere_exits_with_the_conflict_exit_code,
                two_runs_with_one_holder_do_not_overlap,
                min_hold_keeps_the_lease_after_a_fast_cmd,
                cmd_gets_the_lease_in_its_environment,
                cmd_exit_status_is_passed_through,
                a_lost_lease_stops_cmd,
                sigterm_is_passed_on_and_releases_at_once,
                a_killed_runs_lease_is_listed_and_force_released,
                an_unreachable_backend_exits_75,
                wait_runs_once_the_holder_is_done,
                once_per_runs_cmd_once_per_slot,
                retry_failed_reruns_a_failed_slot,
                a_forced_release_keeps_a_lock_delay_unless_now,
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
    // An advisory lock ends with its session: no lock delay to keep, so
    // only the immediate kind is offered.
    let (code, out, err) = t.output(&["release", "--force", "--advisory", &name]).await;
    assert_eq!(code, 78, "{out} {err}");
    assert!(err.contains("--now"), "{err}");
    let (code, out, err) = t
        .output(&["release", "--force", "--now", "--advisory", &name])
        .await;
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

// ----------------------------------------------------- processes, terminals
// (backend-independent: on SQLite)

/// The state letter of process `pid` (`R`, `S`, `T` for stopped, ...).
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// From a terminal (here the pseudo-terminal of util-linux's `script`), a
/// CMD that reads it gets its input: it is not a background job stopped by
/// SIGTTIN for ever, with the lease held and renewed all along. After it,
/// the terminal is the shell's again: its next `read` gets the next line.
#[tokio::test]
async fn a_cmd_that_reads_the_terminal_gets_its_input() {
    use tokio::io::AsyncWriteExt;
    let t = sqlite().await.unwrap();
    let mut command = Command::new("script");
    command
        .args([
            "-qec",
            r#""$LEASE_BIN" run --name "$LEASE_TEST_NAME" --ttl 10s -- sh -c 'read x; echo "got $x"'; read y; echo "then $y""#,
            "/dev/null",
        ])
        .env("SHELL", "/bin/sh")
        .env("LEASE_BIN", env!("CARGO_BIN_EXE_lease"))
        .env("LEASE_TEST_NAME", unique("cli-tty"))
        .env("LEASE_URL", &t.url)
        .env_remove("LEASE_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut script = command.spawn().expect("run script (util-linux)");
    // Typed on the terminal; kept open until the end (an end of input
    // would be passed on to the terminal as one).
    let mut keyboard = script.stdin.take().unwrap();
    keyboard.write_all(b"hello\nworld\n").await.unwrap();
    let out = timeout(Duration::from_secs(20), script.wait_with_output())
        .await
        .expect("lease run did not end within 20 s of its CMD's input: CMD stopped reading the terminal")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("got hello") && stdout.contains("then world"),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(code(out.status), 0, "{stdout}");
    drop(keyboard);
}

/// SIGTERM to `lease run` while CMD is stopped (SIGSTOP, a Ctrl-Z): CMD
/// gets SIGCONT after the signal passed on, so it ends instead of keeping
/// the signal pending, and `lease run` with it, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_passed_on_reaches_a_stopped_cmd() {
    let t = sqlite().await.unwrap();
    let name = unique("cli-stopped");
    let mut run = t
        .lease(&[
            "run",
            "--name",
            &name,
            "--ttl",
            "10s",
            "--",
            "sh",
            "-c",
            "echo $$; kill -STOP $$; exec sleep 30",
        ])
        .spawn()
        .unwrap();
    let cmd: i32 = first_line(&mut run).await.parse().unwrap();
    let stopped = Instant::now();
    while state(cmd) != Some('T') {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "CMD never stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(run.id().unwrap(), "TERM");
    let (code, err) = finish(run, Duration::from_secs(10)).await;
    assert_eq!(code, 128 + 15, "CMD ended by the SIGTERM passed on: {err}");
}

/// `--min-hold` as the library checks it (whole milliseconds up to 24 h):
/// another value exits 78 and CMD does not run.
#[tokio::test]
async fn an_invalid_min_hold_exits_78() {
    let t = sqlite().await.unwrap();
    let name = unique("cli-bad-min-hold");
    for min_hold in ["1500us", "25h"] {
        let (code, out, err) = t
            .output(&[
                "run",
                "--name",
                &name,
                "--ttl",
                "10s",
                "--min-hold",
                min_hold,
                "--",
                "echo",
                "ran",
            ])
            .await;
        assert_eq!(
            (code, out.as_str()),
            (78, ""),
            "--min-hold {min_hold}: {err}"
        );
        assert!(err.contains("min_hold"), "{err}");
    }
}

/// `lease run` killed with SIGKILL takes CMD with it (Linux: CMD gets
/// SIGKILL when `lease` dies), so that CMD does not run on unprotected
/// while its lease expires and another host takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_takes_cmd_with_it() {
    let t = sqlite().await.unwrap();
    let name = unique("cli-orphan");
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
            "echo $$; exec sleep 60",
        ])
        .spawn()
        .unwrap();
    let cmd: i32 = first_line(&mut run).await.parse().unwrap();
    signal(run.id().unwrap(), "KILL");
    let _ = run.wait().await;
    let killed = Instant::now();
    // Gone, or a zombie nobody has reaped yet.
    while !matches!(state(cmd), None | Some('Z')) {
        if killed.elapsed() > Duration::from_secs(1) {
            signal(u32::try_from(cmd).unwrap(), "KILL");
            panic!("CMD still runs 1 s after lease run was killed");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TCP proxy that can freeze: then its connections stay open and nothing
/// passes either way, as with a server that hangs or is partitioned away.
struct Proxy {
    addr: std::net::SocketAddr,
    frozen: tokio::sync::watch::Sender<bool>,
}

impl Proxy {
    async fn to(upstream: std::net::SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (frozen, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut watch = watch.clone();
                tokio::spawn(async move {
                    if !*watch.borrow() {
                        let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
                            _ = watch.wait_for(|frozen| *frozen) => {}
                        }
                    }
                    // Frozen: hold the connection, pass nothing.
                    std::future::pending::<()>().await;
                    drop(client);
                });
            }
        });
        Proxy { addr, frozen }
    }

    fn freeze(&self) {
        self.frozen.send_replace(true);
    }
}

/// `url` through `proxy`, and the `host:port` it named.
fn through(url: &str, proxy: std::net::SocketAddr) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    (format!("{scheme}://{user}{proxy}{tail}"), host)
}

/// The backend lost while CMD runs (PostgreSQL behind a proxy that
/// freezes): CMD is stopped at the loss and `lease` exits 76 promptly after
/// CMD ended, not after the release of the lost lease has waited out its
/// time limit (min(ttl, 30 s)) for a server that does not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_backend_does_not_delay_exit_76() {
    let Some(t) = postgres().await else { return };
    let (_, upstream) = through(&t.url, "127.0.0.1:1".parse().unwrap());
    let upstream = tokio::net::lookup_host(&upstream)
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = Proxy::to(upstream).await;
    let (url, _) = through(&t.url, proxy.addr);
    let name = unique("cli-frozen");
    let script = r#"trap "echo stopped; exit 0" TERM; echo started; while :; do sleep 0.1; done"#;
    let mut run = lease_at(
        &url,
        &[
            "run",
            "--name",
            &name,
            "--ttl",
            "15s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            script,
        ],
    )
    .spawn()
    .unwrap();
    assert_eq!(first_line(&mut run).await, "started");
    proxy.freeze();
    // Lost by ttl - grace = 10 s after the last renewal.
    assert_eq!(first_line(&mut run).await, "stopped");
    let stopped = Instant::now();
    let (code, err) = finish(run, Duration::from_secs(40)).await;
    let took = stopped.elapsed();
    assert_eq!(code, 76, "{err}");
    assert!(
        took < Duration::from_secs(5),
        "exit 76 came {took:?} after CMD ended: {err}"
    );
}

/// §6.1: renewals fail (the server frozen behind a proxy) while CMD
/// ignores SIGTERM; `lease` sends SIGKILL within the grace (the default
/// `--kill-after`), so CMD is gone before the lease can pass on: another
/// host's `lease run`, waiting for the lease, finds it dead when its own
/// CMD starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cmd_that_ignores_sigterm_is_dead_before_another_host_runs() {
    let Some(t) = postgres().await else { return };
    let (_, upstream) = through(&t.url, "127.0.0.1:1".parse().unwrap());
    let upstream = tokio::net::lookup_host(&upstream)
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = Proxy::to(upstream).await;
    let (url, _) = through(&t.url, proxy.addr);
    let name = unique("cli-stubborn");
    let stubborn = r#"trap "" TERM; echo $$; while :; do sleep 0.1; done"#;
    let mut first = lease_at(
        &url,
        &[
            "run", "--name", &name, "--ttl", "3s", "--", "sh", "-c", stubborn,
        ],
    )
    .spawn()
    .unwrap();
    let group: i32 = first_line(&mut first).await.parse().unwrap();
    assert!(group_alive(group));
    proxy.freeze();
    // Alive: a process of the group that is not a zombie (an orphan killed
    // with the group is reaped by init a moment later).
    let check = format!(
        "if ps -eo pgid=,stat= | awk '$1 == {group} && $2 !~ /^Z/' | grep -q .; then echo alive; else echo dead; fi"
    );
    let (code, out, err) = t
        .output(&[
            "run", "--name", &name, "--ttl", "3s", "--wait", "20s", "--", "sh", "-c", &check,
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "dead",
        "the other host ran its CMD while the first host's CMD (ignoring SIGTERM) still ran"
    );
    let (code, err) = finish(first, Duration::from_secs(20)).await;
    assert_eq!(code, 76, "{err}");
}

/// A `--kill-after` longer than the grace would let CMD run on after the
/// lease passed to another host: refused, exit 78, before anything runs.
#[tokio::test]
async fn a_kill_after_longer_than_the_grace_is_refused() {
    for args in [
        &["--ttl", "3s", "--kill-after", "2s"][..],
        &["--ttl", "3s", "--grace", "500ms", "--kill-after", "600ms"],
    ] {
        let mut all = vec!["run", "--name", "never-runs"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "sh", "-c", "echo ran"]);
        let t = sqlite().await.unwrap();
        let (code, out, err) = t.output(&all).await;
        assert_eq!(code, 78, "{args:?}: {err}");
        assert!(
            err.contains("--kill-after") && err.contains("grace"),
            "{err}"
        );
        assert!(!out.contains("ran"), "{out}");
    }
}

/// `--help` says how to see what `lease` does: `LEASE_LOG`.
#[tokio::test]
async fn help_documents_lease_log() {
    for args in [&["--help"][..], &["run", "--help"]] {
        let (code, out, err) = output(lease_at("", args)).await;
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains("LEASE_LOG"), "{args:?}: {out}");
    }
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

/// The exit codes of the README's table, one row each: every unusable
/// argument or configuration is 78 (clap's own usage errors too), `--help`
/// and `--version` are 0, and 75 is only for what a retry can fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_match_the_table() {
    let db = TempDb::new("lease-cli-codes");
    let sqlite = format!("sqlite:{}", db.path().display());
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--name", "codes"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "echo", "ran"]);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let mut rows: Vec<(String, Vec<String>, i32)> = vec![];
    for ttl in ["banana", "5", "-5s", "0s", "48h"] {
        rows.push((sqlite.clone(), run(&["--ttl", ttl]), 78));
    }
    rows.push((sqlite.clone(), run(&["--ttl", "5s", "--no-such-flag"]), 78));
    rows.push((
        sqlite.clone(),
        vec!["run".into(), "--ttl".into(), "5s".into()],
        78,
    ));
    rows.push((sqlite.clone(), vec![], 78));
    rows.push((sqlite.clone(), vec!["--help".into()], 0));
    rows.push((sqlite.clone(), vec!["run".into(), "--help".into()], 0));
    rows.push((sqlite.clone(), vec!["--version".into()], 0));
    if lease_tests::postgres().await.is_some() {
        let pg = "postgres://postgres@127.0.0.1:5432";
        rows.push((format!("{pg}/no_such_db_h35"), run(&["--ttl", "5s"]), 78));
        let role = "postgres://no_such_role_h35@127.0.0.1:5432/test";
        rows.push((role.to_owned(), run(&["--ttl", "5s"]), 78));
    }
    if lease_tests::mysql().await.is_some() {
        let my = "mysql://root@127.0.0.1:3306";
        rows.push((format!("{my}/no_such_db_h35"), run(&["--ttl", "5s"]), 78));
        let user = "mysql://no_such_user_h35@127.0.0.1:3306/test";
        rows.push((user.to_owned(), run(&["--ttl", "5s"]), 78));
    }
    let refused = "postgres://postgres@127.0.0.1:1/test";
    rows.push((refused.to_owned(), run(&["--ttl", "2s"]), 75));
    // CMD found but not executable: 126 (not found, 127, is
    // cmd_exit_status_is_passed_through's).
    let not_executable = db.path().with_extension("sh");
    std::fs::write(&not_executable, "echo ran\n").unwrap();
    let cmd = not_executable.to_str().unwrap().to_owned();
    let args = ["run", "--name", "codes", "--ttl", "5s", "--", &cmd];
    rows.push((sqlite.clone(), args.map(str::to_owned).to_vec(), 126));
    for (url, args, expected) in rows {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = output(lease_at(&url, &args)).await;
        assert_eq!(code, expected, "{url} {args:?}: {out} {err}");
        assert!(!out.lines().any(|l| l == "ran"), "{args:?}: CMD ran");
    }
    let _ = std::fs::remove_file(not_executable);
}

/// Messages say what happened, in the user's terms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_say_what_happened() {
    let db = TempDb::new("lease-cli-messages");
    let sqlite = format!("sqlite:{}", db.path().display());

    // A refused connection with a short ttl shows the refusal, not a timeout.
    let refused = "postgres://postgres@127.0.0.1:1/test";
    let args = ["run", "--name", "m", "--ttl", "2s", "--", "true"];
    let (_, _, err) = output(lease_at(refused, &args)).await;
    assert!(err.contains("Connection refused"), "{err}");

    // No "at line N" (PostgreSQL's own source line) in a server's error.
    if lease_tests::postgres().await.is_some() {
        let url = "postgres://postgres@127.0.0.1:5432/no_such_db_h35";
        let (_, _, err) = output(lease_at(url, &args)).await;
        assert!(err.contains("\"no_such_db_h35\" does not exist"), "{err}");
        assert!(!err.contains(" at line "), "{err}");
    }

    // An empty name: the rule it breaks, not "cannot acquire  at".
    let empty = ["run", "--name", "", "--ttl", "2s", "--", "true"];
    let (code, _, err) = output(lease_at(&sqlite, &empty)).await;
    assert_eq!(code, 78, "{err}");
    assert!(!err.contains("acquire  at"), "{err}");
    assert!(
        err.contains("--name") && err.contains("1 to 255 bytes"),
        "{err}"
    );

    // A ttl of zero in the user's units.
    let zero = ["run", "--name", "m", "--ttl", "0s", "--", "true"];
    let (_, _, err) = output(lease_at(&sqlite, &zero)).await;
    assert!(err.contains("invalid ttl 0s"), "{err}");

    // Something that is not a URL at all.
    let (code, _, err) = output(lease_at("not a url", &["list"])).await;
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("not a URL"), "{err}");

    // A missing table: what a command user runs to create it, and what
    // `lease schema --create` then says it did.
    if let Some(_pool) = lease_tests::postgres().await {
        let table = unique("h35_missing").replace('-', "_");
        let url = lease_tests::postgres_url();
        let list = ["list", "--table", &table];
        let (code, _, err) = output(lease_at(&url, &list)).await;
        assert_eq!(code, 78, "{err}");
        assert!(err.contains("lease schema --create"), "{err}");
        let create = ["schema", "--create", "--table", &table];
        let (code, out, err) = output(lease_at(&url, &create)).await;
        assert_eq!(code, 0, "{err}");
        assert!(out.contains(&table) && out.contains("created"), "{out}");
        let (code, _, err) = output(lease_at(&url, &list)).await;
        assert_eq!(code, 0, "{err}");
    }
}
