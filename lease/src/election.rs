//! Leader election: [`Election`], [`Term`], [`Leadership`] — a long-lived
//! singleton that waits for the lease, holds it, contends again after
//! losing it, and steps down on request.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::engine::Entry;
use crate::{Error, Lease, LeaseGuard};

/// Where an [`Election`] stands, as [`Election::watch`] reports it.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// Trying to acquire the lease (at the start, after losing it, or
    /// while the backend cannot be reached).
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
    },
}

/// One term of leadership: the time an [`Election`] held its lease once.
///
/// Its [`token`](Term::token) is cancelled when the term ends — the lease
/// was lost (taken over, expired, not renewed before its local deadline),
/// resigned, or the election dropped. Stop leading as soon as it fires, and
/// pass the [`fencing_token`](Term::fencing_token) to the resources the
/// leader writes to.
#[derive(Clone, Debug)]
pub struct Term {
    entry: Arc<Entry>,
}

impl Term {
    /// Cancelled when this term ends.
    pub fn token(&self) -> CancellationToken {
        self.entry.cancel.clone()
    }

    /// The fencing token of this term's acquisition, if the backend has them.
    pub fn fencing_token(&self) -> Option<u64> {
        self.entry.fencing_token
    }

    /// True while this term lasts, judged by reading the clock now (the
    /// engine's deadline rules apply: false once the lease's local deadline
    /// has passed, even before the token fires).
    pub fn is_valid(&self) -> bool {
        self.entry.is_valid()
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
/// the background.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lease::{Leadership, Lease, backend::Memory};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), lease::Error> {
/// let db = Memory::new();
/// let ttl = Duration::from_secs(10);
/// let first = Lease::with_holder(db.clone(), "pod-a").elect("scheduler", ttl);
/// let term = first.leading().await; // pod-a leads
/// assert!(term.is_valid());
///
/// let second = Lease::with_holder(db, "pod-b").elect("scheduler", ttl);
/// let mut seen = second.watch();
/// seen.wait_for(|l| matches!(l, Leadership::Following { .. })).await.unwrap();
///
/// first.resign().await?; // hands over at once, without waiting for the ttl
/// assert!(term.token().is_cancelled());
/// let next = second.leading().await;
/// assert!(next.fencing_token() > term.fencing_token());
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
}

impl Shared {
    fn term(&self) -> Option<Term> {
        self.term.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_term(&self, term: Option<Term>) {
        *self.term.lock().unwrap_or_else(|e| e.into_inner()) = term;
    }
}

impl Lease {
    /// Contend for `name` in the background: lead while the lease is held
    /// (renewed every `ttl/3` as any lease), contend again when it is lost,
    /// until the returned [`Election`] is resigned or dropped.
    ///
    /// Waiting holders learn of a release as [`acquire`](Lease::acquire)
    /// does: about one round trip after it where the server can push it,
    /// otherwise within a poll of `ttl/10`.
    ///
    /// An invalid name or ttl (or no Tokio runtime) stops the election at
    /// once: it never leads, and [`resign`](Election::resign) returns the
    /// error.
    pub fn elect(&self, name: &str, ttl: Duration) -> Election {
        let (tx, state) = watch::channel(Leadership::Contending);
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        let name: Arc<str> = name.into();
        let (task, failed) = match tokio::runtime::Handle::try_current() {
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
            Err(_) => (None, Some(Error::NoRuntime)),
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
    /// [`Term`]. Never resolves for an election that stopped (see
    /// [`Lease::elect`]).
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

    /// Stop contending and, if leading, release the lease now, so that a
    /// waiting election takes over without waiting for the ttl.
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
    async fn run(self) -> Result<(), Error> {
        loop {
            if self.stop.is_cancelled() {
                return Ok(());
            }
            let freed = self.lease.waiter(&self.name, self.ttl);
            match self.lease.try_acquire(&self.name, self.ttl).await {
                Ok(Some(guard)) => {
                    if let Some(resigned) = self.lead(guard).await {
                        return resigned;
                    }
                    continue; // lost: contend again at once
                }
                Ok(None) => self.follow().await,
                Err(Error::ShutDown) => {
                    tracing::debug!(lease.name = %self.name, "election stopped: the lease client was shut down");
                    return Err(Error::ShutDown);
                }
                Err(e) if e.is_invalid_input() => {
                    tracing::error!(lease.name = %self.name, error = %e.chain(), "election stopped");
                    return Err(e);
                }
                Err(e) => {
                    self.tx
                        .send_if_modified(|s| replace(s, Leadership::Contending));
                    tracing::warn!(lease.name = %self.name, error = %e.chain(), "election: could not ask the backend; trying again");
                }
            }
            tokio::select! {
                () = freed => {}
                () = self.stop.cancelled() => return Ok(()),
            }
        }
    }

    /// Lead for one term: until the lease is lost (`None`: contend again)
    /// or the election is stopped (`Some`: the release's outcome).
    async fn lead(&self, guard: LeaseGuard) -> Option<Result<(), Error>> {
        let term = Term {
            entry: guard.entry().clone(),
        };
        let token = term.token();
        self.shared.set_term(Some(term));
        self.tx.send_replace(Leadership::Leading {
            fencing_token: guard.fencing_token(),
        });
        tracing::info!(lease.name = %self.name, fencing_token = guard.fencing_token(), "leading");
        let stopped = tokio::select! {
            () = token.cancelled() => false,
            () = self.stop.cancelled() => true,
        };
        self.shared.set_term(None);
        self.tx.send_replace(Leadership::Contending);
        if stopped {
            return Some(guard.release().await);
        }
        tracing::warn!(lease.name = %self.name, "leadership lost; contending again");
        drop(guard); // releases in the background
        None
    }

    /// Another holder has the lease: say who, if the backend can tell.
    async fn follow(&self) {
        let leader = match self.lease.inspect(&self.name).await {
            // An empty holder: the backend cannot name it.
            Ok(Some(info)) if info.is_held() && !info.holder.is_empty() => Some(info.holder),
            _ => None,
        };
        self.tx
            .send_if_modified(|s| replace(s, Leadership::Following { leader }));
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
