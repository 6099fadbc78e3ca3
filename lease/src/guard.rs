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
    /// local deadline (`t_send + ttl - margin` of the last successful
    /// request). Clones of the token share its state; hand them to the work
    /// the lease protects.
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
    /// at its ttl), or [`Error::Timeout`] after `min(ttl, 30 s)`. Since such
    /// a release may still reach the backend later, this `Lease` does not
    /// take the name again until a ttl after the release was sent (by then
    /// the old lease has ended in any case): a late release must not end a
    /// newer lease behind its holder's back.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future does not stop the release: if the backend has
    /// not answered yet, the release is sent again in a task of its own
    /// (releasing is idempotent). As the first request may still arrive
    /// late, this `Lease` can acquire the name again a ttl after it was sent.
    pub async fn release(self) -> Result<(), Error> {
        let (engine, entry) = self.held.disarm();
        engine.release(&entry).await
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
