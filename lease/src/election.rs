//! Leader election: [`Election`], [`Term`], [`Leadership`] — a long-lived
//! singleton that waits for the lease, holds it, contends again after
//! losing it, and steps down on request.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::engine::timing::acquire_timeout;
use crate::engine::{Attempt, Entry, JobOptions};
use crate::{Error, Lease, LeaseGuard, validate};

/// Where an [`Election`] stands, as [`Election::watch`] reports it.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// Trying to acquire the lease (at the start, or after losing it).
    Contending,
    /// This election holds the lease: it leads until the term's token is
    /// cancelled.
    Leading {
        /// The fencing token of this term.
        fencing_token: Option<u64>,
    },
    /// Another holder has the lease; the election waits for it to go.
    Following {
        /// Who leads, if the backend can tell ([`Backend::inspect`](crate::Backend::inspect)).
        leader: Option<String>,
        /// What the leader [proclaimed](Election::proclaim), if anything.
        value: Option<String>,
    },
    /// Contending, but the backend could not be asked: the last attempt
    /// failed (unreachable, timed out, a server error). The election keeps
    /// trying, a poll apart; logged at warn when this state or its error
    /// changes, not at every attempt.
    Failing {
        /// The last attempt's error, with its causes.
        error: String,
    },
    /// The election has stopped and will never lead: invalid input (name,
    /// ttl or holder; read from the start), no Tokio runtime, or the lease
    /// client was [shut down](Lease::shutdown). Logged at error (shut down:
    /// debug); [`resign`](Election::resign) returns the error.
    Stopped {
        /// Why, with its causes.
        error: String,
    },
}

/// One term of leadership: the time an [`Election`] held its lease once.
///
/// Its [`token`](Term::token) is cancelled when the term ends — the lease
/// was lost (taken over, expired, not renewed before its local deadline),
/// resigned, or the election dropped. Stop leading as soon as it fires, and
/// pass the [`fencing_token`](Term::fencing_token) to the resources the
/// leader writes to.
///
/// A `Term` is the leader's *body*: while any clone of it is
/// alive, the leader may still be acting, so a resigned or dropped
/// [`Election`] releases its lease only once every clone has been dropped
/// — at most its grace after the token fired ([`Job::grace`](crate::Job::grace):
/// `ttl/3`); after that the lease is left to expire on the server, never
/// released under a leader still running. Drop the `Term` (and its clones)
/// when the leader's work has stopped: while a clone of an ended term is
/// alive, its election does not lead again either.
#[derive(Clone, Debug)]
pub struct Term {
    body: Arc<TermBody>,
}

/// What the clones of one [`Term`] share: the lease, and the way back of
/// its guard to the election once the last clone is dropped.
#[derive(Debug)]
struct TermBody {
    entry: Arc<Entry>,
    /// The term's lease, sent back to the election when the last clone is
    /// dropped; if the election no longer waits for it (its grace is over),
    /// the guard is dropped, which releases the lease in the background —
    /// safe then: the leader's body has ended.
    guard: Mutex<Option<(LeaseGuard, oneshot::Sender<LeaseGuard>)>>,
}

impl Drop for TermBody {
    fn drop(&mut self) {
        let taken = self
            .guard
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((guard, back)) = taken {
            // Err: nobody waits for it any more; dropping it releases.
            drop(back.send(guard));
        }
    }
}

impl Term {
    /// A term holding `guard`; the guard comes back on `back` once every
    /// clone of the term is dropped.
    fn new(guard: LeaseGuard, back: oneshot::Sender<LeaseGuard>) -> Self {
        Term {
            body: Arc::new(TermBody {
                entry: guard.entry().clone(),
                guard: Mutex::new(Some((guard, back))),
            }),
        }
    }

    /// Cancelled when this term ends.
    pub fn token(&self) -> CancellationToken {
        self.body.entry.cancel.clone()
    }

    /// The fencing token of this term's acquisition, if the backend has them.
    pub fn fencing_token(&self) -> Option<u64> {
        self.body.entry.fencing_token
    }

    /// True while this term lasts, judged by reading the clock now (the
    /// engine's deadline rules apply: false once the lease's local deadline
    /// has passed, even before the token fires).
    pub fn is_valid(&self) -> bool {
        self.body.entry.is_valid()
    }

    /// [`LeaseGuard::check_in`] for this term's lease: `Ok` iff the term
    /// still holds it, and then no other candidate can be granted it until
    /// the caller's transaction ends.
    ///
    /// # Errors
    ///
    /// As [`LeaseGuard::check_in`]; [`Error::NotHeld`] also once the
    /// term's lease has gone back to its election.
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseGuard::check_in`].
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    #[cfg_attr(
        docsrs,
        doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
    )]
    pub async fn check_in<C: crate::CheckIn>(&self, conn: &mut C) -> Result<(), Error> {
        let Some((engine, entry)) = self.lease() else {
            let name = self.body.entry.name.to_string();
            return Err(Error::NotHeld { name });
        };
        crate::guard::check_in(&engine, &entry, conn).await
    }

    /// The engine and the entry of the term's lease, while its guard is
    /// here (until the last clone is dropped).
    fn lease(&self) -> Option<(Arc<crate::engine::Engine>, Arc<Entry>)> {
        let guard = self.body.guard.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().map(|(guard, _)| guard.publisher())
    }

    /// Publish `value` with the term's lease, bounded by the release's time
    /// limit; a failure is logged (the renewals tell whether the term lasts).
    async fn publish(&self, value: Option<&str>) {
        if let Some((engine, entry)) = self.lease() {
            engine.publish(&entry, value).await;
        }
    }

    /// Tell the leader to stop (the token fires) and keep the lease,
    /// renewed, while it winds down: up to the grace.
    fn wind_down(&self) {
        let guard = self.body.guard.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((guard, _)) = &*guard {
            guard.wind_down();
        }
    }
}

/// A leader election on one lease name: contends in the background, leads
/// while it holds the lease, contends again when it loses it — until it is
/// [resigned](Election::resign) or dropped.
///
/// Made by [`Lease::elect`]. Two elections of one name never lead at once,
/// in one process or across processes, as long as each judges its
/// leadership by [`is_leader`](Election::is_leader) or its [`Term`]
/// (both read the clock, so a paused process does not believe it still
/// leads); [`watch`](Election::watch) reports changes as the background
/// task notices them.
///
/// Dropping an `Election` stops it; if it leads, the lease is released in
/// the background once the leader's [`Term`] is dropped (see
/// [`resign`](Election::resign)).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold::{Leadership, Lease, backend::Memory};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), leasehold::Error> {
/// let db = Memory::new();
/// let ttl = Duration::from_secs(10);
/// let first = Lease::with_holder(db.clone(), "pod-a").elect("scheduler", ttl);
/// let term = first.leading().await; // pod-a leads
/// assert!(term.is_valid());
/// // The leader's work: it runs until the term's token fires, then drops the term.
/// let worker = tokio::spawn(async move {
///     term.token().cancelled().await;
///     term.fencing_token()
/// });
///
/// let second = Lease::with_holder(db, "pod-b").elect("scheduler", ttl);
/// let mut seen = second.watch();
/// seen.wait_for(|l| matches!(l, Leadership::Following { .. })).await.unwrap();
///
/// // Hands over as soon as the worker has stopped, without waiting for the ttl.
/// first.resign().await?;
/// let old = worker.await.unwrap();
/// let next = second.leading().await;
/// assert!(next.fencing_token() > old);
/// # Ok(()) }
/// ```
#[must_use = "dropping an Election stops it"]
pub struct Election {
    name: Arc<str>,
    shared: Arc<Shared>,
    state: watch::Receiver<Leadership>,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), Error>>>,
    /// Why the election could not even start (no runtime).
    failed: Option<Error>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

/// What the election's task shares with its handle.
#[derive(Debug, Default)]
struct Shared {
    /// The current term, while leading.
    term: Mutex<Option<Term>>,
    /// What this candidate publishes while it leads ([`Election::proclaim`]).
    value: Mutex<Option<Arc<str>>>,
    /// Wakes the leading task to publish a new value at once.
    proclaimed: tokio::sync::Notify,
}

impl Shared {
    fn term(&self) -> Option<Term> {
        self.term.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_term(&self, term: Option<Term>) {
        *self.term.lock().unwrap_or_else(|e| e.into_inner()) = term;
    }

    fn value(&self) -> Option<Arc<str>> {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Lease {
    /// Contend for `name` in the background: lead while the lease is held
    /// (renewed every `ttl/3` as any lease), contend again when it is lost,
    /// until the returned [`Election`] is resigned or dropped.
    ///
    /// It waits for the lease as [`acquire`](Lease::acquire) does. An
    /// invalid name, ttl or holder (or no Tokio runtime) stops the election
    /// at once ([`Leadership::Stopped`]).
    pub fn elect(&self, name: &str, ttl: Duration) -> Election {
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        let name: Arc<str> = name.into();
        // Checked here, not only by the task's first attempt, so that the
        // first reading of `watch()` says why the election cannot lead
        // (issue 35).
        let checked = validate::name(&name)
            .and_then(|()| validate::ttl(ttl))
            .and_then(|()| validate::holder(self.holder()))
            .and_then(|()| tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime));
        let (tx, state) = watch::channel(match &checked {
            Ok(_) => Leadership::Contending,
            Err(e) => stopped(&name, e),
        });
        let (task, failed) = match checked {
            Ok(handle) => {
                let campaign = Campaign {
                    lease: self.clone(),
                    name: name.clone(),
                    ttl,
                    shared: shared.clone(),
                    stop: stop.clone(),
                    tx,
                };
                (Some(handle.spawn(campaign.run())), None)
            }
            Err(e) => (None, Some(e)),
        };
        Election {
            name,
            shared,
            state,
            stop,
            task,
            failed,
        }
    }
}

impl Election {
    /// The lease name this election contends for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True while this election leads: it holds the lease, judged by
    /// reading the clock now.
    pub fn is_leader(&self) -> bool {
        self.shared.term().is_some_and(|t| t.is_valid())
    }

    /// The election's state, as a channel that reports every change.
    pub fn watch(&self) -> watch::Receiver<Leadership> {
        self.state.clone()
    }

    /// Resolves when this election leads (at once if it does): its current
    /// [`Term`]. Never resolves for an election that stopped:
    /// [`watch`](Election::watch) then reads [`Leadership::Stopped`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future changes nothing.
    pub async fn leading(&self) -> Term {
        let mut state = self.state.clone();
        loop {
            if let Some(term) = self.shared.term().filter(Term::is_valid) {
                return term;
            }
            if state.changed().await.is_err() {
                // The task is gone: no term will come.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Publish `value` (an address, say) while this candidate leads:
    /// followers read it in [`Leadership::Following`], observers in
    /// [`Observed`](crate::Observed) ([`Lease::observe`]). It is written
    /// with each acquisition of the lease and, when called while leading,
    /// at once (one request, in the background); it ends with the term.
    /// The last value given is kept for the next terms.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidValue`] for a value over 4 KiB (4,096 bytes). A
    /// backend that cannot store a value (plain `PgAdvisory`) fails the
    /// election's next acquisition with [`Error::Unsupported`], seen in
    /// [`Leadership::Stopped`].
    pub fn proclaim(&self, value: impl Into<String>) -> Result<(), Error> {
        let value: String = value.into();
        validate::value(&value)?;
        *self.shared.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(value.into());
        self.shared.proclaimed.notify_one();
        Ok(())
    }

    /// Stop contending and, if leading, end the term: its token fires, and
    /// the lease is released once every clone of the [`Term`] has been
    /// dropped (see there), so that a waiting election takes over without
    /// waiting for the ttl. Returns then, or after the grace.
    ///
    /// # Errors
    ///
    /// The release's error (the lease then ends at its ttl), or the error
    /// that stopped the election (invalid input, no runtime).
    pub async fn resign(mut self) -> Result<(), Error> {
        self.stop.cancel();
        if let Some(error) = self.failed.take() {
            return Err(error);
        }
        match self.task.take() {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        // The task notices and releases in the background.
        self.stop.cancel();
    }
}

/// The election's background task.
struct Campaign {
    lease: Lease,
    name: Arc<str>,
    ttl: Duration,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tx: watch::Sender<Leadership>,
}

impl Campaign {
    // Every backend call is bounded by a time limit (the engine's for
    // acquire and release, `acquire_timeout` for inspect) and raced against
    // `stop`, so that a request that hangs (table backends and PgAdvisory
    // have no statement timeout) neither keeps a follower from contending
    // again nor `resign()` from returning (issue 29).
    async fn run(self) -> Result<(), Error> {
        loop {
            if self.stop.is_cancelled() {
                return Ok(());
            }
            let freed = self.lease.waiter(&self.name, self.ttl);
            // Dropping an acquisition in flight hands out nothing; one that
            // reached the backend ends at its ttl (`try_acquire`'s cancel
            // safety).
            let options = JobOptions {
                value: self.shared.value(),
                ..JobOptions::default()
            };
            let attempt = tokio::select! {
                attempt = self.lease.attempt(&self.name, self.ttl, &options) => attempt,
                () = self.stop.cancelled() => return Ok(()),
            };
            let stopped = match attempt {
                Ok(Attempt::Granted(guard)) => {
                    if let Some(resigned) = self.lead(guard, options.value).await {
                        return resigned;
                    }
                    continue; // lost: contend again at once
                }
                Ok(Attempt::Held { .. }) => self.follow(freed).await,
                Err(e)
                    if e.is_invalid_input()
                        || matches!(e, Error::ShutDown | Error::Unsupported { .. }) =>
                {
                    self.tx.send_replace(stopped(&self.name, &e));
                    return Err(e);
                }
                Err(e) => {
                    // Seen in the state; warned once per change, not at
                    // every attempt a poll apart (issue 35).
                    let error = e.chain().to_string();
                    if self
                        .tx
                        .send_if_modified(|s| replace(s, Leadership::Failing { error }))
                    {
                        tracing::warn!(lease.name = %self.name, error = %e.chain(), "election: could not ask the backend; trying again");
                    } else {
                        tracing::debug!(lease.name = %self.name, error = %e.chain(), "election: the backend still fails; trying again");
                    }
                    self.wait(freed).await
                }
            };
            if stopped {
                return Ok(());
            }
        }
    }

    /// Wait for `freed` (time to try again): `true` if stopped first.
    async fn wait(&self, freed: impl Future<Output = ()>) -> bool {
        tokio::select! {
            () = freed => false,
            () = self.stop.cancelled() => true,
        }
    }

    /// Lead for one term: until the lease is lost (`None`: contend again)
    /// or the election is stopped (`Some`: the release's outcome).
    ///
    /// Either way the term's body — every clone of its [`Term`] — ends
    /// before the lease is released (§6.1): the election waits for the last
    /// clone to be dropped, up to the grace (a resign keeps renewing the
    /// lease meanwhile); a body still running then keeps the lease, which is
    /// left to expire, and its guard releases it when the body ends.
    async fn lead(
        &self,
        guard: LeaseGuard,
        mut published: Option<Arc<str>>,
    ) -> Option<Result<(), Error>> {
        let fencing_token = guard.fencing_token();
        let grace = guard.entry().grace;
        let (back, guard_back) = oneshot::channel();
        let term = Term::new(guard, back);
        let token = term.token();
        self.shared.set_term(Some(term.clone()));
        self.tx.send_replace(Leadership::Leading { fencing_token });
        tracing::info!(lease.name = %self.name, fencing_token, "leading");
        let stopped = loop {
            tokio::select! {
                () = token.cancelled() => break false,
                () = self.stop.cancelled() => break true,
                () = self.shared.proclaimed.notified() => {
                    let value = self.shared.value();
                    if value != published {
                        term.publish(value.as_deref()).await;
                        published = value;
                    }
                }
            }
        };
        if stopped {
            term.wind_down();
        }
        self.shared.set_term(None);
        self.tx.send_replace(Leadership::Contending);
        drop(term);
        let ended = tokio::time::timeout(grace, guard_back).await;
        let guard = match ended {
            Ok(Ok(guard)) => Some(guard),
            _ => {
                tracing::warn!(
                    lease.name = %self.name,
                    fencing_token,
                    ?grace,
                    "the leader still holds its Term at the end of its grace; the lease is left to expire"
                );
                None
            }
        };
        if stopped {
            return Some(match guard {
                Some(guard) => guard.release().await,
                None => Ok(()),
            });
        }
        tracing::warn!(lease.name = %self.name, "leadership lost; contending again");
        drop(guard); // releases in the background
        None
    }

    /// Another holder has the lease: say who, if the backend can tell, and
    /// wait for `freed`; `true` if stopped first.
    async fn follow(&self, freed: impl Future<Output = ()>) -> bool {
        let mut freed = std::pin::pin!(freed);
        let mut ask = std::pin::pin!(tokio::time::timeout(
            acquire_timeout(self.ttl),
            self.lease.inspect(&self.name)
        ));
        let asked = tokio::time::Instant::now();
        let (answer, woken) = tokio::select! {
            answer = &mut ask => (answer, false),
            () = &mut freed => {
                // A wake-up within half a poll of asking (the poll itself
                // comes 0.8 to 1.2 polls after) is no sign of a slow
                // answer (Redis wakes its waiters on any release announced
                // on its channel): let the answer come, then try again.
                // Later, the answer is slow (a hung request): the election
                // follows someone it cannot name, and tries again now.
                if asked.elapsed() >= poll_of(self.ttl) / 2 {
                    self.tx.send_if_modified(|s| {
                        !matches!(s, Leadership::Following { .. })
                            && replace(s, Leadership::Following { leader: None, value: None })
                    });
                    return false;
                }
                tokio::select! {
                    answer = &mut ask => (answer, true),
                    () = self.stop.cancelled() => return true,
                }
            }
            () = self.stop.cancelled() => return true,
        };
        let (leader, value, expires_in) = match answer {
            // An empty holder: the backend cannot name it.
            Ok(Ok(Some(info))) if info.is_held() && !info.forced => {
                let leader = Some(info.holder).filter(|h| !h.is_empty());
                (leader, info.value, info.expires_in)
            }
            Ok(Ok(Some(info))) => (None, None, info.expires_in),
            _ => (None, None, None),
        };
        self.tx
            .send_if_modified(|s| replace(s, Leadership::Following { leader, value }));
        if woken {
            return false;
        }
        // A crashed leader's lease is taken at its expiry, not
        // a poll later: wake then too.
        let at_expiry = expires_in
            .filter(|left| *left < crate::MAX_TTL)
            .map(|left| asked + left + EXPIRY_JITTER);
        tokio::select! {
            () = freed => false,
            () = self.stop.cancelled() => true,
            () = async { tokio::time::sleep_until(at_expiry.unwrap_or(asked)).await }, if at_expiry.is_some() => false,
        }
    }
}

/// How long after a leader's expiry a follower tries (so that the try comes
/// after it on the server's clock too).
const EXPIRY_JITTER: Duration = Duration::from_millis(2);

/// The waiter's poll for a lease of `ttl` (`ttl/10`, at most 1 s).
fn poll_of(ttl: Duration) -> Duration {
    (ttl / 10).min(Duration::from_secs(1))
}

/// The state of an election stopped by `error`, logged.
fn stopped(name: &str, error: &Error) -> Leadership {
    if matches!(error, Error::ShutDown) {
        tracing::debug!(
            lease.name = name,
            "election stopped: the lease client was shut down"
        );
    } else {
        tracing::error!(lease.name = name, error = %error.chain(), "election stopped");
    }
    Leadership::Stopped {
        error: error.chain().to_string(),
    }
}

/// Set `*state` to `new`; whether it changed.
fn replace(state: &mut Leadership, new: Leadership) -> bool {
    if *state == new {
        return false;
    }
    *state = new;
    true
}

#[cfg(test)]
mod tests;
