//! The benchmark's quick mode: every section runs on every backend, each is
//! checked, and every check is met. Needs the PostgreSQL, MariaDB and Redis
//! binaries (the benchmark starts private servers, see
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

    // Every section of every backend was checked, and every server counted
    // (PostgreSQL included): a section that did not run, or a count that was
    // not taken, would be missing here rather than failing.
    let has = |backend: &str, section: &str, what: &str| {
        report
            .checks
            .iter()
            .any(|c| c.backend == backend && c.section == section && c.what.contains(what))
    };
    let mut missing = Vec::new();
    for backend in [
        "PgTable",
        "MySqlTable",
        "SqliteTable",
        "Redis",
        "PgAdvisory",
    ] {
        let server = backend != "SqliteTable";
        let expected = [
            ("rt", "server requests per floor cycle", server),
            ("rt", "server requests per with_lease", server),
            ("overhead", "with_lease / floor", true),
            ("contention", "acquisitions", true),
            ("contention", "server requests per acquisition", server),
            ("scale", "leases renewed in the window", true),
            (
                "scale",
                "server requests in the window",
                server && backend != "PgAdvisory",
            ),
        ];
        for (section, what, wanted) in expected {
            if wanted && !has(backend, section, what) {
                missing.push(format!("{backend}: {section}: {what}"));
            }
        }
    }
    assert!(missing.is_empty(), "checks that did not run: {missing:#?}");

    let violations = report.violations();
    assert!(
        violations.is_empty(),
        "requirements not met: {violations:#?}"
    );
}
