//! The backend a URL names: its scheme picks it.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::str::FromStr;
use std::time::Duration;

#[cfg(feature = "etcd")]
use leasehold::backend::Etcd;
#[cfg(feature = "mysql")]
use leasehold::backend::MySqlTable;
#[cfg(feature = "redis")]
use leasehold::backend::Redis;
#[cfg(feature = "sqlite")]
use leasehold::backend::SqliteTable;
#[cfg(feature = "postgres")]
use leasehold::backend::{PgAdvisory, PgTable};
use std::sync::Arc;

use leasehold::Error;
use leasehold::backend::BoxedBackend;
#[cfg(feature = "mysql")]
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[cfg(not(any(
    feature = "postgres",
    feature = "mysql",
    feature = "sqlite",
    feature = "redis",
    feature = "etcd"
)))]
compile_error!(
    "leasehold-cli needs at least one backend feature: postgres, mysql, sqlite, redis, redis-cluster or etcd"
);

/// Connections per pool: a lease held by `PgAdvisory` keeps one, a waiter
/// on PostgreSQL listens on one, and a call needs one.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
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
    #[cfg(feature = "postgres")]
    Pg(PgTable),
    #[cfg(feature = "postgres")]
    PgAdvisory(PgAdvisory),
    #[cfg(feature = "mysql")]
    MySql(MySqlTable),
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteTable),
    #[cfg(feature = "redis")]
    Redis(Redis),
    /// Boxed: an etcd client is kilobytes large.
    #[cfg(feature = "etcd")]
    Etcd(Box<Etcd>),
}

impl Store {
    /// The backend `target` names. Nothing is contacted yet, except a
    /// SQLite file, which is opened (and the table created in it).
    pub(crate) async fn open(target: &Target) -> Result<Result<Self, Error>, Usage> {
        let url = target.url.as_str();
        if !url.is_empty() && !url.contains(':') {
            return Err(Usage(format!(
                "not a URL: it has no scheme; use {}",
                schemes()
            )));
        }
        let scheme = url.split(':').next().unwrap_or("").to_ascii_lowercase();
        #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
        let table_only = |what: &str| -> Result<(), Usage> {
            if target.prefix.is_some() {
                return Err(Usage(format!("--prefix is for Redis and etcd, not {what}")));
            }
            Ok(())
        };
        if target.advisory && !matches!(scheme.as_str(), "postgres" | "postgresql") {
            return Err(Usage("--advisory needs a postgres:// URL".to_owned()));
        }
        // (SQLite opens a local file: no connection to time.)
        #[cfg_attr(
            not(any(
                feature = "postgres",
                feature = "mysql",
                feature = "redis",
                feature = "etcd"
            )),
            allow(unused_variables)
        )]
        let timeout = target.connect_timeout;
        match scheme.as_str() {
            #[cfg(feature = "postgres")]
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
            #[cfg(feature = "mysql")]
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
            #[cfg(feature = "sqlite")]
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
            #[cfg(feature = "redis")]
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
            #[cfg(feature = "redis-cluster")]
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
            #[cfg(feature = "etcd")]
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
                "no URL: give --url or set LEASE_URL ({})",
                schemes()
            ))),
            other => Err(Usage(match left_out(other) {
                Some(feature) => format!(
                    "this `lease` was built without the `{feature}` feature, which `{other}:` needs; \
                     install it with `cargo install leasehold-cli --features {feature}` (it knows {})",
                    schemes()
                ),
                None => format!("unknown URL scheme `{other}:`; use {}", schemes()),
            })),
        }
    }

    /// The backend, boxed: what `lease` runs on (the library's
    /// [`BoxedBackend`] answers every `Backend` method as the backend inside).
    pub(crate) fn backend(&self) -> Arc<BoxedBackend> {
        Arc::new(match self.clone() {
            #[cfg(feature = "postgres")]
            Store::Pg(b) => BoxedBackend::new(b),
            #[cfg(feature = "postgres")]
            Store::PgAdvisory(b) => BoxedBackend::new(b),
            #[cfg(feature = "mysql")]
            Store::MySql(b) => BoxedBackend::new(b),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(b) => BoxedBackend::new(b),
            #[cfg(feature = "redis")]
            Store::Redis(b) => BoxedBackend::new(b),
            #[cfg(feature = "etcd")]
            Store::Etcd(b) => BoxedBackend::new(*b),
        })
    }

    /// The `CREATE TABLE` of a table backend, `None` for one without a table.
    pub(crate) fn schema(&self) -> Option<&str> {
        match self {
            #[cfg(feature = "postgres")]
            Store::Pg(t) => Some(t.schema()),
            #[cfg(feature = "mysql")]
            Store::MySql(t) => Some(t.schema()),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(t) => Some(t.schema()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Creates the table of a table backend, if it does not exist.
    pub(crate) async fn ensure_schema(&self) -> Result<(), Error> {
        match self {
            #[cfg(feature = "postgres")]
            Store::Pg(t) => t.ensure_schema().await,
            #[cfg(feature = "mysql")]
            Store::MySql(t) => t.ensure_schema().await,
            #[cfg(feature = "sqlite")]
            Store::Sqlite(t) => t.ensure_schema().await,
            #[allow(unreachable_patterns)]
            _ => Ok(()),
        }
    }

    /// The lease table of a table backend, `None` for one without a table.
    pub(crate) fn table(&self) -> Option<&str> {
        match self {
            #[cfg(feature = "postgres")]
            Store::Pg(t) => Some(t.table()),
            #[cfg(feature = "mysql")]
            Store::MySql(t) => Some(t.table()),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(t) => Some(t.table()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// What `list` cannot tell, for the backends that list in part.
    pub(crate) fn list_note(&self) -> Option<&'static str> {
        match self {
            #[cfg(feature = "postgres")]
            Store::PgAdvisory(_) => Some(
                "advisory locks: PostgreSQL shows keys, not names (#key); only held locks are listed",
            ),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

/// The schemes this build of the command knows, for its messages.
fn schemes() -> String {
    let all = [
        ("postgres://", cfg!(feature = "postgres")),
        ("mysql://, mariadb://", cfg!(feature = "mysql")),
        ("redis://, rediss://", cfg!(feature = "redis")),
        ("redis+cluster://", cfg!(feature = "redis-cluster")),
        ("etcd://", cfg!(feature = "etcd")),
        ("sqlite:", cfg!(feature = "sqlite")),
    ];
    let built: Vec<&str> = all.iter().filter(|(_, on)| *on).map(|(s, _)| *s).collect();
    built.join(", ")
}

/// The command's feature that a known scheme needs, if this build left it
/// out (`None` for a scheme it has, or does not know at all).
fn left_out(scheme: &str) -> Option<&'static str> {
    let (feature, built) = match scheme {
        "postgres" | "postgresql" => ("postgres", cfg!(feature = "postgres")),
        "mysql" | "mariadb" => ("mysql", cfg!(feature = "mysql")),
        "sqlite" => ("sqlite", cfg!(feature = "sqlite")),
        "redis" | "rediss" | "redis+unix" | "unix" => ("redis", cfg!(feature = "redis")),
        "redis+cluster" => ("redis-cluster", cfg!(feature = "redis-cluster")),
        "etcd" => ("etcd", cfg!(feature = "etcd")),
        _ => return None,
    };
    (!built).then_some(feature)
}

/// `call`, failing with [`Error::Timeout`] after `timeout`: a cluster's
/// client connects (and an etcd client with a user authenticates) when it
/// is made, and neither bounds that by itself.
#[cfg(any(feature = "redis-cluster", feature = "etcd"))]
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
#[cfg(any(feature = "redis-cluster", feature = "etcd"))]
#[derive(Debug)]
struct Multi {
    /// `user:password@`, as written, or empty.
    userinfo: String,
    hosts: Vec<String>,
    /// From the first `/` after the hosts, up to `?`; may be empty.
    path: String,
    query: Option<String>,
}

#[cfg(any(feature = "redis-cluster", feature = "etcd"))]
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
    #[cfg(feature = "etcd")]
    fn credentials(&self) -> Option<(String, String)> {
        let info = self.userinfo.strip_suffix('@')?;
        let (user, password) = info.split_once(':').unwrap_or((info, ""));
        let decode = crate::redact::percent_decode;
        Some((decode(user), decode(password)))
    }
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn with_table<D: leasehold::backend::Dialect>(
    table: leasehold::backend::Table<D>,
    name: &Option<String>,
) -> Result<leasehold::backend::Table<D>, Error> {
    match name {
        Some(name) => table.with_table(name),
        None => Ok(table),
    }
}
