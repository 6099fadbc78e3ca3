//! PostgreSQL `LISTEN` as a [`Source`] of releases, for `PgTable` and
//! `PgAdvisory`: one connection of the backend's pool, through sqlx's
//! [`PgListener`].

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::runtime::Handle;

use super::{Event, Source};
use crate::Error;

/// The longest channel name PostgreSQL keeps (`NAMEDATALEN - 1` bytes): a
/// longer one is cut by `LISTEN` but refused by `pg_notify`.
pub(crate) const MAX_CHANNEL_LEN: usize = 63;

/// Listens on `channel` with a connection of `pool`.
pub(crate) struct PgSource {
    pub(crate) pool: PgPool,
    pub(crate) channel: String,
}

impl Source for PgSource {
    type Subscription = Listening;
    const WHAT: &'static str = "postgres LISTEN";

    async fn subscribe(&self) -> Result<Listening, Error> {
        let mut listening = Listening {
            listener: Some(PgListener::connect_with(&self.pool).await?),
            runtime: Handle::current(),
        };
        if let Some(listener) = listening.listener.as_mut() {
            listener.listen(&self.channel).await?;
        }
        Ok(listening)
    }

    async fn next(subscription: &mut Listening) -> Event {
        let Some(listener) = subscription.listener.as_mut() else {
            return Event::Lost("no listener".to_owned());
        };
        // `try_recv` is cancel safe (sqlx reads whole messages); after an
        // I/O error it connects and listens again by itself, and then
        // answers `Ok(None)`. Any other error (the server's "terminating
        // connection", a failed reconnection) leaves the listener to us:
        // it is dropped, and a new one subscribes.
        match listener.try_recv().await {
            Ok(Some(notification)) => Event::Released(notification.payload().to_owned()),
            Ok(None) => Event::Resubscribed,
            Err(e) => Event::Lost(Error::from(e).chain().to_string()),
        }
    }

    fn closed(&self) -> bool {
        self.pool.is_closed()
    }
}

/// A [`PgListener`], which must be dropped inside a runtime (its drop
/// spawns the `UNLISTEN` and the connection's return to the pool).
pub(crate) struct Listening {
    listener: Option<PgListener>,
    /// The runtime it was opened on, to drop it in if it is dropped outside
    /// any (a runtime shutting down drops the spawned task at once, and the
    /// connection with it).
    runtime: Handle,
}

impl Drop for Listening {
    fn drop(&mut self) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        match Handle::try_current() {
            Ok(_) => drop(listener),
            Err(e) if !e.is_thread_local_destroyed() => {
                let _entered = self.runtime.enter();
                drop(listener);
            }
            // No runtime can be entered on this thread any more: leak the
            // connection rather than panic (the process is exiting).
            Err(_) => std::mem::forget(listener),
        }
    }
}
