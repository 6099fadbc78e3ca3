//! `lease run`: CMD runs only while the lease is held.
//!
//! Order of events: acquire (waiting up to `--wait`); spawn CMD as the
//! leader of a process group of its own, with `LEASE_NAME`, `LEASE_HOLDER`
//! and `LEASE_FENCING_TOKEN`; then wait for the first of
//!
//! - CMD exits: release the lease, exit with CMD's status;
//! - the lease is lost (the guard's token is cancelled: a renewal found it
//!   taken or released, or the local deadline passed): SIGTERM to CMD's
//!   group, SIGKILL after `--kill-after`, exit [`exit::LOST`];
//! - SIGTERM or SIGINT to `lease`: passed on to CMD's group; CMD's exit
//!   then releases the lease as above.
//!
//! CMD has a group of its own so that the whole job — a shell and what it
//! started — is stopped together when the lease is lost; it also means a
//! terminal's Ctrl-C reaches `lease`, which passes it on. If `lease` itself
//! is killed with SIGKILL, nothing tells CMD: the lease then ends at its
//! ttl, and another host may start the job while this CMD still runs.

use std::process::ExitStatus;

use lease::{Lease, LeaseGuard};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::store::Store;
use crate::{Report, RunArgs, exit, exit_for};

/// The signals `lease run` passes on to CMD.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next of them.
    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
        }
    }
}

pub(crate) async fn run(store: Store, args: RunArgs, report: &Report) -> u8 {
    // Registered before anything else: from here on these signals are ours
    // to handle (their default action, ending the process, is gone).
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            report.say(&format!("cannot handle signals: {e}"));
            return exit::UNAVAILABLE;
        }
    };
    let lease = match &args.holder {
        Some(holder) => Lease::with_holder(store, holder.clone()),
        None => Lease::new(store),
    };
    let acquired = tokio::select! {
        acquired = lease.acquire(&args.name, args.ttl, args.wait) => acquired,
        signal = signals.recv() => {
            report.say(&format!("{signal} while waiting for {}; CMD did not run", args.name));
            return 128 + signal as u8;
        }
    };
    let guard = match acquired {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            report.say(&format!(
                "{} is held elsewhere; not running {}",
                args.name,
                args.command[0].to_string_lossy()
            ));
            return args.conflict_exit_code;
        }
        Err(e) => {
            report.say(&format!(
                "cannot acquire {} at {}: {}",
                args.name,
                report.url,
                report.error_text(&e)
            ));
            return exit_for(&e);
        }
    };
    let code = supervise(&lease, &guard, &args, &mut signals, report).await;
    if let Err(e) = guard.release().await {
        report.say(&format!(
            "could not release {} (it ends at its ttl): {}",
            args.name,
            report.error_text(&e)
        ));
    }
    code
}

/// Runs CMD while `guard` holds the lease; the exit code of `lease run`.
async fn supervise(
    lease: &Lease,
    guard: &LeaseGuard,
    args: &RunArgs,
    signals: &mut Signals,
    report: &Report,
) -> u8 {
    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("LEASE_NAME", &args.name)
        .env("LEASE_HOLDER", lease.holder())
        .process_group(0);
    match guard.fencing_token() {
        Some(token) => command.env("LEASE_FENCING_TOKEN", token.to_string()),
        None => command.env_remove("LEASE_FENCING_TOKEN"),
    };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            report.say(&format!(
                "cannot run {}: {e}",
                args.command[0].to_string_lossy()
            ));
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let to_group = |signal: Signal| {
        if let Some(group) = group {
            // ESRCH: the group is gone already.
            let _ = killpg(group, signal);
        }
    };
    let lost = guard.token();
    loop {
        tokio::select! {
            status = child.wait() => return match status {
                Ok(status) => code_of(status),
                Err(e) => {
                    report.say(&format!("lost track of CMD: {e}"));
                    exit::UNAVAILABLE
                }
            },
            () = lost.cancelled() => break,
            signal = signals.recv() => to_group(signal),
        }
    }
    report.say(&format!(
        "lost the lease {} while CMD ran; stopping it (SIGTERM, SIGKILL after {})",
        args.name,
        humantime::format_duration(args.kill_after)
    ));
    to_group(Signal::SIGTERM);
    let waited = tokio::time::timeout(args.kill_after, child.wait()).await;
    // SIGKILL to the group either way: CMD's leader may be gone while
    // something it started still runs without the lease.
    to_group(Signal::SIGKILL);
    if waited.is_err() {
        let _ = child.wait().await;
    }
    exit::LOST
}

/// The exit code that reports `status`: its own, or 128 + the signal that
/// ended it (as shells do).
fn code_of(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(1),
        (None, None) => 1,
    }
}
