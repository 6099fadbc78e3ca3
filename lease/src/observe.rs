//! [`Lease::observe`]: who holds a lease, and what its holder published,
//! for processes that never contend (dashboards, followers that only need
//! to find the leader).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};

use crate::engine::timing::CALL_TIMEOUT_CAP;
use crate::{Lease, LeaseInfo, validate};

/// A lease as an observer sees it ([`Lease::observe`]).
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Who holds it; `None` while it is free (or the backend cannot name
    /// the holder, or has not been asked yet).
    pub holder: Option<String>,
    /// What the holder published (an election's
    /// [`proclaim`](crate::Election::proclaim)), while it holds the lease.
    pub value: Option<String>,
    /// The holder's fencing token, while it holds the lease.
    pub fencing_token: Option<u64>,
}

impl Observed {
    fn of(info: Option<LeaseInfo>) -> Self {
        match info {
            Some(info) if info.is_held() && !info.forced => Observed {
                holder: Some(info.holder).filter(|h| !h.is_empty()),
                value: info.value,
                fencing_token: info.fencing_token,
            },
            _ => Observed::default(),
        }
    }
}

/// How often an observer asks when nothing wakes it sooner: the backend's
/// push (a release, a published value) or the holder's expiry.
const OBSERVE_POLL: Duration = Duration::from_secs(1);

impl Lease {
    /// Watch the lease `name` without ever contending for it: the receiver
    /// reports its current holder, the value the holder published and its
    /// fencing token, and each change.
    ///
    /// A background task asks the backend ([`Backend::inspect`]) at once,
    /// then again whenever the backend pushes a change of the name (a
    /// release or a published value, about one round trip after it; the
    /// [`backend`](crate::backend) docs say which push), at the holder's
    /// expiry, and at least every second. It ends when every
    /// receiver has been dropped. A failed request is logged at debug and
    /// asked again at the next wake-up; the last answer stands meanwhile.
    ///
    /// An invalid name, a backend that cannot [`inspect`](crate::Backend::inspect),
    /// or no Tokio runtime: the error is logged, and the receiver reports
    /// nothing and is closed at once ([`changed`](watch::Receiver::changed)
    /// fails).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::{backend::Memory, Lease};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), leasehold::Error> {
    /// let db = Memory::new();
    /// let dashboard = Lease::with_holder(db.clone(), "dashboard");
    /// let mut seen = dashboard.observe("scheduler");
    ///
    /// let leader = Lease::with_holder(db, "pod-a").elect("scheduler", Duration::from_secs(10));
    /// leader.proclaim("10.0.0.7:8080")?;
    /// let now = seen
    ///     .wait_for(|o| o.holder.as_deref() == Some("pod-a"))
    ///     .await
    ///     .expect("observed");
    /// assert_eq!(now.value.as_deref(), Some("10.0.0.7:8080"));
    /// # Ok(()) }
    /// ```
    ///
    /// [`Backend::inspect`]: crate::Backend::inspect
    pub fn observe(&self, name: &str) -> watch::Receiver<Observed> {
        let (tx, rx) = watch::channel(Observed::default());
        if let Err(e) = validate::name(name) {
            tracing::error!(lease.name = name, error = %e.chain(), "cannot observe");
            return rx;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!(lease.name = name, "cannot observe: no tokio runtime");
            return rx;
        };
        let (lease, name) = (self.clone(), name.to_owned());
        runtime.spawn(async move {
            loop {
                // Registered before the request: a change right after the
                // answer still wakes us.
                let pushed = lease.released(&name, OBSERVE_POLL);
                let asked = Instant::now();
                let answer = timeout(CALL_TIMEOUT_CAP, lease.inspect(&name)).await;
                let mut next = asked + OBSERVE_POLL;
                match answer {
                    Ok(Ok(info)) => {
                        // (`Duration::MAX`, say, is "no expiry": `PgAdvisory`.)
                        let expires_in = info.as_ref().and_then(|i| i.expires_in);
                        if let Some(left) = expires_in.filter(|l| *l <= crate::MAX_TTL) {
                            next = next.min(asked + left + Duration::from_millis(2));
                        }
                        let seen = Observed::of(info);
                        tx.send_if_modified(|o| {
                            let changed = *o != seen;
                            *o = seen;
                            changed
                        });
                    }
                    Ok(Err(crate::Error::Unsupported { .. })) => {
                        tracing::error!(lease.name = %name, "cannot observe: the backend cannot inspect a lease");
                        return;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(lease.name = %name, error = %e.chain(), "observe: could not ask the backend");
                    }
                    Err(_) => {
                        tracing::debug!(lease.name = %name, "observe: the backend did not answer in time");
                    }
                }
                tokio::select! {
                    () = pushed => {}
                    () = sleep_until(next) => {}
                    () = tx.closed() => return,
                }
            }
        });
        rx
    }
}
