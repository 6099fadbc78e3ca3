//! Once per slot across processes (issue 32, point 5): three processes per
//! backend tick every 200 ms, each tick 0 to 150 ms late at random, and run
//! a job with `once_per` = 1 s for 20 s. Every slot of that time runs
//! exactly once — none missed, none twice — on PostgreSQL, MariaDB and
//! Redis (the backends run side by side, each with its own three
//! processes).
//!
//! The test binary plays the processes itself (`--tick BACKEND NAME`), so
//! it has no libtest harness (`harness = false` in `tests/Cargo.toml`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::backend::{MySqlTable, PgTable, Redis};
use leasehold::{Error, Lease};

const TEST: &str = "every_slot_runs_once_across_three_processes";
const BACKENDS: [&str; 3] = ["postgres", "mariadb", "redis"];
const PROCESSES: usize = 3;
const RUN_FOR: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(200);
const PERIOD: Duration = Duration::from_secs(1);
const TTL: Duration = Duration::from_secs(5);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--tick") => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            if let Err(e) = runtime.block_on(tick(&args[2], &args[3])) {
                eprintln!("the ticking process failed: {e}");
                std::process::exit(1);
            }
        }
        _ => lease_tests::single_test(
            &args[1..],
            TEST,
            every_slot_runs_once_across_three_processes,
        ),
    }
}

/// One process: a tick every 200 ms, 0–150 ms late, for [`RUN_FOR`]; a
/// line `RAN <slot>` for every run.
async fn tick(backend: &str, name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let lease = match backend {
        "postgres" => Lease::new(PgTable::new(
            lease_tests::postgres().await.ok_or("no postgres")?,
        )),
        "mariadb" => Lease::new(MySqlTable::new(
            lease_tests::mysql().await.ok_or("no mariadb")?,
        )),
        _ => Lease::new(Redis::connect(&lease_tests::redis_url()).await?),
    };
    let start = tokio::time::Instant::now();
    let mut next = start;
    while next - start < RUN_FOR {
        tokio::time::sleep_until(next + late()).await;
        match lease.job(name, TTL).once_per(PERIOD).acquire().await {
            Ok(Some(guard)) => {
                println!("RAN {}", guard.slot().ok_or("no slot")?);
                tokio::time::sleep(Duration::from_millis(50)).await; // the job
                guard.release().await?;
            }
            Ok(None) | Err(Error::AlreadyRan { .. }) => {}
            Err(e) => eprintln!("tick failed: {}", e.chain()),
        }
        next += TICK;
    }
    lease.shutdown().await;
    Ok(())
}

/// 0 to 150 ms, at random.
fn late() -> Duration {
    use std::hash::{BuildHasher, RandomState};
    Duration::from_millis(RandomState::new().hash_one(()) % 151)
}

fn epoch_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    u64::try_from(since.as_millis()).expect("ms")
}

fn every_slot_runs_once_across_three_processes() {
    // Skipped (or failed with LEASE_REQUIRE_SERVICES=1) like every server test.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let reachable = runtime.block_on(async {
        lease_tests::postgres().await.is_some()
            && lease_tests::mysql().await.is_some()
            && lease_tests::redis().await.is_some()
    });
    if !reachable {
        return;
    }
    // The ledgers need their tables (and the slot column).
    runtime.block_on(async {
        PgTable::new(lease_tests::postgres().await.expect("postgres"))
            .ensure_schema()
            .await
            .expect("ensure_schema");
        MySqlTable::new(lease_tests::mysql().await.expect("mariadb"))
            .ensure_schema()
            .await
            .expect("ensure_schema");
    });
    let exe = std::env::current_exe().expect("current executable");
    let started = epoch_ms();
    let mut children = Vec::new();
    for backend in BACKENDS {
        let name = lease_tests::unique(&format!("once-per-{backend}"));
        for _ in 0..PROCESSES {
            let child = Command::new(&exe)
                .args(["--tick", backend, &name])
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a ticking process");
            children.push((backend, child));
        }
    }
    let mut runs: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (backend, mut child) in children {
        let stdout = child.stdout.take().expect("stdout");
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(slot) = line.strip_prefix("RAN ") {
                runs.entry(backend)
                    .or_default()
                    .push(slot.parse().expect("a slot"));
            }
        }
        let status = child.wait().expect("wait");
        assert!(status.success(), "a {backend} process failed: {status}");
    }
    let ended = epoch_ms();
    // The slots wholly inside the run (processes started a moment late and
    // may stop a moment early: one slot of margin at each end).
    let period = u64::try_from(PERIOD.as_millis()).expect("ms");
    let first = started / period + 2;
    let last = ended / period - 2;
    for backend in BACKENDS {
        let mut slots = runs.remove(backend).unwrap_or_default();
        slots.sort_unstable();
        let twice: Vec<u64> = slots
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        assert!(twice.is_empty(), "{backend}: slots run twice: {twice:?}");
        let missed: Vec<u64> = (first..=last)
            .filter(|s| slots.binary_search(s).is_err())
            .collect();
        assert!(
            missed.is_empty(),
            "{backend}: slots missed: {missed:?} (ran {slots:?})"
        );
        println!("{backend}: {} slots, each run once", slots.len());
    }
}
