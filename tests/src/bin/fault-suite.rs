//! The fault-injection suite of `leasehold` (see `docs/RELIABILITY.md`).
//!
//! ```text
//! fault-suite [--full] [--injections N] [--ttl-ms N] [--slack-ms N] [--drift-rate R]
//!             [--backend pg-table|mysql-table|pg-advisory|pg-advisory-fenced|redis|redis-cluster|etcd]...
//!             [--fault kill|stop|stop-in-txn|deploy|max-hold|conn-kill|steal|latency|
//!                      black-hole|drift|black-hole-long|black-hole-conn|reset|late-release|
//!                      restart|restart-no-persistence|master-kill|leader-kill|leader-pause|
//!                      partition|force-release]...
//!             [--election FAULT]... [--no-elections] [--elections-only]
//!             [--no-pool-ping] [--keep-tables] [--write docs/RELIABILITY.md]
//! fault-suite worker ...   (a contender; started by the suite itself)
//! ```
//!
//! Without `--full` it is the short run that CI does (one injection per
//! backend × fault, but at least one per variant of a fault; `deploy`,
//! `max-hold`, `drift`, `stop-in-txn` and `force-release` on a sample of
//! backends unless `--fault` names them). `--drift-rate` sets the speed of the `drift` victim's clocks
//! (default 0.8; at 0.5 the run reports overlaps). `--write`
//! replaces the generated part of a Markdown file with the report. The exit
//! code is 1 when a required property did not hold, 2 on a usage error, 3
//! when the run could not be done.
//!
//! Election scenarios (contenders run `Lease::elect`) run kill, stop and
//! conn-kill (`--full`: also black-hole, `Fault::ELECTION`) where `--fault`
//! selects them; `--election FAULT` (repeatable) chooses others, `--no-elections`
//! none, `--elections-only` only them.
//!
//! `LEASE_FAULTS_TRACE=1` writes the orchestrator's and the contenders'
//! tracing to stderr (filtered by `RUST_LOG`, e.g. `lease=debug,lease_tests=info`)
//! and keeps the etcd cluster's directory, with its members' logs: for a
//! person reading one run, not for the report.
//!
//! `LEASE_FAULTS_BREAK=<word>,...` breaks the run on purpose, to show that
//! a check can fail (see `tests/src/faults/breaks.rs`); the report says so.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use lease_tests::faults::{self, BackendKind, Config, Fault};

/// The command that regenerates `docs/RELIABILITY.md`.
const COMMAND: &str =
    "cargo run -p lease-tests --release --bin fault-suite -- --full --write docs/RELIABILITY.md";

fn usage(e: &str) -> std::process::ExitCode {
    eprintln!("fault-suite: {e}\n(see the doc comment of tests/src/bin/fault-suite.rs)");
    std::process::ExitCode::from(2)
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        let code = faults::worker::main(&args[1..]);
        return std::process::ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    if std::env::var_os("LEASE_FAULTS_TRACE").is_some() {
        // The orchestrator's own events (faults injected and lifted), with
        // the contenders' (`faults::worker::main`), on stderr.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return usage(&format!("cannot find my own binary: {e}")),
    };
    let mut config = Config::short(exe);
    let (mut backends, mut fault_list, mut elections) = (Vec::new(), Vec::new(), Vec::new());
    let mut write = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
        let parsed: Result<(), String> = (|| {
            match arg.as_str() {
                "--full" => {
                    let full = Config::full(PathBuf::new());
                    config.injections = full.injections;
                    config.elections = full.elections;
                    config.sample = full.sample;
                }
                "--injections" => {
                    config.injections = value()?.parse().map_err(|e| format!("{e}"))?
                }
                "--ttl-ms" => {
                    config.ttl =
                        Duration::from_millis(value()?.parse().map_err(|e| format!("{e}"))?);
                }
                "--slack-ms" => {
                    config.slack =
                        Duration::from_millis(value()?.parse().map_err(|e| format!("{e}"))?);
                }
                "--drift-rate" => {
                    config.drift_rate = value()?.parse().map_err(|e| format!("{e}"))?;
                    if !(config.drift_rate > 0.0 && config.drift_rate <= 1.0) {
                        return Err("--drift-rate is in (0, 1]".to_owned());
                    }
                }
                "--backend" => backends.push(BackendKind::from_str(&value()?)?),
                "--fault" => fault_list.push(Fault::from_str(&value()?)?),
                "--election" => elections.push(Fault::from_str(&value()?)?),
                "--no-elections" => config.elections.clear(),
                "--elections-only" => config.elections_only = true,
                "--keep-tables" => config.keep_tables = true,
                "--no-pool-ping" => config.pool_ping = false,
                "--write" => write = Some(PathBuf::from(value()?)),
                other => return Err(format!("unknown argument {other:?}")),
            }
            Ok(())
        })();
        if let Err(e) = parsed {
            return usage(&e);
        }
    }
    if !backends.is_empty() {
        config.backends = backends;
    }
    if !fault_list.is_empty() {
        // The faults named run on every backend they apply to.
        config.faults = fault_list;
        config.sample = false;
    }
    if !elections.is_empty() {
        config.elections = elections;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return usage(&format!("runtime: {e}")),
    };
    let report = match runtime.block_on(faults::run(&config)) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("fault-suite: {e}");
            return std::process::ExitCode::from(3);
        }
    };
    println!("\n{}", report.markdown());
    if let Some(path) = write {
        if let Err(e) = report.write_into(&path, COMMAND) {
            eprintln!("fault-suite: writing {}: {e}", path.display());
            return std::process::ExitCode::from(3);
        }
        println!("written to {}", path.display());
    }
    if report.failures().is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    }
}
