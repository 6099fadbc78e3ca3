//! The election example (`cargo run -p leasehold --features sqlite --example
//! leader`, run twice) does what its docs and the README say: the first
//! process leads and works, the second follows it by name; SIGINT (Ctrl-C)
//! makes the leader resign and exit, and the follower leads at once —
//! within about a poll (1 s), long before the leader's lease would have
//! expired (its ttl is 10 s) — with a larger fencing token.
//!
//! This test binary *is* the example — its code, included below — so that
//! it can start the two processes as copies of itself (`--elect <db>`), as
//! `readme_demo.rs` does for the demo. It has no libtest harness
//! (`harness = false` in `tests/Cargo.toml`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use lease_tests::TempDb;

#[allow(dead_code)] // `main` is the example's own.
#[path = "../../lease/examples/leader.rs"]
mod leader;

const TEST: &str = "two_processes_elect_a_leader_and_hand_over_on_sigint";

/// How long a process may take to start and lead or follow (a loaded
/// machine starts processes slowly).
const START: Duration = Duration::from_secs(30);

/// How soon after the leader's SIGINT the follower must lead: half the
/// example's ttl (10 s). A leader that did not release would hold the
/// lease until it expired, 6.7 s to 10 s after its last renewal; the
/// follower's poll is 1 s (+20%).
const HAND_OVER: Duration = Duration::from_secs(5);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        // One of the two processes.
        Some("--elect") => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            if let Err(e) = runtime.block_on(leader::run(Path::new(&args[2]))) {
                eprintln!("the example failed: {e}");
                std::process::exit(1);
            }
        }
        _ => lease_tests::single_test(
            &args[1..],
            TEST,
            two_processes_elect_a_leader_and_hand_over_on_sigint,
        ),
    }
}

fn two_processes_elect_a_leader_and_hand_over_on_sigint() {
    let db = TempDb::new("leader-example");
    let mut first = Process::start(db.path());
    let (first_id, first_fence) = first.leads(START);
    first.expect("working, round 2, ", START);

    let mut second = Process::start(db.path());
    let (second_id, following) = second.expect(" | following ", START);
    let (leader, at) = following
        .trim()
        .split_once(" at ")
        .unwrap_or_else(|| panic!("following whom, where: {following:?}"));
    assert_eq!(
        leader,
        first_id,
        "the follower names the leader:\n{}",
        second.printed()
    );
    assert_eq!(
        at,
        first.address,
        "the follower knows where the leader serves:\n{}",
        second.printed()
    );
    assert_ne!(second_id, first_id);

    let interrupted = Instant::now();
    first.interrupt();
    let (_, led_at, fence) = second.leads_at(HAND_OVER);
    assert!(
        led_at > interrupted,
        "the second led before the first resigned:\n{}",
        second.printed()
    );
    let took = led_at - interrupted;
    println!("the second led {took:?} after the first got SIGINT");
    assert!(
        fence > first_fence,
        "fencing token {fence} after {first_fence}"
    );
    first.expect(" | resigned", START);
    first.exits_cleanly();

    second.expect(&format!("working, round 1, fencing token {fence}"), START);
    second.interrupt();
    second.expect(" | resigned", START);
    second.exits_cleanly();
    // The first never led again after its SIGINT.
    assert_eq!(
        first.printed().matches(" | leading, ").count(),
        1,
        "{}",
        first.printed()
    );
}

/// One process of the example, and what it printed so far.
struct Process {
    child: Child,
    lines: Receiver<(String, Instant)>,
    /// Every line read, in order; `next` is the first not yet examined.
    seen: Vec<String>,
    /// Where it serves, as it said when it led.
    address: String,
}

impl Process {
    fn start(db: &Path) -> Self {
        let exe = std::env::current_exe().expect("current executable");
        let mut child = Command::new(exe)
            .arg("--elect")
            .arg(db)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the example");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((line, Instant::now())).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
            address: String::new(),
        }
    }

    /// Everything it printed so far.
    fn printed(&self) -> String {
        self.seen.join("\n")
    }

    /// The next line containing `what`, within `within`: the process's
    /// holder id (before ` | `), the rest of the line after `what`, and
    /// when it was read.
    fn next(&mut self, what: &str, within: Duration) -> (String, String, Instant) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((line, at)) => {
                    println!("{line}");
                    self.seen.push(line.clone());
                    if let Some((before, after)) = line.split_once(what) {
                        let id = before.split(" | ").next().unwrap_or_default();
                        return (id.to_owned(), after.to_owned(), at);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no {what:?} within {within:?}:\n{}", self.printed())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("ended without {what:?}:\n{}", self.printed())
                }
            }
        }
    }

    fn expect(&mut self, what: &str, within: Duration) -> (String, String) {
        let (id, rest, _) = self.next(what, within);
        (id, rest)
    }

    /// It leads within `within`: its id and fencing token.
    fn leads(&mut self, within: Duration) -> (String, u64) {
        let (id, _, fence) = self.leads_at(within);
        (id, fence)
    }

    /// It leads within `within`: its id, when it said so, its fencing token.
    fn leads_at(&mut self, within: Duration) -> (String, Instant, u64) {
        let (id, rest, at) = self.next(" | leading, fencing token ", within);
        let (fence, address) = rest
            .trim()
            .split_once(", serving at ")
            .unwrap_or_else(|| panic!("a fencing token and an address: {rest:?}"));
        let fence = fence
            .parse()
            .unwrap_or_else(|_| panic!("a fencing token: {fence:?}"));
        self.address = address.to_owned();
        (id, at, fence)
    }

    /// SIGINT, as Ctrl-C in its terminal.
    fn interrupt(&self) {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill -INT");
        assert!(status.success(), "kill -INT: {status}");
    }

    /// It exits with success within [`START`].
    fn exits_cleanly(&mut self) {
        let deadline = Instant::now() + START;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "still running:\n{}",
                self.printed()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{status}:\n{}", self.printed());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
