//! `lease run`: CMD runs only while the lease is held.
//!
//! Order of events: acquire (waiting up to `--wait`); spawn CMD as the
//! leader of a process group of its own, with `LEASE_NAME`, `LEASE_HOLDER`
//! and `LEASE_FENCING_TOKEN`; then wait for the first of
//!
//! - CMD exits: with `--min-hold`, keep the lease until that long after it
//!   was taken; release it, exit with CMD's status;
//! - the lease is lost (the guard's token is cancelled: a renewal found it
//!   taken or released, or the local deadline passed): SIGTERM to CMD's
//!   group, SIGKILL after `--kill-after`, a release that may take at most
//!   [`LOST_RELEASE_LIMIT`], exit [`exit::LOST`];
//! - SIGTERM or SIGINT to `lease`: passed on to CMD's group (with SIGCONT,
//!   for a stopped CMD); CMD's exit then releases the lease as above.
//!
//! CMD has a group of its own so that the whole job — a shell and what it
//! started — is stopped together when the lease is lost. When `lease` is
//! the foreground job of a terminal, CMD's group is made the foreground job
//! while it runs ([`Terminal`]): a CMD that reads the terminal would be
//! stopped for ever otherwise, and the terminal's Ctrl-C reaches CMD.
//!
//! If `lease` itself is killed with SIGKILL, CMD gets SIGKILL too (on
//! Linux: [`die_with_lease`]), so that it does not run on unprotected while
//! the lease expires at its ttl and another host takes over. That signal
//! reaches CMD itself only, not the processes it started.

use std::process::ExitStatus;
use std::time::Duration;

use leasehold::{Backend, Error, Lease, LeaseGuard};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::store::Store;
use crate::{Report, RunArgs, exit};

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

pub(crate) async fn run(store: &Store, args: RunArgs, report: &Report) -> u8 {
    // Registered before anything else: from here on these signals are ours
    // to handle (their default action, ending the process, is gone).
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            report.say(&format!("cannot handle signals: {e}"));
            return exit::UNAVAILABLE;
        }
    };
    if let Some(min_hold) = args.min_hold {
        // The library's rule and error for `min_hold` (`validate::hold` in
        // lease/src/validate.rs, which `#[singleton]` applies; `Job` does not).
        if min_hold > leasehold::MAX_TTL || !min_hold.subsec_nanos().is_multiple_of(1_000_000) {
            let e = Error::InvalidDuration {
                argument: "min_hold",
                duration: min_hold,
            };
            return report.failed(&format!("cannot run {}", args.name), &e);
        }
    }
    let (grace, kill_after) = match stop_times(&args) {
        Ok(times) => times,
        Err(message) => {
            report.say(&message);
            return exit::CONFIG;
        }
    };
    let backend = store.backend();
    let lease = match &args.holder {
        Some(holder) => Lease::with_holder(backend.clone(), own_holder(holder)),
        None => Lease::new(backend.clone()), // HOSTNAME-PID-RANDOM: one of its own
    };
    let mut job = lease.job(&args.name, args.ttl).grace(grace).wait(args.wait);
    if let Some(period) = args.once_per {
        job = job.once_per(period);
        if args.retry_failed {
            job = job.retry_failed();
        }
    }
    let acquired = tokio::select! {
        acquired = job.acquire() => acquired,
        signal = signals.recv() => {
            report.say(&format!("{signal} while waiting for {}; CMD did not run", args.name));
            return 128 + signal as u8;
        }
    };
    let guard = match acquired {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            // Who holds it and until when, if the backend says (one more
            // request, on this path only).
            let by = match backend.inspect(&args.name).await {
                Ok(Some(info)) if info.is_held() => held_by(&info),
                _ => String::new(),
            };
            report.say(&format!(
                "{} is held elsewhere{by}; not running {}",
                args.name,
                args.command[0].to_string_lossy()
            ));
            return args.conflict_exit_code;
        }
        Err(Error::AlreadyRan { slot, .. }) => {
            report.say(&format!(
                "slot {slot} of {} has run already; not running {}",
                args.name,
                args.command[0].to_string_lossy()
            ));
            return args.conflict_exit_code;
        }
        Err(e) => return report.failed(&format!("cannot acquire {}", args.name), &e),
    };
    let acquired = Instant::now(); // at or after the acquisition: safe for `--min-hold`
    let code = supervise(
        &lease,
        &guard,
        acquired,
        &args,
        kill_after,
        &mut signals,
        report,
    )
    .await;
    if code == 0 {
        // `--retry-failed`: only a run that exited 0 records its slot.
        guard.succeeded();
    }
    let lost = guard.token().is_cancelled();
    let release = guard.release();
    let released = if lost {
        // Releasing a lost lease can only end it early where the server
        // still counts it: not worth holding up exit 76 (CMD has ended) by
        // the release's own time limit, min(ttl, 30 s), when the server is
        // what was lost.
        tokio::time::timeout(LOST_RELEASE_LIMIT, release)
            .await
            .unwrap_or(Err(Error::Timeout {
                operation: "release",
                after: LOST_RELEASE_LIMIT,
            }))
    } else {
        release.await
    };
    if let Err(e) = released {
        report.say(&format!(
            "could not release {} (it ends at its ttl): {}",
            args.name,
            report.error_text(&e)
        ));
    }
    code
}

/// ` by HOLDER until TIME` for a held lease (UTC, to the second), or
/// ` by HOLDER` where it has no expiry.
fn held_by(info: &leasehold::LeaseInfo) -> String {
    let until = info
        .expires_in
        .filter(|left| *left < leasehold::MAX_TTL * 2)
        .and_then(|left| std::time::SystemTime::now().checked_add(left))
        .map(|at| format!(" until {}", humantime::format_rfc3339_seconds(at)))
        .unwrap_or_default();
    format!(" by {}{until}", info.holder)
}

/// The grace (`--grace`, default the library's `ttl/3`) and how long CMD
/// has between SIGTERM and SIGKILL (`--kill-after`, default nine tenths of
/// the grace, the rest a margin for the signal and CMD's exit). A
/// `--kill-after` longer than the grace is refused: CMD could still run
/// when the lease passes on. The grace's own range is the
/// library's (`Error::InvalidGrace` at the acquisition).
fn stop_times(args: &RunArgs) -> Result<(Duration, Duration), String> {
    // `ttl/3`: the library's default grace (lease/src/engine/timing.rs).
    let grace = args.grace.unwrap_or(args.ttl / 3);
    let kill_after = args.kill_after.unwrap_or(grace - grace / 10);
    if kill_after > grace {
        return Err(format!(
            "--kill-after {} is longer than the grace, {}: CMD could still run when the lease passes to another host (give at most the grace, or a longer --grace)",
            humantime::format_duration(kill_after),
            humantime::format_duration(grace)
        ));
    }
    Ok((grace, kill_after))
}

/// How long the release of a lease already lost may take.
const LOST_RELEASE_LIMIT: Duration = Duration::from_secs(1);

/// `--holder NAME` made this run's own: `NAME-PID-RANDOM`. A run never
/// re-acquires, and an acquisition by the holder that has the lease is an
/// idempotent re-acquire: two runs under one holder (a cron line's
/// `--holder $(hostname)`, two ticks overlapping) would both run CMD.
fn own_holder(name: &str) -> String {
    use std::hash::BuildHasher;
    // As the library's default holder: `RandomState` is seeded from the
    // OS's randomness, so two processes with one pid (on two hosts) differ.
    let random = std::hash::RandomState::new().hash_one(std::process::id()) as u32;
    format!("{name}-{}-{random:08x}", std::process::id())
}

/// Runs CMD while `guard` holds the lease; the exit code of `lease run`.
async fn supervise(
    lease: &Lease,
    guard: &LeaseGuard,
    acquired: Instant,
    args: &RunArgs,
    kill_after: Duration,
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
    #[cfg(target_os = "linux")]
    die_with_lease(&mut command);
    // Before CMD exists: whether `lease` is the terminal's foreground job.
    let terminal = Terminal::foreground();
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
            // A stopped CMD (Ctrl-Z, SIGSTOP, SIGTTIN) would keep the
            // signal pending, and `lease` would wait for ever.
            let _ = killpg(group, Signal::SIGCONT);
        }
    };
    let terminal = group.and(terminal);
    if let (Some(terminal), Some(group)) = (&terminal, group) {
        terminal.to_foreground(group);
        // CMD may have read the terminal before it was its own: stopped.
        let _ = killpg(group, Signal::SIGCONT);
    }
    let lost = guard.token();
    let ended = loop {
        tokio::select! {
            status = child.wait() => break Some(status),
            () = lost.cancelled() => break None,
            signal = signals.recv() => to_group(signal),
        }
    };
    if let Some(status) = ended {
        if let Some(terminal) = &terminal {
            terminal.to_foreground(getpgrp());
        }
        let code = match status {
            Ok(status) => code_of(status),
            Err(e) => {
                report.say(&format!("lost track of CMD: {e}"));
                return exit::UNAVAILABLE;
            }
        };
        if let Some(min_hold) = args.min_hold {
            // `--min-hold`: the guard renews the lease meanwhile. A loss, or
            // SIGTERM/SIGINT to `lease`, ends the wait.
            tokio::select! {
                () = tokio::time::sleep_until(acquired + min_hold) => {}
                () = lost.cancelled() => {}
                _ = signals.recv() => {}
            }
        }
        return code;
    }
    report.say(&format!(
        "lost the lease {} while CMD ran; stopping it (SIGTERM, SIGKILL after {})",
        args.name,
        humantime::format_duration(kill_after)
    ));
    to_group(Signal::SIGTERM);
    let waited = tokio::time::timeout(kill_after, child.wait()).await;
    // SIGKILL to the group either way: CMD's leader may be gone while
    // something it started still runs without the lease.
    to_group(Signal::SIGKILL);
    if waited.is_err() {
        let _ = child.wait().await;
    }
    if let Some(terminal) = &terminal {
        terminal.to_foreground(getpgrp());
    }
    exit::LOST
}

/// Makes CMD get SIGKILL when `lease` dies (Linux's parent-death signal),
/// so that a `lease run` killed with SIGKILL does not leave CMD running
/// unprotected while the lease expires and another host takes over.
///
/// The signal fires when the *thread* that forked CMD ends, not the
/// process: `command` must be spawned on a thread that lives as long as
/// `lease`. It is: `run` is the future of `main`'s `block_on`, which polls
/// it on the main thread (`tokio::process::Command::spawn` forks on the
/// calling thread); never move it into a spawned task or `spawn_blocking`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_lease(command: &mut tokio::process::Command) {
    use nix::errno::Errno;
    use nix::sys::prctl;
    use nix::unistd::{getpid, getppid, gettid};
    let lease = getpid();
    assert_eq!(
        gettid(),
        lease,
        "BUG: CMD must be spawned on the main thread (its parent-death signal fires when the forking thread ends)"
    );
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are sound (the other threads' locks may
    // be held for ever). It makes two system calls, prctl and getppid, and
    // allocates nothing: its error is a raw errno (`io::Error` from
    // `Errno` is `from_raw_os_error`). It reads only `lease`, a copy.
    unsafe {
        command.pre_exec(move || {
            prctl::set_pdeathsig(Signal::SIGKILL)?;
            // `lease` died before the prctl: the signal will never come.
            if getppid() != lease {
                return Err(Errno::ESRCH.into());
            }
            Ok(())
        });
    }
}

/// The controlling terminal of `lease`, while `lease` is its foreground job
/// (run from an interactive shell, not in the background, not from cron).
///
/// CMD's process group of its own would be a background job of that
/// terminal: a CMD that reads it would be stopped (SIGTTIN) for ever, with
/// the lease held. So CMD's group is made the foreground job while it
/// runs (Ctrl-C, Ctrl-Z then reach CMD directly), and `lease`'s own again
/// after, as a shell does for its jobs.
struct Terminal(std::fs::File);

impl Terminal {
    fn foreground() -> Option<Terminal> {
        let tty = std::fs::File::open("/dev/tty").ok()?; // no terminal
        (tcgetpgrp(&tty).ok()? == getpgrp()).then_some(Terminal(tty))
    }

    /// Makes `group` the terminal's foreground job. SIGTTOU is blocked
    /// meanwhile: from a background group (`lease`, once CMD has the
    /// terminal) the call would otherwise stop `lease`.
    fn to_foreground(&self, group: Pid) {
        let mut ttou = SigSet::empty();
        ttou.add(Signal::SIGTTOU);
        // On this thread only, and given back before any other code runs
        // on it (no await in between).
        let Ok(before) = ttou.thread_swap_mask(SigmaskHow::SIG_BLOCK) else {
            return;
        };
        let _ = tcsetpgrp(&self.0, group);
        let _ = before.thread_set_mask();
    }
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
