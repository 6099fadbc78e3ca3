//! `lease`: run a command on exactly one host of a fleet at a time — a
//! distributed `flock -n` for cron lines and scripts, with renewal, loss
//! detection and fencing — and see or end the leases of the `leasehold` crate.
//! The package is `leasehold-cli`; its binary is `lease`.
//!
//! The commands (`run`, `list`, `show`, `release --force`, `schema`) and
//! their exit codes are in `--help` and in the README ("From cron and
//! scripts"); `run` is in `run.rs`, the backends a URL names in
//! `store.rs`, and what keeps passwords out of the output in `redact.rs`.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use leasehold::{Backend, Error, LeaseInfo};

mod redact;
mod run;
mod store;

use store::{Store, Target, Usage};

/// Exit codes of `lease` itself (CMD's own status passes through `run`).
pub(crate) mod exit {
    /// The backend could not be reached or failed (EX_TEMPFAIL: try later).
    pub(crate) const UNAVAILABLE: u8 = 75;
    /// The lease was lost while CMD ran; CMD was stopped.
    pub(crate) const LOST: u8 = 76;
    /// The URL, the table or an argument cannot be used (EX_CONFIG).
    pub(crate) const CONFIG: u8 = 78;
    /// `show`: not held; `release --force`: there was nothing to release.
    pub(crate) const NOT_HELD: u8 = 1;
    /// CMD was found but could not be run.
    pub(crate) const CANNOT_EXECUTE: u8 = 126;
    /// CMD was not found.
    pub(crate) const NOT_FOUND: u8 = 127;
}

const AFTER_HELP: &str = "\
The URL's scheme picks the backend: postgres:// (a lease table; --advisory for
advisory locks), mysql:// or mariadb://, redis:// or rediss://, sqlite:PATH,
redis+cluster://HOST:PORT,HOST:PORT (a Redis Cluster: any of its nodes),
etcd://[USER:PASSWORD@]HOST:PORT,HOST:PORT[/PREFIX] (every member; the key
prefix, default lease/, as the path or --prefix; plain HTTP only).
TLS: postgres://...?sslmode=require, mysql://...?ssl-mode=required, rediss://.
Which schemes a build knows depends on its features: the default install
(cargo install leasehold-cli) has postgres, mysql, sqlite and redis;
redis+cluster:// and etcd:// need --features redis-cluster,etcd.
Keep passwords off the command line: set LEASE_URL, or use the driver's own
environment (PGPASSWORD, ~/.pgpass). lease never prints a password.
LEASE_LOG logs what lease and the library do on stderr, as a tracing filter:
LEASE_LOG=debug, LEASE_LOG=leasehold=debug (renewals, losses, releases).

Exit codes of `lease run`: CMD's own status when it ran (128+N if a signal N
ended it); 0 when the lease is held elsewhere (or --conflict-exit-code);
75 for what a retry can fix (the backend unreachable or restarting); 76 when
the lease was lost while CMD ran; 78 for what the next tick would meet again
(an unusable argument, URL or table, a missing database or role, refused
credentials); 126/127 when CMD cannot be run. --help and --version exit 0.

Example (crontab):
  */5 * * * * LEASE_URL=postgres://cron@db/ops lease run --name nightly-report --ttl 90s -- /usr/local/bin/report";

/// Run a command on exactly one host at a time, and see or end leases.
#[derive(Debug, Parser)]
#[command(name = "lease", version, about, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD only while holding the lease NAME.
    ///
    /// CMD runs in a process group of its own, with LEASE_NAME, LEASE_HOLDER
    /// and LEASE_FENCING_TOKEN (when the backend has fencing tokens) in its
    /// environment, while `lease` renews the lease every ttl/3. If another
    /// host holds the lease, CMD does not run: a line on stderr, exit 0 (or
    /// --conflict-exit-code). If the lease is lost while CMD runs, CMD's
    /// process group gets SIGTERM, then SIGKILL after --kill-after, and
    /// `lease` exits 76: when renewals fail, SIGTERM comes --grace before
    /// another host could take the lease, and SIGKILL before that. SIGTERM and SIGINT sent to `lease` are passed on to
    /// CMD; the lease is released as soon as CMD exits. Otherwise the exit
    /// status is CMD's. Run from a terminal, CMD is its foreground job while
    /// it runs (it may read the terminal; Ctrl-C reaches it). On Linux, CMD
    /// gets SIGKILL if `lease` dies (killed with SIGKILL, say).
    #[command(after_help = AFTER_HELP)]
    Run(RunArgs),
    /// List the leases the backend knows of (held or not).
    List {
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Show one lease: its holder, how long it stays held, its fencing token.
    ///
    /// Exit 0 when it is held, 1 when it is not.
    Show {
        #[command(flatten)]
        backend: BackendArgs,
        /// The lease name.
        name: String,
    },
    /// End a lease, whoever holds it (for a stuck job).
    ///
    /// The evicted holder's next renewal fails (within ttl/3) and, if it is
    /// `lease run`, its command is stopped; nobody gets the lease before the
    /// expiry its holder last renewed it to (a lock delay, so that the
    /// evicted job has that long to stop). --now frees it at once, for a
    /// holder known to be dead (advisory locks offer only that kind). The
    /// fencing counter is kept: the next holder gets a larger token. Exit 0
    /// when a held lease was ended, 1 when it was not held.
    Release {
        /// Required: ending someone else's lease is never the default.
        #[arg(long, required = true)]
        force: bool,
        /// Free the lease at once instead of at its expiry.
        #[arg(long)]
        now: bool,
        #[command(flatten)]
        backend: BackendArgs,
        /// The lease name.
        name: String,
    },
    /// Print the CREATE TABLE of the lease table (or create it with --create).
    Schema {
        #[command(flatten)]
        backend: BackendArgs,
        /// Create the table if it does not exist, instead of printing it.
        #[arg(long)]
        create: bool,
    },
}

/// Where the leases are.
#[derive(Debug, Clone, Args)]
struct BackendArgs {
    /// The backend's URL [default: $LEASE_URL].
    #[arg(
        long,
        env = "LEASE_URL",
        hide_env_values = true,
        value_name = "URL",
        default_value = "",
        hide_default_value = true
    )]
    url: String,
    /// The lease table (table backends; default task_leases).
    #[arg(long, value_name = "TABLE")]
    table: Option<String>,
    /// The key prefix (Redis: default `lease:`; etcd: default `lease/`).
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
    /// Use PostgreSQL advisory locks instead of a lease table.
    #[arg(long)]
    advisory: bool,
    /// How long connecting to the backend may take.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    connect_timeout: Duration,
}

/// The arguments of `lease run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// The lease name (the same on every host that runs this job).
    #[arg(long, value_name = "NAME")]
    pub(crate) name: String,
    /// How long the lease outlives a `lease` that stops renewing it (a crashed host).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub(crate) ttl: Duration,
    /// Wait up to this long for the lease instead of giving up at once.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = duration)]
    pub(crate) wait: Duration,
    /// When renewals fail, how long before the lease could pass to another
    /// host CMD gets SIGTERM: from ttl/100 + 2ms to ttl/2 [default: ttl/3].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub(crate) grace: Option<Duration>,
    /// After the lease is lost: how long CMD has after SIGTERM before
    /// SIGKILL; at most the grace, so that CMD is gone before the lease can
    /// pass on [default: nine tenths of the grace].
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub(crate) kill_after: Option<Duration>,
    /// Run CMD at most once per slot of this period across every host
    /// (slot = the backend's clock / PERIOD): a host whose tick comes when
    /// the slot has run already exits with --conflict-exit-code, CMD not
    /// run. Even if that run failed, unless --retry-failed.
    #[arg(long, value_name = "PERIOD", value_parser = duration)]
    pub(crate) once_per: Option<Duration>,
    /// With --once-per: the slot counts as run only if CMD exits 0, so that
    /// a failed run may run again in its slot (on any host).
    #[arg(long, requires = "once_per")]
    pub(crate) retry_failed: bool,
    /// Keep the lease at least this long after taking it, even if CMD ends
    /// sooner (renewed; `lease` exits when it is over), so that a host whose
    /// cron fires a little later skips this run. Whole milliseconds up to 24h.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub(crate) min_hold: Option<Duration>,
    /// Exit with this code when the lease is held elsewhere.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) conflict_exit_code: u8,
    /// Who holds the lease, as `list` and `show` (and CMD's LEASE_HOLDER)
    /// say: this run is the holder HOLDER-PID-RANDOM, a holder of its own,
    /// so that two runs with one --holder never both run CMD
    /// [default: HOSTNAME].
    #[arg(long, value_name = "HOLDER")]
    pub(crate) holder: Option<String>,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

/// A duration such as `90s`, `1m30s`, `500ms`.
fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 90s, 1m30s, 500ms)"))
}

impl BackendArgs {
    fn target(&self) -> Target {
        Target {
            url: self.url.clone(),
            table: self.table.clone(),
            prefix: self.prefix.clone(),
            advisory: self.advisory,
            connect_timeout: self.connect_timeout,
        }
    }
}

/// Prints to stderr what went wrong, with every password scrubbed.
pub(crate) struct Report {
    secrets: redact::Secrets,
    /// The backend's URL, password hidden.
    pub(crate) url: String,
}

impl Report {
    pub(crate) fn say(&self, line: &str) {
        eprintln!("lease: {}", self.secrets.scrub(line));
    }

    /// `e` and its sources, as one line, with what to do about it.
    pub(crate) fn error_text(&self, e: &Error) -> String {
        self.secrets.scrub(&format!("{}{}", e.chain(), hint(e)))
    }

    /// What went wrong doing `what`: an invalid argument alone (the
    /// backend was not asked), anything else with the backend's URL.
    pub(crate) fn failed(&self, what: &str, e: &Error) -> u8 {
        if e.is_invalid_input() {
            let argument = match e {
                Error::InvalidName { .. } => "--name",
                Error::InvalidHolder { .. } => "--holder",
                Error::InvalidTtl { .. } => "--ttl",
                Error::InvalidDuration { .. } => "--min-hold",
                Error::InvalidTable { .. } => "--table",
                Error::InvalidPrefix { .. } => "--prefix",
                _ => "argument",
            };
            self.say(&format!("{argument}: {}", self.error_text(e)));
        } else {
            self.say(&format!("{what} at {}: {}", self.url, self.error_text(e)));
        }
        exit_for(e)
    }
}

/// The exit code for a backend error: 78 for what the next tick would
/// meet again (input, the table, a missing database or role, refused
/// credentials), 75 for what a retry can fix.
pub(crate) fn exit_for(e: &Error) -> u8 {
    if e.is_invalid_input() || refused_for_good(e) {
        return exit::CONFIG;
    }
    match e {
        #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
        Error::Schema { .. } => exit::CONFIG,
        Error::InvalidName { .. }
        | Error::InvalidHolder { .. }
        | Error::InvalidTtl { .. }
        | Error::InvalidDuration { .. }
        | Error::InvalidTable { .. }
        | Error::InvalidPrefix { .. }
        | Error::Unsupported { .. } => exit::CONFIG,
        _ => exit::UNAVAILABLE,
    }
}

/// A server's answer that no retry changes: a database or role that does
/// not exist, credentials it refuses, a privilege it lacks.
fn refused_for_good(e: &Error) -> bool {
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    if let Error::Database(sqlx::Error::Database(db)) = e {
        // SQLSTATE: invalid authorization (28...: PostgreSQL and MySQL), no
        // such database (3D000), no such schema (3F000), insufficient
        // privilege (42501).
        let code = db.code().unwrap_or_default();
        if code.starts_with("28") || matches!(&*code, "3D000" | "3F000" | "42501") {
            return true;
        }
        // MySQL/MariaDB: access denied to a database, table or command, an
        // unknown database (SQLSTATE 42000, shared with syntax errors).
        #[cfg(feature = "mysql")]
        if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
            return matches!(my.number(), 1044 | 1049 | 1142 | 1143 | 1227);
        }
        return false;
    }
    #[cfg(feature = "redis")]
    if let Error::Redis(r) = e {
        return r.kind() == redis::ErrorKind::AuthenticationFailed;
    }
    let _ = e;
    false
}

/// What a command user does about an error, where the library's own
/// message speaks to a programmer.
pub(crate) fn hint(e: &Error) -> &'static str {
    match e {
        #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
        Error::Schema { .. } => {
            " (create the table with `lease schema --create`, or run the DDL that `lease schema` prints)"
        }
        _ => "",
    }
}

fn main() -> ExitCode {
    // clap's own errors (a bad --ttl, an unknown flag, a missing argument)
    // are unusable arguments like any other: EX_CONFIG, not clap's 2.
    // `--help` and `--version` are not errors.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::CONFIG } else { 0 });
        }
    };
    if let Ok(filter) = std::env::var("LEASE_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lease: cannot start: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let code = runtime.block_on(command(cli.command));
    // Tasks left (a listener, a lingering scheduler) are not waited for.
    runtime.shutdown_timeout(Duration::from_millis(100));
    ExitCode::from(code)
}

async fn command(command: Command) -> u8 {
    let backend = match &command {
        Command::Run(args) => &args.backend,
        Command::List { backend }
        | Command::Show { backend, .. }
        | Command::Release { backend, .. }
        | Command::Schema { backend, .. } => backend,
    };
    let mut target = backend.target();
    if let Command::Run(args) = &command {
        // The library gives an acquisition about its ttl; a connection
        // attempt that outlasted it would end as a bare "acquire timed out",
        // hiding its cause ("Connection refused"). Half the ttl leaves the
        // statement its time and lets the driver report the cause.
        target.connect_timeout = target.connect_timeout.min(args.ttl / 2);
    }
    let report = Report {
        secrets: redact::Secrets::of(&target.url),
        url: redact::url(&target.url),
    };
    let store = match Store::open(&target).await {
        Err(Usage(why)) => {
            if report.url.is_empty() {
                report.say(&why);
            } else {
                report.say(&format!("{why} (URL {})", report.url));
            }
            return exit::CONFIG;
        }
        Ok(Err(e)) => {
            report.say(&format!(
                "cannot open {}: {}",
                report.url,
                report.error_text(&e)
            ));
            return exit_for(&e);
        }
        Ok(Ok(store)) => store,
    };
    let failed = |what: &str, e: &Error| report.failed(what, e);
    let backend = store.backend();
    match command {
        Command::Run(args) => run::run(&store, args, &report).await,
        Command::List { .. } => match backend.list().await {
            Ok(leases) => {
                print_list(&leases);
                if let Some(note) = store.list_note() {
                    report.say(note);
                }
                0
            }
            Err(e) => failed("cannot list", &e),
        },
        Command::Show { name, .. } => match backend.inspect(&name).await {
            Ok(info) => {
                print_show(&name, info.as_ref());
                if info.is_some_and(|i| i.is_held()) {
                    0
                } else {
                    exit::NOT_HELD
                }
            }
            Err(e) => failed(&format!("cannot show {name}"), &e),
        },
        Command::Release { name, now, .. } => {
            let released = if now {
                backend.force_release_now(&name).await
            } else {
                backend.force_release(&name).await
            };
            match released {
                Ok(true) if now => {
                    println!("released {name}");
                    0
                }
                Ok(true) => {
                    // When the lock delay ends, if the backend says.
                    let until = match backend.inspect(&name).await {
                        Ok(Some(info)) => free_at(&info),
                        _ => String::new(),
                    };
                    println!("released {name}: its holder's next renewal fails; free{until}");
                    0
                }
                Ok(false) => {
                    println!("{name} was not held");
                    exit::NOT_HELD
                }
                Err(Error::Unsupported { .. }) if !now => {
                    report.say(&format!(
                        "cannot release {name} with a lock delay: this backend cannot keep one (an advisory lock ends with its session); if its holder is dead, use release --force --now"
                    ));
                    exit::CONFIG
                }
                Err(e) => failed(&format!("cannot release {name}"), &e),
            }
        }
        Command::Schema { create, .. } => {
            if create {
                return match (store.ensure_schema().await, store.table()) {
                    (Ok(()), Some(table)) => {
                        println!("created the lease table {table} (unless it existed)");
                        0
                    }
                    (Ok(()), None) => {
                        println!("nothing to create: this backend needs no table");
                        0
                    }
                    (Err(e), _) => failed("cannot create the table", &e),
                };
            }
            match store.schema() {
                Some(ddl) => println!("{ddl};"),
                None => println!("-- this backend needs no table"),
            }
            0
        }
    }
}

/// How long a lease stays held, for people.
fn expires(info: &LeaseInfo) -> String {
    match info.expires_in {
        None => "-".to_owned(),
        Some(Duration::MAX) => "no expiry".to_owned(),
        Some(left) => format!("{:.1}s", left.as_secs_f64()),
    }
}

/// The widest a column is padded to; longer cells stick out.
const MAX_WIDTH: usize = 40;

/// One line per lease, sorted by name, in aligned columns. A closed
/// stdout (`lease list | head`) ends the listing quietly.
fn print_list(leases: &[LeaseInfo]) {
    use std::io::Write;
    let mut sorted: Vec<&LeaseInfo> = leases.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let rows: Vec<[String; 6]> = sorted
        .iter()
        .map(|l| {
            [
                l.name.clone(),
                match (l.is_held(), l.forced) {
                    (true, true) => "forced",
                    (true, false) => "held",
                    _ => "free",
                }
                .to_owned(),
                if l.holder.is_empty() {
                    "-".to_owned()
                } else {
                    l.holder.clone()
                },
                expires(l),
                l.fencing_token.map_or("-".to_owned(), |f| f.to_string()),
                l.value
                    .clone()
                    .filter(|_| l.is_held())
                    .unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    let header = ["NAME", "STATE", "HOLDER", "EXPIRES IN", "FENCE", "VALUE"].map(str::to_owned);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count()).min(MAX_WIDTH);
        }
    }
    let mut out = std::io::stdout().lock();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        if writeln!(out, "{}", cells.join("  ").trim_end()).is_err() {
            return;
        }
    }
}

/// ` at TIME` (UTC, to the millisecond) when a lease's expiry is known.
fn free_at(info: &LeaseInfo) -> String {
    info.expires_in
        .filter(|left| *left < leasehold::MAX_TTL * 2)
        .and_then(|left| std::time::SystemTime::now().checked_add(left))
        .map(|at| format!(" at {}", humantime::format_rfc3339_millis(at)))
        .unwrap_or_default()
}

fn print_show(name: &str, info: Option<&LeaseInfo>) {
    println!("name: {name}");
    let Some(info) = info else {
        println!("state: free (no record)");
        return;
    };
    match info.expires_in {
        None => println!("state: free (released or expired)"),
        Some(_) if info.forced => println!(
            "state: force-released; nobody may take it until its expiry: free{}",
            free_at(info)
        ),
        Some(Duration::MAX) => println!("state: held (no expiry)"),
        Some(left) => println!("state: held (expires in {:.3}s)", left.as_secs_f64()),
    }
    if let Some(value) = info.value.as_deref().filter(|_| info.is_held()) {
        println!("value: {value}");
    }
    if let Some(slot) = info.slot {
        println!("last slot run: {slot}");
    }
    if !info.holder.is_empty() {
        let last = if info.is_held() {
            "holder"
        } else {
            "last holder"
        };
        println!("{last}: {}", info.holder);
    }
    if let Some(fence) = info.fencing_token {
        println!("fencing token: {fence}");
    }
}
