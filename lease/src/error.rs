//! The one error type of the crate.

use std::time::Duration;

/// A `Result` whose error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `leasehold`.
///
/// Invalid input has its own variants ([`InvalidName`](Error::InvalidName),
/// [`InvalidTtl`](Error::InvalidTtl), ...); backend failures keep the driver's
/// error as their [`source`](std::error::Error::source).
///
/// A lease that is *held elsewhere* is not an error: [`Lease::try_acquire`]
/// returns `Ok(None)` and [`Lease::with_lease`] returns
/// [`Outcome::Skipped(Skip::HeldElsewhere)`](crate::Skip::HeldElsewhere).
///
/// [`Lease::try_acquire`]: crate::Lease::try_acquire
/// [`Lease::with_lease`]: crate::Lease::with_lease
/// [`Outcome::Skipped(Skip::HeldElsewhere)`]: crate::Outcome::Skipped
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lease name is empty or longer than 255 bytes.
    #[error("invalid lease name ({len} bytes): a name must be 1 to 255 bytes of UTF-8")]
    InvalidName {
        /// Length of the rejected name in bytes.
        len: usize,
    },

    /// The holder identity is empty or longer than 255 bytes.
    #[error("invalid holder ({len} bytes): a holder must be 1 to 255 bytes of UTF-8")]
    InvalidHolder {
        /// Length of the rejected holder in bytes.
        len: usize,
    },

    /// The ttl is outside 10 ms ..= 24 h or is not a whole number of milliseconds.
    #[error("invalid ttl {}: a ttl must be whole milliseconds from 10ms to 24h inclusive", Human(*ttl))]
    InvalidTtl {
        /// The rejected ttl.
        ttl: Duration,
    },

    /// A duration given to `#[singleton]` as an expression (`min_hold`,
    /// `max_hold`, `wait`), or a `once_per` period, is out of range: each is
    /// whole milliseconds up to 24 h (`once_per`: from 1 ms to 366 days),
    /// and `max_hold` is more than zero. (A literal is checked at compile
    /// time instead; an invalid `ttl` is [`InvalidTtl`](Error::InvalidTtl).)
    #[error(
        "invalid `{argument}` {}: `min_hold`, `max_hold` and `wait` must be whole \
         milliseconds up to 24h, `max_hold` not zero, and `once_per` whole \
         milliseconds from 1ms to 366 days",
        Human(*duration)
    )]
    InvalidDuration {
        /// The argument: `"min_hold"`, `"max_hold"`, `"wait"` or `"once_per"`.
        argument: &'static str,
        /// The rejected duration.
        duration: Duration,
    },

    /// A `grace` ([`Job::grace`](crate::Job::grace), `#[singleton(grace =
    /// ...)]` as an expression) outside its range for the lease's ttl: from
    /// the margin (`ttl/100 + 2 ms`) to `ttl/2`. (A literal is checked at
    /// compile time instead.)
    #[error(
        "invalid `grace` {} for ttl {}: a grace must be from ttl/100 + 2ms to ttl/2",
        Human(*grace),
        Human(*ttl)
    )]
    InvalidGrace {
        /// The rejected grace.
        grace: Duration,
        /// The ttl of the lease it was given for.
        ttl: Duration,
    },

    /// A table name that is not `[A-Za-z_][A-Za-z0-9_]*`, optionally `schema.`-qualified.
    #[error(
        "invalid table name {table:?}: use an identifier of letters, digits and `_` \
         (not starting with a digit), optionally qualified as `schema.table`"
    )]
    InvalidTable {
        /// The rejected table name.
        table: String,
    },

    /// A key prefix (`Redis`, `Etcd`) that is too long (more than 64 bytes) or contains
    /// `{` or `}` (which would change the keys' cluster hash tag).
    #[error(
        "invalid key prefix {prefix:?} ({len} bytes): a prefix must be at most 64 bytes, without `{{` or `}}`"
    )]
    InvalidPrefix {
        /// Length of the rejected prefix in bytes.
        len: usize,
        /// The rejected prefix.
        prefix: String,
    },

    /// [`set_global_default`](crate::set_global_default) was called a second time.
    #[error(
        "a global default lease is already set; set_global_default may be called once per process"
    )]
    GlobalDefaultAlreadySet,

    /// A `#[singleton]` fn had no [`Lease`](crate::Lease) to run on: no
    /// `lease = ...` (or it gave none, e.g. an empty `Option`) and no
    /// [`set_global_default`](crate::set_global_default). Returned only with
    /// `on_error = "return"`; otherwise the run is skipped (logged at error).
    #[error(
        "no lease to run on: call `leasehold::set_global_default` at start-up \
         or pass `lease = ...` to `#[singleton]`"
    )]
    NoLease,

    /// A backend call did not answer in time.
    #[error("{operation} timed out after {}", Human(*after))]
    Timeout {
        /// The operation that timed out (`"acquire"`, `"renew"`, `"release"`, ...).
        operation: &'static str,
        /// How long it was given.
        after: Duration,
    },

    /// No Tokio runtime is running: `leasehold` renews leases on a Tokio task
    /// (the runtime must also have its time driver enabled).
    #[error("no tokio runtime: lease must be used inside a tokio runtime")]
    NoRuntime,

    /// A SQL backend (`PgTable`, `PgAdvisory`, `MySqlTable`, `SqliteTable`) failed.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    #[cfg_attr(
        docsrs,
        doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
    )]
    #[error("database error")]
    Database(#[from] sqlx::Error),

    /// The `Redis` backend failed to run a command.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[error("redis error")]
    Redis(#[from] redis::RedisError),

    /// The `Redis` backend could not get a connection from its pool.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[error("redis pool error")]
    RedisPool(#[from] deadpool_redis::PoolError),

    /// The `Etcd` backend failed: the cluster could not be reached, refused
    /// the request (no leader, a partitioned member) or answered an error.
    #[cfg(feature = "etcd")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    #[error("etcd error")]
    Etcd(#[from] etcd_client::Error),

    /// The lease table cannot be used as it is: it does not exist, a column
    /// is missing (for example `fence` in a table made for the Go services),
    /// or a column has a type with which leases could overlap.
    ///
    /// A table backend checks its table at its first call (once per backend
    /// value and its clones) and answers every call with this error until
    /// the table is fixed; `problem` says what is wrong and why, `fix` the
    /// statement (or step) that fixes it. Retrying does not help until then.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    #[cfg_attr(
        docsrs,
        doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
    )]
    #[error("lease table {table} cannot be used: {problem}; fix: {fix}")]
    Schema {
        /// The table, as the backend names it (`task_leases` by default).
        table: String,
        /// What is wrong with it, naming the column, and why it matters.
        problem: String,
        /// What fixes it: a statement to run, or the step to take.
        fix: String,
    },

    /// A backend returned something the lease protocol does not allow
    /// (for example a negative fencing token).
    #[error("backend protocol violation: {0}")]
    Protocol(String),

    /// The backend cannot do this (for example [`Backend::inspect`] on a
    /// backend that cannot tell who holds a lease).
    ///
    /// [`Backend::inspect`]: crate::Backend::inspect
    #[error("{operation} is not supported by this backend")]
    Unsupported {
        /// The operation asked for (`"inspect"`, ...).
        operation: &'static str,
    },

    /// The [`Lease`](crate::Lease) was shut down
    /// ([`Lease::shutdown`](crate::Lease::shutdown)); it acquires nothing
    /// any more.
    #[error("the lease client was shut down")]
    ShutDown,

    /// A run with [`once_per`](crate::Job::once_per) found its schedule slot
    /// already claimed (or, with `retry_failed`, already run): returned by
    /// [`Job::acquire`](crate::Job::acquire); [`Job::run`](crate::Job::run)
    /// skips with [`Skip::AlreadyRan`](crate::Skip::AlreadyRan) instead.
    #[error("the schedule slot {slot} of {name:?} has run already")]
    AlreadyRan {
        /// The lease's name.
        name: String,
        /// The slot asked for.
        slot: u64,
    },

    /// `LeaseGuard::check_in` (a table backend's guarded write): this
    /// acquisition no longer holds the lease by the server's clock (it
    /// expired, or was released or taken over).
    #[error("the lease {name:?} is no longer held by this acquisition")]
    NotHeld {
        /// The lease's name.
        name: String,
    },

    /// A value to [`proclaim`](crate::Election::proclaim) longer than
    /// 4 KiB (4,096 bytes).
    #[error("invalid value ({len} bytes): a proclaimed value must be at most 4096 bytes")]
    InvalidValue {
        /// Length of the rejected value in bytes.
        len: usize,
    },

    /// A failure of a third-party [`Backend`](crate::Backend).
    #[error("backend error")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// This error with its causes, `: `-separated, as `leasehold` logs it — for
    /// example `database error: error communicating with database:
    /// Connection refused (os error 111)`, where `Display` alone shows
    /// `database error`.
    ///
    /// # Examples
    ///
    /// ```
    /// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    /// let error = leasehold::Error::backend(refused);
    /// assert_eq!(error.to_string(), "backend error");
    /// assert_eq!(error.chain().to_string(), "backend error: connection refused");
    /// ```
    pub fn chain(&self) -> impl std::fmt::Display + '_ {
        Chain(self)
    }

    /// Wraps the error of a third-party [`Backend`](crate::Backend).
    pub fn backend(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self::Backend(error.into())
    }

    /// True for errors caused by the caller's input (name, holder, ttl, a
    /// `#[singleton]` duration, a grace, table, prefix) rather than by the backend: retrying will not help.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Self::InvalidName { .. }
                | Self::InvalidHolder { .. }
                | Self::InvalidTtl { .. }
                | Self::InvalidDuration { .. }
                | Self::InvalidGrace { .. }
                | Self::InvalidTable { .. }
                | Self::InvalidPrefix { .. }
                | Self::InvalidValue { .. }
        )
    }
}

/// A duration as a user writes it: `0s`, `90s`, `48h`, `500ms`, or Rust's
/// `Debug` form (`4.948s`, `10.5µs`) for the rest.
struct Human(Duration);

impl std::fmt::Display for Human {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0;
        let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
        match (secs, nanos) {
            (0, 0) => f.write_str("0s"),
            (s, 0) if s % 3600 == 0 => write!(f, "{}h", s / 3600),
            (s, 0) if s % 60 == 0 => write!(f, "{}m", s / 60),
            (s, 0) => write!(f, "{s}s"),
            (0, n) if n % 1_000_000 == 0 => write!(f, "{}ms", n / 1_000_000),
            _ => write!(f, "{d:?}"),
        }
    }
}

/// An error and its sources, `: `-separated, for log lines and messages:
/// `database error: error communicating with database: Connection refused
/// (os error 111)`. A source whose text its parent already shows is skipped.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = self.0.to_string();
        let mut source = self.0.source();
        while let Some(e) = source {
            if let Some(text) = server_error(e) {
                shown.push_str(": ");
                shown.push_str(&text);
                break; // its source is the same error, in sqlx's words
            }
            let text = e.to_string();
            if !shown.contains(&text) {
                shown.push_str(": ");
                shown.push_str(&text);
            }
            source = e.source();
        }
        f.write_str(&shown)
    }
}

/// An error the database server returned, in the server's words and with
/// its SQLSTATE, for [`Chain`]: sqlx's own `Display` of a PostgreSQL error
/// ends in " at line N", the line of PostgreSQL's source that raised it,
/// which tells a user nothing.
fn server_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    if let Some(sqlx::Error::Database(db)) = e.downcast_ref::<sqlx::Error>() {
        return Some(match db.code() {
            Some(code) => format!(
                "error returned from database: {} (SQLSTATE {code})",
                db.message()
            ),
            None => format!("error returned from database: {}", db.message()),
        });
    }
    let _ = e;
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_user_writes_them() {
        let ms = Duration::from_millis;
        let cases = [
            (Duration::ZERO, "0s"),
            (ms(500), "500ms"),
            (ms(4948), "4.948s"),
            (ms(90_000), "90s"),
            (ms(120_000), "2m"),
            (Duration::from_secs(48 * 3600), "48h"),
            (Duration::from_micros(10_500), "10.5ms"),
            (Duration::from_nanos(10), "10ns"),
        ];
        for (duration, text) in cases {
            assert_eq!(Human(duration).to_string(), text, "{duration:?}");
        }
        assert_eq!(
            Error::InvalidTtl {
                ttl: Duration::ZERO
            }
            .to_string(),
            "invalid ttl 0s: a ttl must be whole milliseconds from 10ms to 24h inclusive"
        );
    }
}
