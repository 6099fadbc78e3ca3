//! The backend a URL names: its scheme picks it.

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use lease::backend::{Etcd, MySqlTable, PgAdvisory, PgTable, Redis, SqliteTable};
use lease::{Acquisition, Backend, Error, Grant, LeaseInfo};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Connections per pool: a lease held by `PgAdvisory` keeps one, a waiter
/// on PostgreSQL listens on one, and a call needs one.
const MAX_CONNECTIONS: u32 = 4;

/// How to reach the backend, from the command line.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The URL, as given (never printed: see [`crate::redact`]).
    pub(crate) url: String,
    /// `--table`: the lease table (table backends).
    pub(crate) table: Option<String>,
    /// `--prefix`: the key prefix (Redis, etcd).
    pub(crate) prefix: Option<String>,
    /// `--advisory`: PostgreSQL advisory locks instead of a table.
    pub(crate) advisory: bool,
    /// `--connect-timeout`: how long a connection (or a Redis call) may take.
    pub(crate) connect_timeout: Duration,
}

/// A mistake in what was asked for, found before contacting anything.
#[derive(Debug)]
pub(crate) struct Usage(pub(crate) String);

/// Any of the backends, so that one code path serves them all.
#[derive(Debug, Clone)]
pub(crate) enum Store {
    Pg(PgTable),
    PgAdvisory(PgAdvisory),
    MySql(MySqlTable),
    Sqlite(SqliteTable),
    Redis(Redis),
    /// Boxed: an etcd client is kilobytes large.
    Etcd(Box<Etcd>),
}

/// Runs `$body` with `$b` bound to the backend inside `$store`.
macro_rules! each {
    ($store:expr, $b:ident => $body:expr) => {
        match $store {
            Store::Pg($b) => $body,
            Store::PgAdvisory($b) => $body,
            Store::MySql($b) => $body,
            Store::Sqlite($b) => $body,
            Store::Redis($b) => $body,
            Store::Etcd($b) => $body,
        }
    };
}

impl Store {
    /// The backend `target` names. Nothing is contacted yet, except a
    /// SQLite file, which is opened (and the table created in it).
    pub(crate) async fn open(target: &Target) -> Result<Result<Self, Error>, Usage> {
        let url = target.url.as_str();
        let scheme = url.split(':').next().unwrap_or("").to_ascii_lowercase();
        let table_only = |what: &str| -> Result<(), Usage> {
            if target.prefix.is_some() {
                return Err(Usage(format!("--prefix is for Redis and etcd, not {what}")));
            }
            Ok(())
        };
        if target.advisory && !matches!(scheme.as_str(), "postgres" | "postgresql") {
            return Err(Usage("--advisory needs a postgres:// URL".to_owned()));
        }
        let timeout = target.connect_timeout;
        match scheme.as_str() {
            "postgres" | "postgresql" => {
                table_only("PostgreSQL")?;
                let options = PgConnectOptions::from_str(url)
                    .map_err(|e| Usage(format!("not a usable PostgreSQL URL: {e}")))?;
                let pool = PgPoolOptions::new()
                    .max_connections(MAX_CONNECTIONS)
                    .acquire_timeout(timeout)
                    .connect_lazy_with(options);
                if target.advisory {
                    if target.table.is_some() {
                        return Err(Usage("--advisory uses no table (--table)".to_owned()));
                    }
                    return Ok(Ok(Store::PgAdvisory(PgAdvisory::new(pool))));
                }
                Ok(with_table(PgTable::new(pool), &target.table).map(Store::Pg))
            }
            "mysql" | "mariadb" => {
                table_only("MySQL")?;
                let url = format!("mysql{}", &url[scheme.len()..]);
                let options = MySqlConnectOptions::from_str(&url)
                    .map_err(|e| Usage(format!("not a usable MySQL URL: {e}")))?;
                let pool = MySqlPoolOptions::new()
                    .max_connections(MAX_CONNECTIONS)
                    .acquire_timeout(timeout)
                    .connect_lazy_with(options);
                Ok(with_table(MySqlTable::new(pool), &target.table).map(Store::MySql))
            }
            "sqlite" => {
                table_only("SQLite")?;
                let path = url["sqlite:".len()..].trim_start_matches("//");
                let path = path.split('?').next().unwrap_or(path);
                if path.is_empty() {
                    return Err(Usage(
                        "sqlite: needs a file, as in sqlite:/var/lib/leases.db".to_owned(),
                    ));
                }
                let opened = async {
                    let table = SqliteTable::open(path).await?;
                    let table = with_table(table, &target.table)?;
                    if target.table.is_some() {
                        table.ensure_schema().await?;
                    }
                    Ok(Store::Sqlite(table))
                };
                Ok(opened.await)
            }
            "redis" | "rediss" | "redis+unix" | "unix" => {
                if target.table.is_some() {
                    return Err(Usage("--table is for SQL databases, not Redis".to_owned()));
                }
                let mut config = deadpool_redis::Config::from_url(url);
                config.pool = Some(deadpool_redis::PoolConfig {
                    max_size: MAX_CONNECTIONS as usize,
                    timeouts: deadpool_redis::Timeouts {
                        wait: Some(timeout),
                        create: Some(timeout),
                        recycle: Some(timeout),
                    },
                    ..Default::default()
                });
                let pool = config
                    .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                    .map_err(|e| Usage(format!("not a usable Redis URL: {e}")))?;
                let client = redis::Client::open(url)
                    .map_err(|e| Usage(format!("not a usable Redis URL: {e}")))?;
                let backend = Redis::new(pool).with_timeout(timeout).with_pubsub(client);
                Ok(match &target.prefix {
                    Some(prefix) => backend.with_prefix(prefix.as_str()),
                    None => Ok(backend),
                }
                .map(Store::Redis))
            }
            "redis+cluster" => {
                if target.table.is_some() {
                    return Err(Usage("--table is for SQL databases, not Redis".to_owned()));
                }
                let multi = Multi::parse(url)?;
                if !multi.path.trim_start_matches('/').is_empty() || multi.query.is_some() {
                    return Err(Usage(
                        "redis+cluster:// takes no database or options (a cluster has only database 0)"
                            .to_owned(),
                    ));
                }
                let nodes: Vec<String> = multi
                    .hosts
                    .iter()
                    .map(|host| format!("redis://{}{host}", multi.userinfo))
                    .collect();
                let opened = async {
                    let client = redis::Client::open(nodes[0].as_str())?;
                    let backend = connect_within(timeout, "connect", Redis::cluster(&nodes))
                        .await?
                        .with_timeout(timeout)
                        .with_pubsub(client);
                    match &target.prefix {
                        Some(prefix) => backend.with_prefix(prefix.as_str()),
                        None => Ok(backend),
                    }
                    .map(Store::Redis)
                };
                Ok(opened.await)
            }
            "etcd" => {
                if target.table.is_some() {
                    return Err(Usage("--table is for SQL databases, not etcd".to_owned()));
                }
                let multi = Multi::parse(url)?;
                if multi.query.is_some() {
                    return Err(Usage(
                        "etcd:// takes no options after `?`; the key prefix is the path (etcd://host:2379/myapp/lease/) or --prefix".to_owned(),
                    ));
                }
                let in_path = multi.path.strip_prefix('/').unwrap_or(&multi.path);
                let prefix = match (&target.prefix, in_path.is_empty()) {
                    (Some(_), false) => {
                        return Err(Usage(
                            "the key prefix is given twice: in the URL's path and with --prefix"
                                .to_owned(),
                        ));
                    }
                    (Some(prefix), true) => Some(prefix.clone()),
                    (None, false) => Some(crate::redact::percent_decode(in_path)),
                    (None, true) => None,
                };
                let endpoints: Vec<String> =
                    multi.hosts.iter().map(|h| format!("http://{h}")).collect();
                let mut options = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(timeout)
                    .with_keep_alive(Duration::from_secs(5), Duration::from_secs(2))
                    .with_keep_alive_while_idle(true)
                    .with_require_leader(true);
                if let Some((user, password)) = multi.credentials() {
                    options = options.with_user(user, password);
                }
                let opened = async {
                    // `connect_with`, not `new`: renewals go to the member
                    // that leads (see the `Etcd` docs).
                    let backend =
                        connect_within(timeout, "connect", Etcd::connect_with(endpoints, options))
                            .await?
                            .with_timeout(timeout);
                    match prefix {
                        Some(prefix) => backend.with_prefix(prefix),
                        None => Ok(backend),
                    }
                    .map(|b| Store::Etcd(Box::new(b)))
                };
                Ok(opened.await)
            }
            "" => Err(Usage(format!(
                "no URL: give --url or set LEASE_URL ({SCHEMES})"
            ))),
            other => Err(Usage(format!(
                "unknown URL scheme `{other}:`; use {SCHEMES}"
            ))),
        }
    }

    /// The `CREATE TABLE` of a table backend, `None` for one without a table.
    pub(crate) fn schema(&self) -> Option<&str> {
        match self {
            Store::Pg(t) => Some(t.schema()),
            Store::MySql(t) => Some(t.schema()),
            Store::Sqlite(t) => Some(t.schema()),
            Store::PgAdvisory(_) | Store::Redis(_) | Store::Etcd(_) => None,
        }
    }

    /// Creates the table of a table backend, if it does not exist.
    pub(crate) async fn ensure_schema(&self) -> Result<(), Error> {
        match self {
            Store::Pg(t) => t.ensure_schema().await,
            Store::MySql(t) => t.ensure_schema().await,
            Store::Sqlite(t) => t.ensure_schema().await,
            Store::PgAdvisory(_) | Store::Redis(_) | Store::Etcd(_) => Ok(()),
        }
    }

    /// What `list` cannot tell, for the backends that list in part.
    pub(crate) fn list_note(&self) -> Option<&'static str> {
        match self {
            Store::PgAdvisory(_) => Some(
                "advisory locks: PostgreSQL shows keys, not names (#key); only held locks are listed",
            ),
            _ => None,
        }
    }
}

/// The schemes the command knows, for its messages.
const SCHEMES: &str =
    "postgres://, mysql://, mariadb://, redis://, rediss://, redis+cluster://, etcd:// or sqlite:";

/// `call`, failing with [`Error::Timeout`] after `timeout`: a cluster's
/// client connects (and an etcd client with a user authenticates) when it
/// is made, and neither bounds that by itself.
async fn connect_within<T>(
    timeout: Duration,
    operation: &'static str,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| Error::Timeout {
            operation,
            after: timeout,
        })?
}

/// A URL with several `host:port`s: `scheme://[user[:password]@]host:port[,host:port...][/path][?query]`.
#[derive(Debug)]
struct Multi {
    /// `user:password@`, as written, or empty.
    userinfo: String,
    hosts: Vec<String>,
    /// From the first `/` after the hosts, up to `?`; may be empty.
    path: String,
    query: Option<String>,
}

impl Multi {
    fn parse(url: &str) -> Result<Self, Usage> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| Usage("expected scheme://host:port[,host:port...]".to_owned()))?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query.to_owned())),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], rest[at..].to_owned()),
            None => (rest, String::new()),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        let hosts: Vec<String> = hosts.split(',').map(str::to_owned).collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err(Usage(format!("{scheme}:// needs host:port[,host:port...]")));
        }
        Ok(Self {
            userinfo: userinfo.to_owned(),
            hosts,
            path,
            query,
        })
    }

    /// The user and password of the user info, percent-decoded (etcd's
    /// authentication needs both).
    fn credentials(&self) -> Option<(String, String)> {
        let info = self.userinfo.strip_suffix('@')?;
        let (user, password) = info.split_once(':').unwrap_or((info, ""));
        let decode = crate::redact::percent_decode;
        Some((decode(user), decode(password)))
    }
}

fn with_table<D: lease::backend::Dialect>(
    table: lease::backend::Table<D>,
    name: &Option<String>,
) -> Result<lease::backend::Table<D>, Error> {
    match name {
        Some(name) => table.with_table(name),
        None => Ok(table),
    }
}

impl Backend for Store {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        each!(self, b => b.acquire(name, holder, ttl).await)
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        each!(self, b => b.renew(lease, ttl).await)
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        each!(self, b => b.release(lease).await)
    }

    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        each!(self, b => b.renew_many(leases).await)
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        each!(self, b => b.inspect(name).await)
    }

    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        each!(self, b => b.list().await)
    }

    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        each!(self, b => b.force_release(name).await)
    }

    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        let waiting: futures_box::Released = each!(self, b => Box::pin(b.released(name, poll)));
        waiting
    }
}

mod futures_box {
    /// A boxed [`Backend::released`](lease::Backend::released) future.
    pub(super) type Released =
        std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;
}
