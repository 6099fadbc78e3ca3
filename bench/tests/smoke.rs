//! The benchmark's quick mode: every section runs on every backend, and the
//! required round trips and batching hold. Needs the PostgreSQL, MariaDB and
//! Redis binaries (the benchmark starts private servers, see
//! `lease_tests::servers`); without them it prints `skipped: ...`, unless
//! `LEASE_REQUIRE_SERVICES=1`.

use lease_bench::{Options, Unavailable, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_mode_runs_and_meets_the_requirements() {
    let options = Options {
        quick: true,
        command: "cargo test -p lease-bench".to_owned(),
        ..Options::default()
    };
    let report = match run(&options).await {
        Ok(report) => report,
        Err(e) if e.is::<Unavailable>() && !lease_tests::services_required() => {
            println!("skipped: {e}");
            return;
        }
        Err(e) => panic!("the benchmark did not run: {e}"),
    };
    println!("{}", report.markdown);
    assert!(report.markdown.contains("| SqliteTable |"));
    assert!(
        report.violations.is_empty(),
        "requirements not met: {:#?}",
        report.violations
    );
}
