//! The benchmark's quick mode (about 10 s): every section runs on every
//! backend, and the required round trips and batching hold. Needs the test
//! servers (PostgreSQL, MariaDB/MySQL with a root that may create a user)
//! and a `redis-server` binary; without them it prints `skipped: ...`,
//! unless `LEASE_REQUIRE_SERVICES=1`.

use lease_bench::{Options, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_mode_runs_and_meets_the_requirements() {
    // The servers the benchmark uses; each helper prints `skipped` or panics.
    if lease_tests::postgres().await.is_none()
        || lease_tests::mysql().await.is_none()
        || lease_tests::redis().await.is_none()
    {
        return;
    }
    let options = Options {
        quick: true,
        command: "cargo test -p lease-bench".to_owned(),
        ..Options::default()
    };
    let report = run(&options).await.expect("the benchmark runs");
    println!("{}", report.markdown);
    assert!(report.markdown.contains("| SqliteTable |"));
    assert!(
        report.violations.is_empty(),
        "requirements not met: {:#?}",
        report.violations
    );
}
