//! `lease` over TLS: a private PostgreSQL with `ssl = on`, a throw-away
//! self-signed certificate, and a `pg_hba.conf` that accepts TLS
//! connections only (`hostssl`), so that a run that works went over TLS.
//!
//! Needs `openssl` and PostgreSQL's `initdb`/`postgres` (see
//! `lease_tests::servers`); skipped without them, a failure with
//! `LEASE_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use lease_tests::servers::PrivateServer;
use sqlx::Connection;
use tokio::process::Command;
use tokio::time::{Instant, sleep};

/// `lease ARGS` with `LEASE_URL=url`: exit code, stdout, stderr.
async fn lease(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(env!("CARGO_BIN_EXE_lease"))
            .args(args)
            .env("LEASE_URL", url)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("lease did not finish within 60 s")
    .expect("run lease");
    (
        out.status.code().expect("an exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A certificate for 127.0.0.1 and its key, made by `openssl` in `data`
/// and handed to the owner of `data` (the server's account).
fn make_certificate(data: &Path) -> Result<(), String> {
    let status = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.crt",
        ])
        .current_dir(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("openssl: {e}"))?;
    if !status.success() {
        return Err(format!("openssl failed: {status}"));
    }
    let owner = std::fs::metadata(data).map_err(|e| e.to_string())?;
    for file in ["server.key", "server.crt"] {
        let path = data.join(file);
        std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid()))
            .map_err(|e| format!("chown {file}: {e}"))?;
    }
    std::fs::set_permissions(data.join("server.key"), PermissionsExt::from_mode(0o600))
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_with_sslmode_require() {
    let server = match PrivateServer::postgres().await {
        Ok(server) => server,
        Err(e) if !lease_tests::services_required() => {
            println!("skipped: cannot start a private PostgreSQL: {e}");
            return;
        }
        Err(e) => panic!("cannot start a private PostgreSQL: {e}"),
    };
    let data = server.dir().join("data");
    if let Err(e) = make_certificate(&data) {
        assert!(!lease_tests::services_required(), "{e}");
        println!("skipped: no certificate: {e}");
        return;
    }
    // TLS connections only from now on (the socket for the server's own tools).
    std::fs::write(
        data.join("pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
    )
    .unwrap();
    let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    sqlx::query("ALTER SYSTEM SET ssl = on")
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut admin)
        .await
        .unwrap();
    // The reload is asynchronous: wait until a plain connection is refused.
    let plain = format!("{}?sslmode=disable", server.url());
    let deadline = Instant::now() + Duration::from_secs(20);
    while sqlx::PgConnection::connect(&plain).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the server still accepts plain connections"
        );
        sleep(Duration::from_millis(100)).await;
    }

    let tls = format!("{}?sslmode=require", server.url());
    let (code, _, err) = lease(&tls, &["schema", "--create"]).await;
    assert_eq!(code, 0, "{err}");
    let show = "echo \"$LEASE_NAME $LEASE_FENCING_TOKEN\"";
    let (code, out, err) = lease(
        &tls,
        &[
            "run", "--name", "over-tls", "--ttl", "5s", "--", "sh", "-c", show,
        ],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "over-tls 1"), "{err}");
    let (code, out, err) = lease(&tls, &["list"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("over-tls"), "{out}");

    // The same without TLS is refused by the server (pg_hba.conf, SQLSTATE
    // 28000): configuration, which the next tick meets again, so 78.
    let (code, _, err) = lease(
        &plain,
        &[
            "run",
            "--connect-timeout",
            "2s",
            "--name",
            "over-tls",
            "--ttl",
            "5s",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("no encryption") || err.contains("pg_hba"),
        "{err}"
    );
    drop(admin);
}
