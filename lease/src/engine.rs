//! The renewal engine behind one [`Lease`](crate::Lease) and its clones: the
//! registry of the names it holds, their acquisition and release, and (in
//! [`scheduler`]) the one task that renews them all. Timing rules live in
//! [`timing`]; `docs/ARCHITECTURE.md` draws the whole picture.
//!
//! # Ground rules
//!
//! **A name's life cycle in one engine** (the slot of `name` in [`Names`]):
//!
//! | state | slot | who moves it on |
//! |---|---|---|
//! | free | none | [`Engine::reserve`] → reserved |
//! | reserved | `Busy`, owned by a [`Reservation`] | the grant → held ([`Engine::hold`]); no grant, an error, or a dropped acquire → free |
//! | held | `Held(entry)`, renewed by the scheduler | release or drop of the guard, the end of `min_hold` → releasing ([`Engine::stop`]) |
//! | releasing | `Busy`, entry stopped, token cancelled | the backend's answer → free ([`Engine::settle`]) |
//! | quarantined | `Busy` | a ttl after a release of unknown fate → free |
//!
//! A lease *lost* while held (the backend said so, or its deadline passed)
//! stays held — its token cancelled, no longer renewed — until its guard
//! releases it. A reserved or releasing name is freed exactly once: by the
//! [`Claim`] that owns it, whichever path ends first.
//!
//! **Quarantine.** A release whose outcome is unknown (an error, a timeout,
//! a request dropped on the way) may still reach the backend later. The name
//! stays taken until a ttl after that release was sent, when the old lease
//! has ended on the server in any case; so this engine never acquires a name
//! a late release of its own could end. (Backends with fencing tokens also
//! ignore such a release, since it carries the old acquisition's token.)
//!
//! **Lock order.** [`Engine::names`] before [`Entry::timing`]; nothing is
//! awaited, spawned or logged about another lease while either is held
//! (spawning on a runtime that shuts down drops the task inside `spawn`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use crate::backend::DynBackend;
use crate::drop_guard::DropGuard;
use crate::{Acquisition, Error, Grant};

mod scheduler;
mod timing;

pub(crate) use crate::backend::MAX_BATCH;
use scheduler::{Scheduler, Watch};
use timing::{Deadline, Stamp, acquire_timeout, release_timeout, renew_period};

/// How long a waiter waits between attempts, jittered (see [`timing::wait_poll`]).
pub(crate) fn wait_poll(ttl: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    // `RandomState` is seeded anew per instance: enough jitter for waiters.
    let spread = RandomState::new().hash_one(ttl) as f64 / u64::MAX as f64;
    timing::wait_poll(ttl, spread)
}

/// A lease held through one [`Lease`](crate::Lease): shared by its guard and
/// the scheduler.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) name: Arc<str>,
    pub(crate) ttl: Duration,
    /// The grant's fencing token, which renewals and the release carry.
    pub(crate) fencing_token: Option<u64>,
    /// Cancelled when the lease is lost or released.
    pub(crate) cancel: CancellationToken,
    pub(crate) acquired_at: Instant,
    /// `max_hold`: the token is cancelled and the lease released at this
    /// instant, renewed or not.
    max_hold_until: Option<Instant>,
    timing: Mutex<Timing>,
}

/// Why a lease was lost (the `reason` label of `lease_lost_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// The backend says it is no longer ours.
    Taken,
    /// No renewal succeeded before its local deadline (or nothing can renew
    /// it any more).
    Deadline,
    /// Its `max_hold` ran out.
    MaxHold,
}

impl Loss {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Loss::Taken => "taken",
            Loss::Deadline => "deadline",
            Loss::MaxHold => "max_hold",
        }
    }
}

/// Where a held lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Renewed by the scheduler.
    Live,
    /// Lost (definite loss or deadline passed); the token is cancelled.
    Lost,
    /// Stopped by its guard: released or being released.
    Stopped,
}

/// The mutable part of an [`Entry`].
#[derive(Debug)]
struct Timing {
    state: State,
    /// The token is cancelled when this passes.
    deadline: Deadline,
    next_renew: Instant,
    /// Failed renewals in a row.
    failures: u32,
    /// A renewal of this lease is in flight.
    in_flight: bool,
    /// The backend hinted a loss while a renewal was in flight: renew again
    /// as soon as it answers ([`Engine::renew_now`]).
    recheck: bool,
    /// Release the lease at this instant unless released earlier (`min_hold`).
    release_at: Option<Instant>,
}

impl Entry {
    fn timing(&self) -> MutexGuard<'_, Timing> {
        lock(&self.timing)
    }

    /// The acquisition that renewals and the release of this lease concern.
    fn acquisition<'a>(&'a self, holder: &'a str) -> Acquisition<'a> {
        Acquisition::new(&self.name, holder, self.fencing_token)
    }

    /// Valid = not lost, not released, and before the local deadline, by the
    /// clocks now.
    pub(crate) fn is_valid(&self) -> bool {
        let t = self.timing();
        t.state == State::Live && !t.deadline.passed(Stamp::now()) && !self.cancel.is_cancelled()
    }

    /// Mark the lease lost and tell its holder.
    fn lose(&self, t: &mut Timing, holder: &str, reason: Loss, why: &str) {
        if t.state == State::Live {
            t.state = State::Lost;
            self.cancel.cancel();
            crate::metrics::lost(&self.name, reason);
            crate::metrics::held(-1.0);
            tracing::warn!(
                lease.name = %self.name,
                holder,
                fencing_token = self.fencing_token,
                reason = reason.label(),
                "lease lost: {why}"
            );
        }
    }

    /// How long it stays valid by the monotonic clock (zero once lost,
    /// released or past its deadline).
    pub(crate) fn valid_for(&self) -> Duration {
        let t = self.timing();
        if t.state != State::Live || self.cancel.is_cancelled() {
            return Duration::ZERO;
        }
        t.deadline.mono.saturating_duration_since(Instant::now())
    }
}

/// What this engine knows about a name; see the ground rules.
#[derive(Debug)]
enum Slot {
    /// Reserved, releasing or quarantined.
    Busy,
    /// Held: renewed by the scheduler.
    Held(Arc<Entry>),
}

/// Everything behind [`Engine::names`].
#[derive(Debug, Default)]
struct Names {
    slots: HashMap<Arc<str>, Slot>,
    /// A scheduler task is running for this engine.
    scheduler: bool,
    /// When the scheduler will wake up next by itself (set under this lock
    /// by each plan): a new lease due no earlier needs no wake-up call, so
    /// acquiring thousands of leases does not re-plan thousands of times.
    planned: Option<Instant>,
    /// Calls whose time limit the scheduler keeps, by id (see [`Engine::watch`]).
    watches: HashMap<u64, Watch>,
    next_watch: u64,
}

/// A name this engine has taken (reserved, or releasing): dropping the
/// claim frees it; [`disarm`](DropGuard::disarm) hands the freeing on.
type Claim = DropGuard<(Arc<Engine>, Arc<str>)>;

/// The claim of an acquisition in progress.
pub(crate) type Reservation = Claim;

/// A release under way in the caller's task ([`Engine::release`]), with the
/// name's claim and when the release was sent: if it is dropped unfinished,
/// the release is sent again in a task of its own, which takes the claim.
type Unfinished = DropGuard<(Claim, Arc<Entry>, Instant)>;

/// The state behind one [`Lease`](crate::Lease) and all its clones.
pub(crate) struct Engine {
    pub(crate) backend: Box<dyn DynBackend>,
    pub(crate) holder: Arc<str>,
    names: Mutex<Names>,
    /// Wakes the scheduler (a new lease due before its planned wake-up, a
    /// kept time limit, a `min_hold`).
    wake: Notify,
    /// Wakes waiters of this `Lease` ([`Engine::freed`]) when a release frees a name.
    freed: Notify,
    /// [`Engine::shut_down`] was called: nothing is acquired any more.
    closed: std::sync::atomic::AtomicBool,
    /// The runtime the scheduler was last started on: a release asked for
    /// outside any runtime (a guard dropped on a plain thread) is sent there.
    renewing: Mutex<Option<tokio::runtime::Handle>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while these locks are held; if something did, the data
    // is still consistent (every update is a single assignment).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    pub(crate) fn new(backend: Box<dyn DynBackend>, holder: Arc<str>) -> Self {
        Self {
            backend,
            holder,
            names: Mutex::new(Names::default()),
            wake: Notify::new(),
            freed: Notify::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            renewing: Mutex::new(None),
        }
    }

    fn names(&self) -> MutexGuard<'_, Names> {
        lock(&self.names)
    }

    /// The claim of a name being released, whose drop frees it and wakes
    /// this `Lease`'s waiters.
    fn claim(self: &Arc<Self>, name: Arc<str>) -> Claim {
        DropGuard::new((self.clone(), name), |(engine, name)| {
            engine.forget(&name);
            engine.freed.notify_waiters();
        })
    }

    /// The leases held now (live: renewed, not lost or released).
    pub(crate) fn held(&self) -> Vec<Arc<Entry>> {
        let names = self.names();
        names
            .slots
            .values()
            .filter_map(|slot| match slot {
                Slot::Held(entry) if entry.timing().state == State::Live => Some(entry.clone()),
                _ => None,
            })
            .collect()
    }

    /// Whether [`shut_down`](Engine::shut_down) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Acquire nothing any more; cancel every held lease's token, release
    /// them all and await the releases (each within its time limit); the
    /// scheduler exits once nothing is left for it.
    pub(crate) async fn shut_down(self: &Arc<Self>) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        let held: Vec<Arc<Entry>> = {
            let names = self.names();
            names
                .slots
                .values()
                .filter_map(|slot| match slot {
                    Slot::Held(entry) => Some(entry.clone()),
                    Slot::Busy => None,
                })
                .collect()
        };
        let releases = held.iter().map(|entry| self.release(entry));
        for result in futures_util::future::join_all(releases).await {
            if let Err(e) = result {
                tracing::warn!(holder = %self.holder, error = %e.chain(), "shutdown: a release failed; that lease ends at its ttl");
            }
        }
        self.wake.notify_one();
    }

    /// Claim `name` within this `Lease` for an acquisition; `None` if this
    /// `Lease` already holds it or is acquiring or releasing it.
    pub(crate) fn reserve(self: &Arc<Self>, name: &str) -> Option<Reservation> {
        let mut names = self.names();
        if names.slots.contains_key(name) {
            return None;
        }
        let name: Arc<str> = name.into();
        names.slots.insert(name.clone(), Slot::Busy);
        drop(names);
        // An acquisition that got nothing frees the name without waking
        // waiters: nothing was released (a waiter's own failed attempt must
        // not wake it).
        Some(DropGuard::new((self.clone(), name), |(engine, name)| {
            engine.forget(&name);
        }))
    }

    /// Acquire the reserved name through the backend, within its time limit.
    ///
    /// A grant whose reply is handled only after the lease's local deadline
    /// (`tokio::time::timeout` polls the call before its timer: a reply that
    /// sat in the socket while the runtime stalled or the machine slept) is
    /// never handed out: it is released, and the acquisition times out.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        reservation: Reservation,
        ttl: Duration,
        max_hold: Option<Duration>,
    ) -> Result<Option<Arc<Entry>>, Error> {
        let limit = acquire_timeout(ttl);
        let timed_out = Error::Timeout {
            operation: "acquire",
            after: limit,
        };
        let sent = Stamp::now();
        let call = self.backend.acquire(&reservation.1, &self.holder, ttl);
        let started = std::time::Instant::now();
        let answer = timeout(limit, call).await;
        crate::metrics::backend_seconds("acquire", started.elapsed());
        let grant = match answer {
            Ok(Ok(Some(grant))) => grant,
            Ok(Ok(None)) => return Ok(None),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(timed_out),
        };
        let entry = self.hold(reservation, ttl, grant, sent, max_hold);
        if let Some(lost) = self.backend.lost(entry.acquisition(&self.holder)) {
            self.heed(&entry, lost);
        }
        if entry.timing().deadline.passed(Stamp::now()) {
            tracing::warn!(
                lease.name = %entry.name,
                holder = %self.holder,
                fencing_token = entry.fencing_token,
                "lease granted too late to be used: its deadline had passed when the reply was handled; releasing it"
            );
            self.release_in_background(&entry);
            return Err(timed_out);
        }
        Ok(Some(entry))
    }

    /// Turn a reservation into a held lease and hand it to the scheduler.
    fn hold(
        self: &Arc<Self>,
        reservation: Reservation,
        ttl: Duration,
        grant: Grant,
        sent: Stamp,
        max_hold: Option<Duration>,
    ) -> Arc<Entry> {
        let (_, name) = reservation.disarm();
        let next_renew = sent.mono + renew_period(ttl);
        let entry = Arc::new(Entry {
            name: name.clone(),
            ttl,
            fencing_token: grant.fencing_token,
            cancel: CancellationToken::new(),
            acquired_at: sent.mono,
            max_hold_until: max_hold.map(|d| sent.mono + d.min(crate::MAX_TTL)),
            timing: Mutex::new(Timing {
                state: State::Live,
                deadline: Deadline::after(sent, ttl),
                next_renew,
                failures: 0,
                in_flight: false,
                recheck: false,
                release_at: None,
            }),
        });
        crate::metrics::held(1.0);
        let (start, wake) = {
            let mut names = self.names();
            names.slots.insert(name, Slot::Held(entry.clone()));
            let running = std::mem::replace(&mut names.scheduler, true);
            let on_time = names.planned.is_some_and(|at| at <= next_renew);
            (!running, running && !on_time)
        };
        if start {
            let runtime = tokio::runtime::Handle::current();
            *lock(&self.renewing) = Some(runtime.clone());
            runtime.spawn(Scheduler::new(self.clone()).run());
        } else if wake {
            self.wake.notify_one();
        }
        entry
    }

    /// Heed the backend's hint that `entry` may be lost ([`Backend::lost`]):
    /// a task that waits for it, or for the lease to end, and then has the
    /// scheduler renew the lease at once — the renewal decides.
    ///
    /// [`Backend::lost`]: crate::Backend::lost
    fn heed(
        self: &Arc<Self>,
        entry: &Arc<Entry>,
        lost: futures_util::future::BoxFuture<'static, ()>,
    ) {
        let engine = Arc::downgrade(self);
        let watched = entry.clone();
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = watched.cancel.cancelled() => {}
                () = lost => {
                    if let Some(engine) = engine.upgrade() {
                        engine.renew_now(&watched);
                    }
                }
            }
        });
    }

    /// Renew `entry` now (a hint of its loss): at once, or as soon as the
    /// renewal in flight answers.
    fn renew_now(&self, entry: &Entry) {
        let mut t = entry.timing();
        if t.state != State::Live {
            return;
        }
        if t.in_flight {
            t.recheck = true;
            return;
        }
        t.next_renew = Instant::now();
        drop(t);
        tracing::debug!(
            lease.name = %entry.name,
            holder = %self.holder,
            "the backend says the lease may be lost; renewing it now"
        );
        self.wake.notify_one();
    }

    /// Stop renewing `entry` and cancel its token; the name becomes `Busy`
    /// (releasing), owned by the returned claim. `None` if it was already
    /// stopped (someone else is releasing it).
    fn stop(self: &Arc<Self>, entry: &Arc<Entry>) -> Option<Claim> {
        let mut names = self.names();
        {
            let mut t = entry.timing();
            if t.state == State::Stopped {
                return None;
            }
            if t.state == State::Live {
                crate::metrics::held(-1.0);
            }
            t.state = State::Stopped;
        }
        entry.cancel.cancel();
        if let Some(slot) = names.slots.get_mut(&entry.name)
            && matches!(slot, Slot::Held(e) if Arc::ptr_eq(e, entry))
        {
            *slot = Slot::Busy;
        }
        // The scheduler skips a stopped lease by itself, and exits by itself
        // a while after the last one: no need to wake it.
        drop(names);
        Some(self.claim(entry.name.clone()))
    }

    /// Let this `Lease` acquire `name` again (only [`Claim`]s call this).
    fn forget(&self, name: &str) {
        let mut names = self.names();
        if matches!(names.slots.get(name), Some(Slot::Busy)) {
            names.slots.remove(name);
        }
    }

    /// Resolves when this `Lease` next frees a name (any name), or when the
    /// backend says `name` may have been released, or after `poll`: what a
    /// waiter waits for between two attempts. Registers at the call, so a
    /// release between this call and the await is not missed.
    pub(crate) fn freed(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + '_ {
        let mut local = Box::pin(self.freed.notified());
        local.as_mut().enable();
        let remote = self.backend.released(name, poll);
        async move {
            tokio::select! {
                () = local => {}
                () = remote => {}
            }
        }
    }

    /// Stop renewing `entry` and release it here, in the caller's task: no
    /// task is spawned and no other thread woken for the common case. If
    /// this future is dropped before the backend has answered, the release
    /// is sent again in a task of its own (releasing is idempotent), which
    /// frees the name when done. `Ok` if it was already stopped.
    pub(crate) async fn release(self: &Arc<Self>, entry: &Arc<Entry>) -> Result<(), Error> {
        let Some(claim) = self.stop(entry) else {
            return Ok(());
        };
        let sent_at = Instant::now();
        let unfinished: Unfinished =
            DropGuard::new((claim, entry.clone(), sent_at), |(claim, entry, at)| {
                claim.0.clone().spawn_release(claim, entry, Some(at));
            });
        let result = self.send_release(entry).await;
        let (claim, _, _) = unfinished.disarm();
        settle(claim, result.is_ok(), sent_at + entry.ttl);
        result
    }

    /// Stop renewing `entry` and release it in a task of its own (on the
    /// current runtime, or else the one that renews), which frees the name
    /// when done. Nothing if it was already stopped; with no runtime left,
    /// the name is freed at once and the lease ends at its ttl.
    pub(crate) fn release_in_background(self: &Arc<Self>, entry: &Arc<Entry>) {
        if let Some(claim) = self.stop(entry) {
            self.spawn_release(claim, entry.clone(), None);
        }
    }

    /// Keep `entry` (renewing it) until `at`, then release it in the
    /// background; the scheduler now owns the release. Returns false, and
    /// changes nothing, if `entry` is no longer live (lost or stopped): the
    /// scheduler may have exited already, so the caller must release it.
    pub(crate) fn release_at(&self, entry: &Arc<Entry>, at: Instant) -> bool {
        {
            // A live entry keeps the scheduler running (it only exits when it
            // finds none), and only the scheduler turns an entry from live to
            // lost, looking at `release_at` under this same lock.
            let mut t = entry.timing();
            if t.state != State::Live {
                return false;
            }
            t.release_at = Some(at);
        }
        self.wake.notify_one();
        true
    }

    /// The release request of a stopped entry, in a task of its own, which
    /// owns the name's `claim`. With `earlier`, a release was sent before, at
    /// that instant, with unknown fate: the name then stays taken until
    /// `earlier + ttl` whatever the new request's outcome.
    fn spawn_release(self: &Arc<Self>, claim: Claim, entry: Arc<Entry>, earlier: Option<Instant>) {
        let Some(handle) = self.runtime() else {
            tracing::debug!(lease.name = %entry.name, "no tokio runtime to release on; the lease ends at its ttl");
            return; // dropping the claim frees the name
        };
        let engine = self.clone();
        drop(handle.spawn(async move {
            // If the runtime shuts down before the answer, dropping the
            // claim frees the name.
            let sent_at = earlier.unwrap_or_else(Instant::now);
            let result = engine.send_release(&entry).await;
            let confirmed = result.is_ok() && earlier.is_none();
            settle(claim, confirmed, sent_at + entry.ttl);
        }));
    }

    /// The runtime to spawn on: the current one, or else the one that
    /// renews this engine's leases (a task spawned on a runtime that has
    /// shut down is dropped at once, which frees what it owned).
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| lock(&self.renewing).clone())
    }

    /// Ask the backend to release `entry`, within the release time limit
    /// (kept by the scheduler's timer while it runs); log the outcome.
    async fn send_release(self: &Arc<Self>, entry: &Entry) -> Result<(), Error> {
        let limit = release_timeout(entry.ttl);
        let timed_out = || {
            Err(Error::Timeout {
                operation: "release",
                after: limit,
            })
        };
        let call = self.backend.release(entry.acquisition(&self.holder));
        let started = std::time::Instant::now();
        let result = match self.watch(Instant::now() + limit) {
            Some(watch) => {
                tokio::select! {
                    biased;
                    r = call => r,
                    () = watch.expired() => timed_out(),
                }
            }
            None => timeout(limit, call).await.unwrap_or_else(|_| timed_out()),
        };
        crate::metrics::backend_seconds("release", started.elapsed());
        match &result {
            Ok(()) => {
                tracing::debug!(lease.name = %entry.name, holder = %self.holder, "lease released");
            }
            Err(e) => tracing::warn!(
                lease.name = %entry.name,
                holder = %self.holder,
                error = %e.chain(),
                "lease release failed; it ends at its ttl"
            ),
        }
        result
    }
}

/// Free the name of `claim` after its release: at once if the backend
/// confirmed it; otherwise not before `until` = when the release was sent +
/// ttl (the quarantine of the ground rules).
fn settle(claim: Claim, confirmed: bool, until: Instant) {
    if confirmed || Instant::now() >= until {
        return; // dropping the claim frees the name
    }
    if let Some(handle) = claim.0.runtime() {
        drop(handle.spawn(async move {
            sleep_until(until).await;
            drop(claim);
        }));
    }
    // No runtime to wait on: the claim is dropped, the name freed now.
}

#[cfg(test)]
mod tests;
