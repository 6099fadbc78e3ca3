//! The short fault-injection run (CI): every server backend × every fault
//! (`deploy`, `max-hold`, `drift`, `stop-in-txn` and `force-release` on a
//! sample of backends, `FaultSpec::short_on`), and the election scenarios (kill, stop,
//! conn-kill), injected once per documented variant of the fault (at least
//! once), with contenders in separate processes and private servers. It
//! asserts the required zeros and timing bounds; the full run and what each
//! number means are in `docs/RELIABILITY.md`.
//!
//! Needs the shared PostgreSQL (for the checker), the PostgreSQL, MariaDB,
//! Redis and etcd binaries (for the private servers and the 3-member etcd
//! cluster) and libfaketime's `faketime` (`drift`). Without them the test
//! prints `skipped: ...` and passes — unless `LEASE_REQUIRE_SERVICES=1`.

use std::path::PathBuf;

use lease_tests::faults::{Config, Fault, RunError, run};

#[test]
fn every_backend_keeps_one_holder_and_fencing_under_faults() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // The checker's server: skips or fails like every other server test.
        let Some(shared) = lease_tests::postgres().await else {
            return;
        };
        shared.close().await;
        let config = Config::short(PathBuf::from(env!("CARGO_BIN_EXE_fault-suite")));
        let report = match run(&config).await {
            Ok(report) => report,
            Err(RunError::Unavailable(e)) if !lease_tests::services_required() => {
                println!("skipped: cannot start the private servers: {e}");
                return;
            }
            Err(e) => panic!("the fault suite could not run: {e}"),
        };
        println!("{}", report.markdown());
        let failures = report.failures();
        assert!(
            failures.is_empty(),
            "required properties did not hold:\n{}",
            failures.join("\n")
        );
        // Every backend × fault ran, and the election scenarios (a silently
        // skipped scenario is no proof).
        let expected: usize = config
            .backends
            .iter()
            .map(|b| {
                let faults: Vec<Fault> = b
                    .faults()
                    .into_iter()
                    .filter(|f| f.spec().short_on.is_none_or(|on| on.contains(b)))
                    .collect();
                faults.len()
                    + faults
                        .iter()
                        .filter(|f| config.elections.contains(f))
                        .count()
            })
            .sum();
        assert_eq!(report.results.len(), expected);
        // A deploy, a drift, a stop in a checked-in transaction and a
        // force-release, on at least one backend each.
        for fault in [
            Fault::Deploy,
            Fault::Drift,
            Fault::StopInTxn,
            Fault::ForceRelease,
        ] {
            assert!(
                report
                    .results
                    .iter()
                    .any(|r| r.fault == fault && r.hits > 0),
                "no {} landed",
                fault.as_str()
            );
        }
        assert!(report.results.iter().any(|r| r.election));
    });
}
