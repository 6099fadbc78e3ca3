//! The README's demo (`cargo run -p leasehold --features sqlite --example pods`)
//! does what the README says, on a shorter schedule: three pods share one
//! SQLite file; each tick exactly one of them runs the job; the pod running
//! the job is killed with SIGKILL; the others skip the ticks while its lease
//! lives, then one of them takes over with a larger fencing token.
//!
//! This test binary *is* the example — its code, included below, with a
//! shorter [`pods::Schedule`] — so that it can play the demo's parent and
//! its pods, which the demo starts as copies of the running executable
//! (`--pod ...`). Run without those arguments, it runs the demo as a child
//! process (`--demo`), reads everything the demo and its pods print, and
//! checks it. It has no libtest harness (`harness = false` in
//! `tests/Cargo.toml`): it accepts a name filter, `--list` and `--ignored`,
//! and ignores libtest's other options.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[allow(dead_code)] // `main` and the README's schedule are the example's own.
#[path = "../../lease/examples/pods.rs"]
mod pods;

const TEST: &str = "the_readme_demo_runs_one_pod_per_tick_and_takes_over_after_the_kill";

/// The demo, shortened: a tick every 500 ms (half the README's), a lease
/// of four ticks, a job of 300 ms, the kill mid-job of tick 5. The pods get
/// 1.5 s to start (a loaded machine starts processes slowly).
const SHORT: pods::Schedule = pods::Schedule {
    ticks: 11,
    tick: Duration::from_millis(500),
    ttl: Duration::from_millis(2_000),
    job: Duration::from_millis(300),
    kill_at: Duration::from_millis(2_150),
    lead: Duration::from_millis(1_500),
};

/// How long the whole demo may take before the test gives up on it.
const LIMIT: Duration = Duration::from_secs(120);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        // The demo's parent, or one of its pods.
        Some("--demo" | "--pod") => {
            if let Err(e) = pods::run(&SHORT) {
                eprintln!("demo failed: {e}");
                std::process::exit(1);
            }
        }
        _ => lease_tests::single_test(
            &args[1..],
            TEST,
            the_readme_demo_runs_one_pod_per_tick_and_takes_over_after_the_kill,
        ),
    }
}

/// What a pod printed for one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Ran {
        fence: u64,
    },
    Skipped {
        why: String,
    },
    /// Lost the lease mid-job, or could not release it.
    Trouble(String),
}

fn the_readme_demo_runs_one_pod_per_tick_and_takes_over_after_the_kill() {
    let output = run_the_demo();
    print!("{output}");
    let (ticks, killed) = parse(&output);
    let of = |tick: u32| ticks.get(&tick).cloned().unwrap_or_default();
    let runners = |tick: u32| -> Vec<(String, u64)> {
        of(tick)
            .into_iter()
            .filter_map(|(pod, e)| match e {
                Event::Ran { fence } => Some((pod, fence)),
                _ => None,
            })
            .collect()
    };
    assert!(
        output.lines().any(|l| l.starts_with("done:")),
        "the demo did not finish:\n{output}"
    );
    // No errors, no lost leases, no failed releases: nothing a user would
    // take for a fault.
    for (tick, events) in &ticks {
        for (pod, event) in events {
            match event {
                Event::Trouble(line) => panic!("tick {tick}, {pod}: {line}"),
                Event::Skipped { why } if !why.starts_with("held by ") => {
                    panic!("tick {tick}, {pod} skipped for an error: {why}")
                }
                _ => {}
            }
        }
    }

    // The kill comes mid-job of tick `k`. Before it, exactly one pod runs
    // each tick.
    let k = (SHORT.kill_at.as_millis() / SHORT.tick.as_millis()) as u32 + 1;
    for tick in 1..k {
        assert_eq!(runners(tick).len(), 1, "tick {tick}:\n{output}");
    }
    // The kill: of the pod that was running the job of tick `k`.
    let (victim, while_running) = killed.unwrap_or_else(|| panic!("no pod killed:\n{output}"));
    assert!(
        while_running,
        "the demo killed {victim}, which was not running the job:\n{output}"
    );
    let killed_run = runners(k);
    assert_eq!(
        killed_run
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>(),
        [victim.as_str()],
        "tick {k} was the killed pod's"
    );
    let killed_fence = killed_run[0].1;

    // Every pod prints one line per tick; the killed one none after its kill.
    for n in 1..=3 {
        let pod = format!("pod-{n}");
        let last = if pod == victim { k } else { SHORT.ticks };
        for tick in 1..=SHORT.ticks {
            let lines = of(tick).iter().filter(|(p, _)| *p == pod).count();
            let expected = usize::from(tick <= last);
            assert_eq!(lines, expected, "{pod}, tick {tick}:\n{output}");
        }
    }

    // The killed pod's lease lives on for its ttl (four ticks from the
    // start of tick k): the next two ticks are skipped by everyone, as held
    // by the dead pod.
    for tick in k + 1..=k + 2 {
        assert_eq!(
            runners(tick),
            [],
            "tick {tick}, the lease is still live:\n{output}"
        );
        for (pod, event) in of(tick) {
            assert_eq!(
                event,
                Event::Skipped {
                    why: format!("held by {victim}")
                },
                "tick {tick}, {pod}"
            );
        }
    }
    // Then one takes over, with a larger fence, and from then on exactly
    // one pod runs each tick again.
    let takeover = (k + 1..=SHORT.ticks)
        .find(|&t| !runners(t).is_empty())
        .unwrap_or_else(|| panic!("nobody took over after the kill:\n{output}"));
    let (heir, fence) = runners(takeover)[0].clone();
    assert_ne!(heir, victim);
    assert!(
        fence > killed_fence,
        "the takeover's fence {fence} is not larger than the killed pod's {killed_fence}"
    );
    for tick in takeover..=SHORT.ticks {
        assert_eq!(runners(tick).len(), 1, "tick {tick}:\n{output}");
    }
    // Fencing tokens only grow.
    let fences: Vec<u64> = (1..=SHORT.ticks)
        .flat_map(|t| runners(t).into_iter().map(|(_, f)| f))
        .collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences {fences:?}");
}

/// Run the demo (this executable, `--demo`) and return everything it and
/// its pods printed.
fn run_the_demo() -> String {
    let exe = std::env::current_exe().expect("current executable");
    let mut child = Command::new(exe)
        .arg("--demo")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the demo");
    let stdout = child.stdout.take().expect("stdout");
    // The pods inherit the pipe: it ends when the last of them exits.
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
            .join("\n")
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the demo") {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the demo did not end within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = reader.join().expect("reader") + "\n";
    assert!(status.success(), "the demo failed ({status}):\n{output}");
    output
}

/// The events of each tick, by pod; and the pod killed, and whether it was
/// running the job then.
#[allow(clippy::type_complexity)]
fn parse(output: &str) -> (BTreeMap<u32, Vec<(String, Event)>>, Option<(String, bool)>) {
    let mut ticks: BTreeMap<u32, Vec<(String, Event)>> = BTreeMap::new();
    let mut killed = None;
    for line in output.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("!! killed ") {
            let pod = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            assert!(killed.is_none(), "two kills:\n{output}");
            killed = Some((pod, rest.contains("while it ran the job")));
            continue;
        }
        let Some(rest) = line.strip_prefix("tick ") else {
            continue;
        };
        let (tick, what) = rest.split_once(" | ").unwrap_or_else(|| panic!("{line}"));
        let tick: u32 = tick.trim().parse().unwrap_or_else(|_| panic!("{line}"));
        let (pod, what) = what.split_once(' ').unwrap_or_else(|| panic!("{line}"));
        let event = if let Some(fence) = what.strip_prefix("runs the job") {
            let fence = fence
                .trim()
                .strip_prefix("fencing token ")
                .and_then(|f| f.parse().ok())
                .unwrap_or_else(|| panic!("{line}"));
            Event::Ran { fence }
        } else if let Some(why) = what.strip_prefix("skipped: ") {
            Event::Skipped {
                why: why.to_owned(),
            }
        } else {
            Event::Trouble(line.to_owned())
        };
        ticks.entry(tick).or_default().push((pod.to_owned(), event));
    }
    (ticks, killed)
}
