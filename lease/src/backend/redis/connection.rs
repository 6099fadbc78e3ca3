//! The connection a [`Redis`](super::Redis) sends its calls on: one of its
//! own, from any of three origins, replaced when it fails.
//!
//! Why one connection, out of the pool for good: calls are pipelined on a
//! multiplexed connection, so it need not be checked out per call (which
//! deadpool-redis pays with a `PING` round trip), and no other user of the
//! pool can hold it up (a `BLPOP`, a `MULTI`). Why replace it on any
//! request left without its answer: a connection that went silent (a
//! half-open socket after a partition, a failover behind a virtual IP) is
//! otherwise reported by TCP only after about 15 minutes, and a late answer
//! would be read as the next request's.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{FromRedisValue, RedisError, RedisResult, ScriptInvocation};
use deadpool_redis::Pool;
use futures_util::future::join_all;

use super::scripts::SCRIPTS;
use crate::Error;
use crate::drop_guard::DropGuard;

/// Where a [`Redis`](super::Redis) gets its connection.
pub(super) enum RedisOrigin {
    /// Taken out of a deadpool-redis pool for good: the pool's settings and
    /// hooks apply to it, and it no longer counts against the pool's size.
    Pool(Pool),
    /// Boxed: a client is much larger than a pool handle.
    Client(Box<::redis::Client>),
    #[cfg(feature = "redis-cluster")]
    Cluster(Box<::redis::cluster::ClusterClient>),
}

/// A connection to one server, or to a Redis Cluster (which routes each
/// request to the master of its keys' hash slot).
pub(super) enum RedisConn {
    Single(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(::redis::cluster_async::ClusterConnection),
}

impl RedisConn {
    async fn invoke<T: FromRedisValue>(&self, call: &ScriptInvocation<'_>) -> RedisResult<T> {
        // Clones share the connection; requests need `&mut`.
        match self {
            Self::Single(c) => call.invoke_async(&mut c.clone()).await,
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => call.invoke_async(&mut c.clone()).await,
        }
    }
}

/// The connection that the clones of a [`Redis`](super::Redis) share: the
/// one in use (none before the first call and after it was retired), and
/// where the next one comes from.
pub(super) struct RedisLink {
    origin: RedisOrigin,
    current: Mutex<Option<Arc<RedisConn>>>,
    /// Held while a new connection is opened: calls that find none wait for
    /// that one rather than each opening one.
    opening: tokio::sync::Mutex<()>,
}

impl RedisLink {
    pub(super) fn new(origin: RedisOrigin, current: Option<RedisConn>) -> Self {
        Self {
            origin,
            current: Mutex::new(current.map(Arc::new)),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn origin(&self) -> &RedisOrigin {
        &self.origin
    }

    fn current(&self) -> MutexGuard<'_, Option<Arc<RedisConn>>> {
        // Every update is one assignment: a poisoned lock is consistent.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection in use, or a new one (opened by one caller at a time).
    async fn connection(&self) -> Result<Arc<RedisConn>, Error> {
        if let Some(conn) = self.current().clone() {
            return Ok(conn);
        }
        let _opening = self.opening.lock().await;
        if let Some(conn) = self.current().clone() {
            return Ok(conn);
        }
        let conn = Arc::new(match &self.origin {
            RedisOrigin::Pool(pool) => {
                RedisConn::Single(deadpool_redis::Connection::take(pool.get().await?))
            }
            RedisOrigin::Client(client) => {
                RedisConn::Single(client.get_multiplexed_async_connection().await?)
            }
            #[cfg(feature = "redis-cluster")]
            RedisOrigin::Cluster(client) => {
                RedisConn::Cluster(client.get_async_connection().await?)
            }
        });
        *self.current() = Some(conn.clone());
        Ok(conn)
    }

    /// Never hand out `conn` again (a newer connection is not touched). It
    /// closes once the requests still in flight on it are done.
    fn retire(&self, conn: &Arc<RedisConn>) {
        let mut current = self.current();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *current = None;
            drop(current);
            tracing::debug!("redis connection retired; the next call takes a new one");
        }
    }

    /// `request` on `conn`: if it ends without an answer of the server — a
    /// connection error, or dropped before its answer came (a time limit) —
    /// `conn` is retired.
    async fn guarded<T>(
        self: &Arc<Self>,
        conn: &Arc<RedisConn>,
        request: impl Future<Output = RedisResult<T>>,
    ) -> RedisResult<T> {
        let unanswered = DropGuard::new((self.clone(), conn.clone()), |(link, conn)| {
            link.retire(&conn);
        });
        let result = request.await;
        match &result {
            Err(e) if connection_failed(e) => {
                tracing::debug!(error = %e, "redis connection failed; retiring it");
            }
            _ => drop(unanswered.disarm()),
        }
        result
    }

    /// Send `calls` together (pipelined) within `timeout`. When one ends
    /// without an answer, the connection is retired and the whole batch is
    /// sent once more on a new one: every script may run twice.
    pub(super) async fn run<T: FromRedisValue + Send>(
        self: &Arc<Self>,
        operation: &'static str,
        calls: &[ScriptInvocation<'static>],
        timeout: Duration,
    ) -> Result<Vec<T>, Error> {
        let attempt = async {
            let mut retried = false;
            loop {
                let conn = self.connection().await?;
                let results = join_all(
                    calls
                        .iter()
                        .map(|call| self.guarded(&conn, conn.invoke::<T>(call))),
                )
                .await;
                let failed = results
                    .iter()
                    .any(|r| r.as_ref().is_err_and(connection_failed));
                match results.into_iter().collect::<RedisResult<Vec<T>>>() {
                    Ok(values) => return Ok(values),
                    Err(e) if failed && !retried => {
                        retried = true;
                        tracing::debug!(operation, error = %e, "redis connection lost; retrying on another");
                    }
                    Err(e) => return Err(Error::Redis(e)),
                }
            }
        };
        // On a timeout the requests in flight are dropped: the connection is
        // retired, and the next call takes a new one.
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or(Err(Error::Timeout {
                operation,
                after: timeout,
            }))
    }

    /// Every key under `pattern`, by `SCAN` in steps of `step` keys; on a
    /// Redis Cluster, on every master in turn.
    pub(super) async fn scan(
        self: &Arc<Self>,
        pattern: &str,
        step: u32,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, Error> {
        #[cfg(feature = "redis-cluster")]
        if let RedisOrigin::Cluster(_) = self.origin {
            return tokio::time::timeout(timeout, self.scan_masters(pattern, step))
                .await
                .unwrap_or(Err(Error::Timeout {
                    operation: "list",
                    after: timeout,
                }));
        }
        let (mut keys, mut cursor) = (Vec::new(), "0".to_owned());
        loop {
            let mut call = SCRIPTS.scan.prepare_invoke();
            call.arg(&cursor).arg(pattern).arg(step);
            let [(next, found)] = &self
                .run::<(String, Vec<Vec<u8>>)>("list", &[call], timeout)
                .await?[..]
            else {
                return Err(Error::Protocol(
                    "the scan script answered no value".to_owned(),
                ));
            };
            keys.extend_from_slice(found);
            if next == "0" {
                return Ok(keys);
            }
            cursor = next.clone();
        }
    }

    /// A script without keys runs on one node: `SCAN` every master (the
    /// client's map of the cluster), then each one on by its address.
    #[cfg(feature = "redis-cluster")]
    async fn scan_masters(
        self: &Arc<Self>,
        pattern: &str,
        step: u32,
    ) -> Result<Vec<Vec<u8>>, Error> {
        use ::redis::cluster_routing::{
            MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo,
        };
        use ::redis::{Value, from_redis_value};
        let conn = self.connection().await?;
        let RedisConn::Cluster(c) = &*conn else {
            return Err(Error::Protocol("not a cluster connection".to_owned()));
        };
        let scan = |cursor: &str, routing| {
            let mut cmd = ::redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(step);
            let mut c = c.clone();
            self.guarded(&conn, async move { c.route_command(cmd, routing).await })
        };
        let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        // Without a response policy: each master's answer, by "host:port".
        let mut steps: Vec<(String, Value)> =
            from_redis_value(scan("0", all).await?).map_err(RedisError::from)?;
        let mut keys = Vec::new();
        while let Some((node, answer)) = steps.pop() {
            let (next, found): (String, Vec<Vec<u8>>) =
                from_redis_value(answer).map_err(RedisError::from)?;
            keys.extend(found);
            let Some((host, port)) = node.rsplit_once(':').filter(|_| next != "0") else {
                continue;
            };
            let port = port
                .parse()
                .map_err(|_| Error::Protocol(format!("a cluster node without a port: {node}")))?;
            let routing = SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port,
            };
            let answer = scan(&next, RoutingInfo::SingleNode(routing)).await?;
            steps.push((node, answer));
        }
        Ok(keys)
    }
}

/// `e` says nothing came back on the connection (a timeout, an I/O error,
/// a closed connection), that it is unusable (a protocol error, failed
/// authentication), or that it leads to a primary demoted to a replica
/// (`READONLY`, after a failover behind the same address). An error reply
/// of the server otherwise says the connection works.
fn connection_failed(e: &RedisError) -> bool {
    e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || e.code() == Some("READONLY")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_errors_retire_the_connection() {
        use std::io;
        let io = |kind: io::ErrorKind| RedisError::from(io::Error::from(kind));
        let reply = |bytes: &[u8]| {
            ::redis::parse_redis_value(bytes)
                .expect("a reply")
                .extract_error()
                .expect_err("an error reply")
        };
        // Nothing came back, or the connection is gone or leads to a replica.
        for e in [
            io(io::ErrorKind::TimedOut),
            io(io::ErrorKind::ConnectionReset),
            io(io::ErrorKind::BrokenPipe),
            io(io::ErrorKind::UnexpectedEof),
            reply(b"-READONLY You can't write against a read only replica.\r\n"),
        ] {
            assert!(connection_failed(&e), "{e}");
        }
        // The server answered: the connection works.
        for e in [
            reply(b"-ERR something\r\n"),
            reply(b"-NOSCRIPT No matching script\r\n"),
            reply(b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"),
            reply(b"-BUSY Redis is busy running a script\r\n"),
            RedisError::from((::redis::ErrorKind::UnexpectedReturnType, "not an integer")),
        ] {
            assert!(!connection_failed(&e), "{e}");
        }
    }
}
