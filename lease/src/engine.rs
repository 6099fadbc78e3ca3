//! The renewal engine: one scheduler per [`Lease`](crate::Lease) that renews
//! every held lease, cancels tokens on loss, and releases.
//!
//! Timing rules (DESIGN §3), for a lease with time-to-live `ttl`:
//!
//! - `t_send` is read *before* each acquire/renew request. On success the
//!   local deadline becomes `t_send + ttl - margin`, `margin = ttl/100 + 2ms`
//!   (slack for the clock rates of this host and the server). It is never
//!   computed from the time the reply arrives.
//! - A renewal is due `ttl/3` after the last successful request was sent. Each
//!   attempt is given at most `min(ttl/3, deadline - now)`.
//! - The deadline is kept on the wall clock too, and a lease whose deadline
//!   has passed by either clock is lost: Linux's monotonic clock stops while
//!   the machine is suspended, the wall clock does not (and a jump of the
//!   wall clock backward is caught by the monotonic one).
//! - `Ok(false)` (definitely lost): the token is cancelled at once.
//! - `Err` or timeout: retried after a short backoff; the token is cancelled
//!   when `now >= deadline`, by the scheduler's own timer, whatever renewal
//!   calls are still in flight.
//! - Stopping (release or drop of the guard): renewals stop first, then the
//!   token is cancelled and the release is sent. It is given `min(ttl, 30 s)`;
//!   while the scheduler runs, its timer keeps that limit (a timer per call
//!   cost a `with_lease` cycle up to 15% on the fastest backends).
//!
//! Leases that fall due close together are renewed in one batch
//! ([`Backend::renew_many`](crate::Backend::renew_many)): when any lease is
//! due, every lease that has run at least half of its renewal period is
//! renewed with it. Renewing early never shortens a lease. A call is given
//! the time limit of its tightest lease, so a lease within `ttl/3` of its
//! deadline (its renewals are failing) is sent in a call of its own, and
//! leases are batched only with leases whose renewal period is within a
//! factor of two of theirs. A batch of more than 1,000 leases is split into
//! calls of 1,000, sent together.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::{Duration, SystemTime};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use crate::backend::DynBackend;
use crate::{Acquisition, Error, Grant};

/// Longest time any single acquire or release call is given, whatever the ttl.
pub(crate) const CALL_TIMEOUT_CAP: Duration = Duration::from_secs(30);

/// The most leases renewed in one [`Backend::renew_many`](crate::Backend::renew_many)
/// call: a larger batch is split into calls of this size, sent together, so
/// that no statement grows without bound and each call has its own timeout.
pub(crate) use crate::backend::MAX_BATCH;

/// How long the scheduler stays after its last lease has ended before it
/// exits, so that a job run in a loop does not start one per run.
const LINGER: Duration = Duration::from_secs(1);

/// Safety margin subtracted from the ttl for the local deadline: `ttl/100 + 2ms`.
pub(crate) fn margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long after a successful request the next renewal is sent.
pub(crate) fn renew_period(ttl: Duration) -> Duration {
    ttl / 3
}

/// Time given to an acquire call: it must answer before the lease it asks for
/// would already be past its local deadline.
pub(crate) fn acquire_timeout(ttl: Duration) -> Duration {
    (ttl - margin(ttl)).min(CALL_TIMEOUT_CAP)
}

/// Time given to a release call; after `ttl` the lease has ended anyway.
pub(crate) fn release_timeout(ttl: Duration) -> Duration {
    ttl.min(CALL_TIMEOUT_CAP)
}

/// Wait before retrying the `failures`-th failed renewal in a row:
/// `ttl/30` (between 1 ms and 500 ms), doubling per failure, at most `ttl/6`.
pub(crate) fn retry_delay(ttl: Duration, failures: u32) -> Duration {
    let base = (ttl / 30).clamp(Duration::from_millis(1), Duration::from_millis(500));
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    base.saturating_mul(factor)
        .min(ttl / 6)
        .max(Duration::from_millis(1))
}

/// A lease held through one [`Lease`](crate::Lease): shared by its guard and the scheduler.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) name: Arc<str>,
    pub(crate) ttl: Duration,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) token: CancellationToken,
    pub(crate) acquired_at: Instant,
    timing: Mutex<Timing>,
}

#[derive(Debug)]
struct Timing {
    state: State,
    /// Local deadline: the token is cancelled when `now >= deadline`.
    deadline: Instant,
    /// The same deadline on the wall clock, which keeps running while the
    /// machine is suspended (the monotonic clock does not, on Linux).
    wall_deadline: SystemTime,
    next_renew: Instant,
    /// Failed renewals in a row.
    failures: u32,
    in_flight: bool,
    /// Release the lease at this instant unless released earlier (`min_hold`).
    release_at: Option<Instant>,
}

impl Timing {
    /// The deadline has passed by either clock: the monotonic one, or the
    /// wall clock (after a suspend of the machine, or a jump of its clock
    /// forward; a jump backward is caught by the monotonic one).
    fn passed(&self, now: Instant, wall: SystemTime) -> bool {
        now >= self.deadline || wall >= self.wall_deadline
    }

    /// Extend the deadline after a successful request sent at `sent`.
    fn extend(&mut self, sent: Stamp, ttl: Duration) {
        self.deadline = self.deadline.max(sent.mono + ttl - margin(ttl));
        self.wall_deadline = self.wall_deadline.max(sent.wall + ttl - margin(ttl));
    }
}

/// When a request was sent, by both clocks.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    mono: Instant,
    wall: SystemTime,
}

impl Stamp {
    fn now() -> Self {
        Self {
            mono: Instant::now(),
            wall: wall_now(),
        }
    }
}

/// The wall clock. Tests shift it to simulate a suspended machine.
#[cfg(not(test))]
fn wall_now() -> SystemTime {
    SystemTime::now()
}

#[cfg(test)]
thread_local! {
    static WALL_SHIFT: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

#[cfg(test)]
fn wall_now() -> SystemTime {
    SystemTime::now() + WALL_SHIFT.get()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Renewed by the scheduler.
    Live,
    /// Lost (definite loss or deadline passed); the token is cancelled.
    Lost,
    /// Stopped by its guard: released or being released.
    Stopped,
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
        t.state == State::Live
            && !t.passed(Instant::now(), wall_now())
            && !self.token.is_cancelled()
    }

    /// Mark the lease lost and tell its holder.
    fn lose(&self, t: &mut Timing, holder: &str, why: &str) {
        if t.state == State::Live {
            t.state = State::Lost;
            self.token.cancel();
            tracing::warn!(
                lease.name = %self.name,
                holder,
                fencing_token = self.fencing_token,
                "lease lost: {why}"
            );
        }
    }
}

/// What this `Lease` knows about a name.
#[derive(Debug)]
enum Slot {
    /// An acquire or release is under way.
    Busy,
    /// Held: renewed by the scheduler.
    Held(Arc<Entry>),
}

#[derive(Debug, Default)]
struct Names {
    slots: HashMap<Arc<str>, Slot>,
    /// A scheduler task is running for this engine.
    scheduler: bool,
    /// When the scheduler will wake up next by itself (set under this lock
    /// by each plan): a new lease due no earlier needs no wake-up call, so
    /// acquiring thousands of leases does not re-plan thousands of times.
    planned: Option<Instant>,
    /// How many slots are `Held`.
    held: usize,
    /// Calls whose time limit the scheduler keeps, by id (see [`Engine::watch`]).
    watches: HashMap<u64, Watch>,
    next_watch: u64,
}

/// The time limit of a call awaited elsewhere, kept by the scheduler's timer.
#[derive(Debug)]
struct Watch {
    deadline: Instant,
    /// The deadline has passed, or the scheduler is gone.
    expired: bool,
    waker: Option<Waker>,
}

/// The state behind one [`Lease`](crate::Lease) and all its clones.
pub(crate) struct Engine {
    pub(crate) backend: Box<dyn DynBackend>,
    pub(crate) holder: Arc<str>,
    names: Mutex<Names>,
    wake: Notify,
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
        }
    }

    fn names(&self) -> MutexGuard<'_, Names> {
        lock(&self.names)
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
        Some(Reservation {
            engine: self.clone(),
            name: Some(name),
        })
    }

    /// Acquire `name` through the backend, within its timeout. `t_send` is
    /// taken before the request.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        reservation: Reservation,
        ttl: Duration,
    ) -> Result<Option<Arc<Entry>>, Error> {
        let limit = acquire_timeout(ttl);
        let sent = Stamp::now();
        let timed_out = Error::Timeout {
            operation: "acquire",
            after: limit,
        };
        let call = self.backend.acquire(reservation.name(), &self.holder, ttl);
        let grant = match timeout(limit, call).await {
            Ok(Ok(Some(grant))) => grant,
            Ok(Ok(None)) => return Ok(None),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(timed_out),
        };
        let entry = self.hold(reservation, ttl, grant, sent);
        let name = &*entry.name;
        // `timeout` polls the call before its timer: a reply that sat in the
        // socket while this task could not run (a stalled runtime, a
        // suspended machine) comes back even though the lease it grants is
        // already past its local deadline. Never hand that out as valid;
        // give it back instead.
        if entry.timing().passed(Instant::now(), wall_now()) {
            tracing::warn!(
                lease.name = name,
                holder = %self.holder,
                fencing_token = entry.fencing_token,
                "lease granted too late to be used: its deadline had passed when the reply was handled; releasing it"
            );
            self.release(&entry);
            return Err(timed_out);
        }
        Ok(Some(entry))
    }

    /// Turn a reservation into a held lease and hand it to the scheduler.
    fn hold(
        self: &Arc<Self>,
        mut reservation: Reservation,
        ttl: Duration,
        grant: Grant,
        sent: Stamp,
    ) -> Arc<Entry> {
        let t_send = sent.mono;
        let name = reservation
            .name
            .take()
            .expect("BUG: reservation used twice");
        let entry = Arc::new(Entry {
            name: name.clone(),
            ttl,
            fencing_token: grant.fencing_token,
            token: CancellationToken::new(),
            acquired_at: t_send,
            timing: Mutex::new(Timing {
                state: State::Live,
                deadline: t_send + ttl - margin(ttl),
                wall_deadline: sent.wall + ttl - margin(ttl),
                next_renew: t_send + renew_period(ttl),
                failures: 0,
                in_flight: false,
                release_at: None,
            }),
        });
        let next_renew = t_send + renew_period(ttl);
        let (start, wake) = {
            let mut names = self.names();
            names.slots.insert(name, Slot::Held(entry.clone()));
            names.held += 1;
            let running = std::mem::replace(&mut names.scheduler, true);
            let on_time = names.planned.is_some_and(|at| at <= next_renew);
            (!running, running && !on_time)
        };
        if start {
            // Never spawn while holding the lock: a runtime that is shutting
            // down drops the task (and runs its drop guard) inside `spawn`.
            tokio::spawn(Scheduler::new(self.clone()).run());
        } else if wake {
            self.wake.notify_one();
        }
        entry
    }

    /// Stop renewing `entry` and cancel its token; the name stays reserved
    /// (`Busy`) until [`Engine::forget`]. Returns false if it was already stopped.
    fn stop(&self, entry: &Arc<Entry>) -> bool {
        let mut names = self.names();
        {
            let mut t = entry.timing();
            if t.state == State::Stopped {
                return false;
            }
            t.state = State::Stopped;
        }
        entry.token.cancel();
        if let Some(slot) = names.slots.get_mut(&entry.name)
            && matches!(slot, Slot::Held(e) if Arc::ptr_eq(e, entry))
        {
            *slot = Slot::Busy;
            names.held -= 1;
        }
        // The scheduler skips a stopped lease by itself, and exits by itself
        // a while after the last one: no need to wake it.
        drop(names);
        true
    }

    /// Let this `Lease` acquire `name` again.
    fn forget(&self, name: &str) {
        let mut names = self.names();
        if matches!(names.slots.get(name), Some(Slot::Busy)) {
            names.slots.remove(name);
        }
    }

    /// Stop renewing `entry` and release it in a task of its own, which frees
    /// the name when done. Nothing if it was already stopped; without a
    /// runtime, the name is freed at once and the lease ends at its ttl.
    pub(crate) fn release(self: &Arc<Self>, entry: &Arc<Entry>) {
        if self.stop(entry) {
            self.spawn_release_after(entry, None);
        }
    }

    /// Stop renewing `entry` and release it here, in the caller's task: no
    /// task is spawned and no other thread woken for the common case. If
    /// this future is dropped before the backend has answered, the release
    /// is sent again in a task of its own (releasing is idempotent), which
    /// frees the name when done. `Ok` if it was already stopped.
    pub(crate) async fn release_now(self: &Arc<Self>, entry: &Arc<Entry>) -> Result<(), Error> {
        if !self.stop(entry) {
            return Ok(());
        }
        let sent_at = Instant::now();
        let mut unfinished = Unfinished {
            engine: self.clone(),
            entry: Some(entry.clone()),
            sent_at,
        };
        let result = self.send_release(entry).await;
        unfinished.entry = None;
        self.settle(&entry.name, result.is_ok(), sent_at + entry.ttl);
        result
    }

    /// Free `name` after its release: at once if the backend confirmed it;
    /// otherwise (an error, a timeout, a request dropped on the way) not
    /// before `until` = when the release was sent + ttl.
    ///
    /// A release whose fate is unknown may still reach the backend later. If
    /// this `Lease` took the name again meanwhile, that late release would
    /// end the new lease behind its back — and another holder could take it
    /// before the next renewal noticed. By `until` the old lease has ended
    /// on the server anyway (its last renewal was sent before the release),
    /// so waiting costs nothing that the expiry does not cost already.
    fn settle(self: &Arc<Self>, name: &Arc<str>, confirmed: bool, until: Instant) {
        if confirmed || Instant::now() >= until {
            self.forget(name);
            return;
        }
        let free = Forget::new(self.clone(), name.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn(async move {
                sleep_until(until).await;
                drop(free);
            })),
            // No runtime to wait on: free it now (dropping `free`).
            Err(_) => drop(free),
        }
    }

    /// The release request of a stopped entry, in a task of its own. With
    /// `earlier`, a release was sent before, at that instant, with unknown
    /// fate: the name then stays taken until `earlier + ttl` whatever the new
    /// request's outcome.
    fn spawn_release_after(self: &Arc<Self>, entry: &Arc<Entry>, earlier: Option<Instant>) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(lease.name = %entry.name, "no tokio runtime to release on; the lease ends at its ttl");
            self.forget(&entry.name);
            return;
        };
        let free = Forget::new(self.clone(), entry.name.clone());
        let entry = entry.clone();
        drop(handle.spawn(async move {
            let sent_at = earlier.unwrap_or_else(Instant::now);
            let result = free.engine.send_release(&entry).await;
            let confirmed = result.is_ok() && earlier.is_none();
            // `settle` takes over freeing the name; on a runtime shutdown
            // before this point, dropping `free` frees it.
            let (engine, name) = free.defuse();
            engine.settle(&name, confirmed, sent_at + entry.ttl);
        }));
    }

    /// Ask the backend to release `name`, within the release timeout; log the outcome.
    ///
    /// While the scheduler runs (it always does while a lease is held, and
    /// a while after), its timer keeps the time limit: a timer of the call's
    /// own costs a cycle of `with_lease` measurably on the fastest backends.
    async fn send_release(self: &Arc<Self>, entry: &Entry) -> Result<(), Error> {
        let name = &*entry.name;
        let limit = release_timeout(entry.ttl);
        let timed_out = || {
            Err(Error::Timeout {
                operation: "release",
                after: limit,
            })
        };
        let call = self.backend.release(entry.acquisition(&self.holder));
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
        match &result {
            Ok(()) => tracing::debug!(lease.name = %name, holder = %self.holder, "lease released"),
            Err(e) => tracing::warn!(
                lease.name = %name,
                holder = %self.holder,
                error = %e.chain(),
                "lease release failed; it ends at its ttl"
            ),
        }
        result
    }

    /// Have the scheduler keep the time limit `deadline` of a call: `None`
    /// if no scheduler runs (the caller then needs a timer of its own).
    fn watch(self: &Arc<Self>, deadline: Instant) -> Option<Watched> {
        let mut names = self.names();
        // Under this lock, a running scheduler has not decided to exit: its
        // next plan sees the watch, and it stays until the watch is gone.
        if !names.scheduler {
            return None;
        }
        let id = names.next_watch;
        names.next_watch += 1;
        names.watches.insert(
            id,
            Watch {
                deadline,
                expired: false,
                waker: None,
            },
        );
        let wake = names.planned.is_none_or(|at| at > deadline);
        drop(names);
        if wake {
            self.wake.notify_one();
        }
        Some(Watched {
            engine: self.clone(),
            id,
        })
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
}

/// A name claimed by an acquisition in progress; dropping it frees the name.
#[derive(Debug)]
pub(crate) struct Reservation {
    engine: Arc<Engine>,
    name: Option<Arc<str>>,
}

impl Reservation {
    fn name(&self) -> &str {
        self.name.as_deref().expect("BUG: reservation already used")
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            self.engine.forget(&name);
        }
    }
}

/// A release under way in the caller's task ([`Engine::release_now`]): if
/// it is dropped unfinished, the release is sent again in a task of its own.
struct Unfinished {
    engine: Arc<Engine>,
    entry: Option<Arc<Entry>>,
    sent_at: Instant,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            self.engine.spawn_release_after(&entry, Some(self.sent_at));
        }
    }
}

/// A call's time limit kept by the scheduler ([`Engine::watch`]); dropping
/// it withdraws the limit.
struct Watched {
    engine: Arc<Engine>,
    id: u64,
}

impl Watched {
    /// Resolves once the deadline has passed (or the scheduler is gone).
    fn expired(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            let mut names = self.engine.names();
            let Some(w) = names.watches.get_mut(&self.id) else {
                return Poll::Ready(());
            };
            if w.expired || Instant::now() >= w.deadline {
                return Poll::Ready(());
            }
            if !w.waker.as_ref().is_some_and(|k| k.will_wake(cx.waker())) {
                w.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.engine.names().watches.remove(&self.id);
    }
}

/// Frees a name when dropped: at the end of a release, or when the release
/// task is dropped by a runtime shutting down.
struct Forget {
    engine: Arc<Engine>,
    name: Arc<str>,
    armed: bool,
}

impl Forget {
    fn new(engine: Arc<Engine>, name: Arc<str>) -> Self {
        Self {
            engine,
            name,
            armed: true,
        }
    }

    /// Hand the freeing over to the caller.
    fn defuse(mut self) -> (Arc<Engine>, Arc<str>) {
        self.armed = false;
        (self.engine.clone(), self.name.clone())
    }
}

impl Drop for Forget {
    fn drop(&mut self) {
        if self.armed {
            self.engine.forget(&self.name);
        }
    }
}

/// A batch of renewals sent together, and its result.
struct Sent {
    entries: Vec<Arc<Entry>>,
    sent: Stamp,
    result: Result<Vec<bool>, Error>,
}

/// The renewal task of one engine. It runs while the engine holds at least
/// one live lease, and exits a while ([`LINGER`]) after none is left (a new
/// one starts it again) and no call's time limit is left for it to keep
/// ([`Engine::watch`]). A release does not wake it: it notices at its next
/// planned wake-up, which saves a cross-thread wake-up per release.
struct Scheduler {
    engine: Arc<Engine>,
    /// Set when the loop ends normally; otherwise the task was dropped
    /// (runtime shutdown) and `Drop` must tell every live holder.
    finished: bool,
}

impl Scheduler {
    fn new(engine: Arc<Engine>) -> Self {
        Self {
            engine,
            finished: false,
        }
    }

    async fn run(mut self) {
        let engine = self.engine.clone();
        let mut in_flight = FuturesUnordered::new();
        // Since when no lease has been live.
        let mut idle_since: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let wall = wall_now();
            let plan = self.plan(now, wall, idle_since.unwrap_or(now) + LINGER);
            for waker in plan.expired {
                waker.wake();
            }
            for entry in &plan.release {
                engine.release(entry);
            }
            if plan.exit {
                self.finished = true;
                return;
            }
            idle_since = if plan.live {
                None
            } else {
                idle_since.or(Some(now))
            };
            for batch in batches(plan.due, now) {
                in_flight.push(send(engine.clone(), batch, Stamp { mono: now, wall }));
            }
            tokio::select! {
                biased;
                Some(sent) = in_flight.next(), if !in_flight.is_empty() => self.apply(sent),
                () = sleep_until(plan.wake_at) => {}
                () = engine.wake.notified() => {}
            }
        }
    }

    /// Look at every held lease: cancel the ones past their deadline, pick
    /// the ones due for renewal or release, and find the next instant to wake
    /// up. `plan.live` is false (and the scheduler flag cleared) when no
    /// lease is left to renew.
    fn plan(&self, now: Instant, wall: SystemTime, linger_until: Instant) -> Plan {
        let engine = &self.engine;
        let mut plan = Plan {
            exit: false,
            live: false,
            due: Vec::new(),
            release: Vec::new(),
            expired: Vec::new(),
            wake_at: now + Duration::from_secs(3600),
        };
        let mut live = Vec::new();
        let mut names = engine.names();
        for slot in names.slots.values() {
            let Slot::Held(entry) = slot else { continue };
            let mut t = entry.timing();
            if t.state == State::Live && t.passed(now, wall) {
                entry.lose(
                    &mut t,
                    &engine.holder,
                    "its deadline passed without a successful renewal",
                );
            }
            match (t.state, t.release_at) {
                // Handed to the scheduler for a delayed release (`min_hold`):
                // release when due, or at once once lost.
                (State::Lost, Some(_)) => plan.release.push(entry.clone()),
                (State::Live, Some(at)) if at <= now => plan.release.push(entry.clone()),
                (State::Live, _) => live.push(entry.clone()),
                _ => {}
            }
        }
        // The time limits of calls in flight elsewhere.
        let mut watch_at: Option<Instant> = None;
        for w in names.watches.values_mut() {
            if w.expired {
                continue;
            }
            if now >= w.deadline {
                w.expired = true;
                plan.expired.extend(w.waker.take());
            } else {
                watch_at = Some(watch_at.map_or(w.deadline, |at| at.min(w.deadline)));
            }
        }
        if live.is_empty() {
            if linger_until > now || watch_at.is_some() {
                // Linger a while: a job run in a loop acquires again soon,
                // and finding the scheduler still running saves starting one.
                // Stay, too, while a call's time limit is ours to keep.
                if linger_until > now {
                    plan.wake_at = linger_until;
                }
                if let Some(at) = watch_at {
                    plan.wake_at = plan.wake_at.min(at);
                }
                names.planned = Some(plan.wake_at);
            } else {
                names.scheduler = false;
                names.planned = None;
                plan.exit = true;
            }
            return plan;
        }
        plan.live = true;

        let any_due = live.iter().any(|e| {
            let t = e.timing();
            !t.in_flight && t.next_renew <= now
        });
        for entry in live {
            let mut t = entry.timing();
            if let Some(at) = t.release_at {
                plan.wake_at = plan.wake_at.min(at);
            }
            plan.wake_at = plan.wake_at.min(t.deadline);
            if t.in_flight {
                continue;
            }
            // Coalesce: with a batch going out anyway, take every lease that
            // has run half of its renewal period.
            let early = renew_period(entry.ttl) / 2;
            if t.next_renew <= now || (any_due && t.failures == 0 && t.next_renew <= now + early) {
                t.in_flight = true;
                drop(t);
                plan.due.push(entry);
            } else {
                plan.wake_at = plan.wake_at.min(t.next_renew);
            }
        }
        if let Some(at) = watch_at {
            plan.wake_at = plan.wake_at.min(at);
        }
        // Still under the lock: a lease held from now on sees this.
        names.planned = Some(plan.wake_at);
        plan
    }

    /// Record the outcome of a batch of renewals.
    fn apply(&self, mut sent: Sent) {
        let (now, wall) = (Instant::now(), wall_now());
        let holder = &*self.engine.holder;
        if let Ok(v) = &sent.result
            && v.len() != sent.entries.len()
        {
            let msg = format!(
                "renew_many answered {} results for {} leases",
                v.len(),
                sent.entries.len()
            );
            sent.result = Err(Error::Protocol(msg));
        }
        for (i, entry) in sent.entries.iter().enumerate() {
            let mut t = entry.timing();
            t.in_flight = false;
            if t.state != State::Live {
                continue;
            }
            if t.passed(now, wall) {
                entry.lose(
                    &mut t,
                    holder,
                    "its deadline passed before a renewal succeeded",
                );
                continue;
            }
            match sent.result.as_ref().map(|v| v[i]) {
                Ok(true) => {
                    t.extend(sent.sent, entry.ttl);
                    t.next_renew = sent.sent.mono + renew_period(entry.ttl);
                    t.failures = 0;
                    tracing::trace!(lease.name = %entry.name, holder, "lease renewed");
                }
                Ok(false) => {
                    entry.lose(
                        &mut t,
                        holder,
                        "the backend says it is no longer ours (expired, released or taken over)",
                    );
                }
                Err(e) => {
                    t.failures += 1;
                    let delay = retry_delay(entry.ttl, t.failures);
                    t.next_renew = now + delay;
                    tracing::warn!(
                        lease.name = %entry.name,
                        holder,
                        fencing_token = entry.fencing_token,
                        error = %e.chain(),
                        failures = t.failures,
                        retry_in = ?delay,
                        "lease renewal failed; retrying until the deadline"
                    );
                }
            }
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // The task was dropped (its runtime is shutting down): nothing will
        // renew these leases any more, so their holders must stop now.
        let mut names = self.engine.names();
        names.scheduler = false;
        names.planned = None;
        // Calls whose time limit it kept end now, as timed out.
        let wakers: Vec<Waker> = names
            .watches
            .values_mut()
            .filter_map(|w| {
                w.expired = true;
                w.waker.take()
            })
            .collect();
        names.slots.retain(|_, slot| {
            let Slot::Held(entry) = slot else { return true };
            let mut t = entry.timing();
            entry.lose(
                &mut t,
                &self.engine.holder,
                "the runtime running its renewals shut down",
            );
            // A lease waiting out its `min_hold` has no guard left to release
            // it, and no runtime to release it on: stop it and free the name
            // (the lease ends at its ttl).
            if t.release_at.is_some() {
                t.state = State::Stopped;
                return false;
            }
            true
        });
        names.held = names
            .slots
            .values()
            .filter(|slot| matches!(slot, Slot::Held(_)))
            .count();
        drop(names);
        for waker in wakers {
            waker.wake();
        }
    }
}

struct Plan {
    /// Nothing live, and lingered long enough: the scheduler exits.
    exit: bool,
    live: bool,
    due: Vec<Arc<Entry>>,
    release: Vec<Arc<Entry>>,
    /// Wakers of calls whose time limit has passed.
    expired: Vec<Waker>,
    wake_at: Instant,
}

/// Split the leases due for renewal into calls, sent together.
///
/// A call is given the time limit of its tightest lease, so leases are
/// grouped by their own limit, `min(ttl/3, deadline - now)`: a lease within
/// `ttl/3` of its deadline (its renewals have been failing) goes in a call
/// of its own, and the others go together with leases whose renewal period
/// is within a factor of two of theirs — a healthy lease never inherits the
/// short limit of one about to be lost. At most [`MAX_BATCH`] leases per call.
fn batches(due: Vec<Arc<Entry>>, now: Instant) -> Vec<Vec<Arc<Entry>>> {
    let mut groups: HashMap<u32, Vec<Arc<Entry>>> = HashMap::new();
    let mut alone = Vec::new();
    for entry in due {
        let period = renew_period(entry.ttl);
        if entry.timing().deadline.saturating_duration_since(now) < period {
            alone.push(vec![entry]);
        } else {
            // The renewal period's power of two, in milliseconds.
            let ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
            groups.entry(ms.max(1).ilog2()).or_default().push(entry);
        }
    }
    let mut calls = alone;
    for (_, mut group) in groups {
        while !group.is_empty() {
            let rest = group.split_off(group.len().min(MAX_BATCH));
            calls.push(group);
            group = rest;
        }
    }
    calls
}

/// Send one batch of renewals, within `min(ttl/3, deadline - now)` of its tightest lease.
async fn send(engine: Arc<Engine>, entries: Vec<Arc<Entry>>, sent: Stamp) -> Sent {
    let t_send = sent.mono;
    let limit = entries
        .iter()
        .map(|e| renew_period(e.ttl).min(e.timing().deadline.saturating_duration_since(t_send)))
        .min()
        .unwrap_or_default();
    let holder = &*engine.holder;
    let call = async {
        if let [entry] = entries.as_slice() {
            engine
                .backend
                .renew(entry.acquisition(holder), entry.ttl)
                .await
                .map(|ok| vec![ok])
        } else {
            let leases: Vec<(Acquisition<'_>, Duration)> = entries
                .iter()
                .map(|e| (e.acquisition(holder), e.ttl))
                .collect();
            engine.backend.renew_many(&leases).await
        }
    };
    let result = match timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            operation: "renew",
            after: limit,
        }),
    };
    Sent {
        entries,
        sent,
        result,
    }
}

#[cfg(test)]
mod tests;
