//! [`LeaseGuard`]: a held lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::drop_guard::DropGuard;
use crate::engine::{Engine, Entry};
use crate::{CancellationToken, Error};

/// A held lease, renewed in the background for as long as the guard lives.
///
/// Obtained from [`Lease::try_acquire`](crate::Lease::try_acquire). The lease
/// ends when the guard is [released](LeaseGuard::release) or dropped, or when
/// it is lost — then [`token`](LeaseGuard::token) is cancelled and
/// [`is_valid`](LeaseGuard::is_valid) turns false.
///
/// Dropping the guard releases the lease in the background: the drop never
/// blocks, so another holder may see the lease held for one more round trip.
/// Dropped outside any Tokio runtime (a plain thread), the release is sent
/// on the runtime that renews the lease; if that runtime has shut down too,
/// the lease is left to expire at its ttl. Call
/// [`release`](LeaseGuard::release) to know when (and whether) the release
/// happened.
#[must_use = "the lease is released as soon as the guard is dropped"]
pub struct LeaseGuard {
    /// Releases the lease in the background when dropped; disarmed when the
    /// release is handed elsewhere ([`release`](Self::release),
    /// [`release_at`](Self::release_at)).
    held: DropGuard<(Arc<Engine>, Arc<Entry>)>,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("name", &self.name())
            .field("holder", &&*self.engine().holder)
            .field("fencing_token", &self.fencing_token())
            .field("valid", &self.is_valid())
            .finish()
    }
}

impl LeaseGuard {
    pub(crate) fn new(engine: Arc<Engine>, entry: Arc<Entry>) -> Self {
        let held = DropGuard::new((engine, entry), |(engine, entry)| {
            // Spawns the release; never blocks.
            engine.release_in_background(&entry);
        });
        Self { held }
    }

    fn engine(&self) -> &Arc<Engine> {
        &self.held.0
    }

    pub(crate) fn entry(&self) -> &Arc<Entry> {
        &self.held.1
    }

    /// The lease's name.
    pub fn name(&self) -> &str {
        &self.entry().name
    }

    /// A token that is cancelled when the lease is lost or released.
    ///
    /// Lost means: the backend said another holder has it (or it expired or
    /// was released behind our back), or no renewal succeeded before the
    /// local deadline, `grace` before the lease could pass on (see
    /// [`Job::grace`](crate::Job::grace)). Clones of the token share its
    /// state; hand them to the work the lease protects.
    pub fn token(&self) -> CancellationToken {
        self.entry().cancel.clone()
    }

    /// The fencing token of this acquisition, if the backend provides one.
    ///
    /// It is larger than the token of every earlier acquisition of this name,
    /// so a resource that remembers the largest token it has seen can reject
    /// writes from a holder that lost the lease without noticing (for
    /// example after a long GC or VM pause). `None` for backends without
    /// fencing (`PgAdvisory`).
    pub fn fencing_token(&self) -> Option<u64> {
        self.entry().fencing_token
    }

    /// True while the lease is held: not lost, not released, and the local
    /// deadline not yet passed — judged by reading the clock now, so it is
    /// false right after a long pause of the process even before the
    /// background task has run.
    pub fn is_valid(&self) -> bool {
        self.entry().is_valid()
    }

    /// Stop renewing and give the lease up now.
    ///
    /// The token is cancelled first; then the backend is asked to release.
    /// Releasing a lease that was already lost or taken over is a no-op.
    ///
    /// # Errors
    ///
    /// The backend's error if it could not be reached (the lease then ends
    /// at its ttl), or [`Error::Timeout`] after `min(ttl, 30 s)`. Such a
    /// release may still reach the backend later, so this `Lease` does not
    /// take the name again until a ttl after it was sent: a late release
    /// must not end a newer lease.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future does not stop the release: if the backend has
    /// not answered yet, it is sent again in a task of its own, and the name
    /// is kept from this `Lease` as above.
    pub async fn release(self) -> Result<(), Error> {
        let (engine, entry) = self.held.disarm();
        engine.release(&entry).await
    }

    /// Check, in the caller's transaction on the lease's own database, that
    /// this acquisition still holds the lease, and keep it from every other
    /// holder until that transaction ends: the writes the transaction makes
    /// after the check are this holder's alone, even if this process pauses
    /// past its ttl. `conn` is what a sqlx `Transaction`
    /// derefs to (`&mut *tx`) on a table backend's database: a
    /// `PgConnection` for `PgTable`, a `MySqlConnection` for `MySqlTable`,
    /// a `SqliteConnection` for `SqliteTable` (see [`CheckIn`](crate::CheckIn)).
    ///
    /// One statement, judged by the server's clock, on the row of this
    /// acquisition: a share lock on PostgreSQL and MySQL/MariaDB; on SQLite
    /// a no-op `UPDATE`, which makes the transaction the database's one
    /// writer. On SQLite, check in before the transaction reads anything (or begin
    /// it with `BEGIN IMMEDIATE`): a deferred transaction that read before
    /// another connection wrote cannot become the writer (`SQLITE_BUSY`).
    /// SQLite's waiting writers poll rather than queue, so checked
    /// transactions back to back can starve the holder's renewals: leave
    /// room between them.
    ///
    /// **Keep such a transaction shorter than the grace** (`ttl/3` by
    /// default): the holder's own renewals wait for it too, and the lease
    /// is lost when they cannot get through before its local deadline.
    /// Another holder may be granted the lease as soon as the transaction
    /// ends, if it has expired by then.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use leasehold::{backend::PgTable, Lease};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/test").await?;
    /// let lease = Lease::new(PgTable::new(pool.clone()));
    /// let Some(guard) = lease.try_acquire("billing", Duration::from_secs(30)).await? else {
    ///     return Ok(()); // another replica bills
    /// };
    /// let mut tx = pool.begin().await?;
    /// guard.check_in(&mut *tx).await?; // Err(NotHeld): another replica may bill now
    /// sqlx::query("UPDATE invoices SET sent = true WHERE due").execute(&mut *tx).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::NotHeld`]: this acquisition no longer holds the lease (it
    ///   expired, or was released, force-released or taken over); nothing
    ///   was locked or written. Roll the transaction back.
    /// - [`Error::Unsupported`]: the lease's backend is not a table of
    ///   `conn`'s kind (`Memory`, `Redis`, `PgAdvisory`, `Etcd`, or a
    ///   `PgTable` checked with a `MySqlConnection`, ...). The backend is
    ///   found given as the table itself or as an `Arc` of it.
    /// - [`Error::Schema`]: `conn` is not a connection to the lease table's
    ///   database (it has no such table, or — PostgreSQL, MySQL with an
    ///   unqualified table — its database is not the one the backend's pool
    ///   names).
    /// - [`Error::Database`]: the statement failed (the transaction may
    ///   then be aborted).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the statement running on `conn`, and
    /// the lock taken until the transaction ends; drop (roll back) the
    /// transaction then.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    #[cfg_attr(
        docsrs,
        doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
    )]
    pub async fn check_in<C: crate::CheckIn>(&self, conn: &mut C) -> Result<(), Error> {
        check_in(self.engine(), self.entry(), conn).await
    }

    /// The schedule slot this acquisition claimed, with
    /// [`Job::once_per`](crate::Job::once_per): `floor(clock / period)`,
    /// the same on every replica for one run — a natural idempotency key
    /// for what the run writes. `None` without `once_per`.
    pub fn slot(&self) -> Option<u64> {
        self.entry().slot.map(|(slot, _)| slot)
    }

    /// Mark the run this lease protects as succeeded: with
    /// [`Job::retry_failed`](crate::Job::retry_failed), its release (or
    /// drop) then records the claimed [`slot`](LeaseGuard::slot), so that
    /// the slot does not run again. Without it a released guard leaves the
    /// slot to be run again. ([`Job::run`](crate::Job::run) and
    /// [`Job::try_run`](crate::Job::try_run) call it for you.) Nothing to
    /// do without `retry_failed`.
    pub fn succeeded(&self) {
        self.entry()
            .succeeded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// What publishes a value with this lease ([`Engine::publish`]), to be
    /// awaited without holding the guard.
    pub(crate) fn publisher(&self) -> (Arc<Engine>, Arc<Entry>) {
        (self.engine().clone(), self.entry().clone())
    }

    /// The ttl the lease was acquired with.
    pub fn ttl(&self) -> Duration {
        self.entry().ttl
    }

    /// How long the lease stays valid without another successful renewal:
    /// until its local deadline, by the clock now (zero once lost or
    /// released). Renewals push it out every `ttl/3`.
    pub fn valid_for(&self) -> Duration {
        self.entry().valid_for()
    }

    /// Tell the body to stop (the token fires) and keep the lease, renewed,
    /// for up to its grace while it winds down; see [`Engine::wind_down`].
    pub(crate) fn wind_down(&self) {
        self.engine().wind_down(self.entry());
    }

    /// When the lease was acquired (the acquire request was sent).
    pub(crate) fn acquired_at(&self) -> Instant {
        self.entry().acquired_at
    }

    /// Keep the lease (renewing it) until `at`, then release it in the
    /// background. Returns at once.
    ///
    /// Released now instead if `at` has passed already, or if the lease is
    /// no longer live (lost or released): nothing would renew it.
    pub(crate) fn release_at(self, at: Instant) {
        if Instant::now() >= at || !self.engine().release_at(self.entry(), at) {
            return; // dropping `self` releases now
        }
        drop(self.held.disarm());
    }
}

/// [`LeaseGuard::check_in`] (and [`Term::check_in`](crate::Term::check_in))
/// of the acquisition `entry` on `engine`'s backend.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) async fn check_in<C: crate::CheckIn>(
    engine: &Engine,
    entry: &Entry,
    conn: &mut C,
) -> Result<(), Error> {
    let lease = crate::Acquisition::new(&entry.name, &engine.holder, entry.fencing_token);
    crate::backend::check_in(&*engine.backend, conn, lease).await
}
