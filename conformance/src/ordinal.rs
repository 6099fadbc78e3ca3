//! [`Ordinal`]: fencing tokens that only grow, counted per name.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold::{Acquired, Acquisition, Backend, Error, Grant, LeaseInfo, Request};

/// A backend whose fencing tokens are those of `B` ranked per name: the
/// `n`th distinct token `B` handed out for a name is `n`.
///
/// The properties count fencing tokens per name (1 for the first
/// acquisition, one more for each later one: [`Caps::fencing`](crate::Caps::fencing)).
/// A backend whose tokens only grow, without counting per name (etcd's are
/// the key's `create_revision`, which grows with every write to the
/// cluster), runs the suite through an `Ordinal` of itself: the subject's
/// [`backend`](crate::Subject::backend) is `Ordinal<B>`, and what the
/// properties check of the ranks holds of the tokens. On the way, it checks
/// that `B`'s tokens strictly grow with each acquisition of a name.
///
/// Clones share the ranks. A renew or release with a rank it never handed
/// out reaches `B` with the token 0, which no acquisition has.
///
/// # Panics
///
/// Any call that sees `B` hand out a token below the largest it handed out
/// for that name.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold::Backend;
/// use leasehold::backend::Memory;
/// use leasehold_conformance::Ordinal;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let b = Ordinal::new(Memory::new());
/// let ttl = Duration::from_secs(30);
/// let grant = b.acquire("report", "pod-a", ttl).await.unwrap().unwrap();
/// assert_eq!(grant.fencing_token, Some(1));
/// // A token handed out outside the backend (a steal), ranked next.
/// assert_eq!(b.rank("report", 1_000), 2);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Ordinal<B> {
    inner: B,
    /// Per name, the tokens of `B` in the order they were seen (ascending).
    seen: Arc<Mutex<HashMap<String, Vec<u64>>>>,
}

impl<B> Ordinal<B> {
    /// `inner`, its tokens ranked per name.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            seen: Arc::default(),
        }
    }

    /// The backend inside.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The rank of `raw`, a token of `B`, among the tokens of `name`,
    /// recording it if new: for a [`Subject::steal`](crate::Subject::steal)
    /// that writes a token itself, so that the thief's token is ranked in
    /// its place.
    ///
    /// # Panics
    ///
    /// If `raw` is new and below the largest token recorded for `name`.
    pub fn rank(&self, name: &str, raw: u64) -> u64 {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let tokens = seen.entry(name.to_owned()).or_default();
        if let Some(i) = tokens.iter().position(|&t| t == raw) {
            return i as u64 + 1;
        }
        if let Some(&last) = tokens.last() {
            assert!(
                raw > last,
                "{name:?}: fencing token {raw} after {last}: tokens must strictly grow"
            );
        }
        tokens.push(raw);
        tokens.len() as u64
    }

    /// The token of `B` whose rank is `rank` (none for an unknown rank: such
    /// a token was never handed out, and matches nothing).
    fn raw(&self, lease: Acquisition<'_>) -> Option<u64> {
        let rank = usize::try_from(lease.fencing_token?).ok()?;
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let tokens = seen.get(lease.name)?;
        rank.checked_sub(1).and_then(|i| tokens.get(i)).copied()
    }

    /// `info` with its fencing token ranked.
    fn ranked(&self, mut info: LeaseInfo) -> LeaseInfo {
        info.fencing_token = info.fencing_token.map(|raw| self.rank(&info.name, raw));
        info
    }

    fn unranked<'a>(&self, lease: Acquisition<'a>) -> Acquisition<'a> {
        // An unknown rank becomes a token no acquisition has (0).
        let raw = self.raw(lease).or(lease.fencing_token.map(|_| 0));
        Acquisition::new(lease.name, lease.holder, raw)
    }
}

impl<B: Backend + Clone> Backend for Ordinal<B> {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        let grant = self.inner.acquire(name, holder, ttl).await?;
        Ok(grant.map(|g| Grant::new(g.fencing_token.map(|raw| self.rank(name, raw)))))
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        self.inner.renew(self.unranked(lease), ttl).await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.inner.release(self.unranked(lease)).await
    }

    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        let leases: Vec<_> = leases
            .iter()
            .map(|&(lease, ttl)| (self.unranked(lease), ttl))
            .collect();
        self.inner.renew_many(&leases).await
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        let info = self.inner.inspect(name).await?;
        Ok(info.map(|i| self.ranked(i)))
    }

    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        let listed = self.inner.list().await?;
        Ok(listed.into_iter().map(|i| self.ranked(i)).collect())
    }

    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.inner.released(name, poll)
    }

    fn lost(&self, lease: Acquisition<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
        self.inner.lost(self.unranked(lease))
    }

    async fn acquire_with(&self, request: Request<'_>) -> Result<Acquired, Error> {
        Ok(match self.inner.acquire_with(request).await? {
            Acquired::Granted(mut grant) => {
                grant.fencing_token = grant.fencing_token.map(|raw| self.rank(request.name, raw));
                Acquired::Granted(grant)
            }
            other => other,
        })
    }

    async fn release_ran(&self, lease: Acquisition<'_>, slot: u64) -> Result<(), Error> {
        self.inner.release_ran(self.unranked(lease), slot).await
    }

    async fn publish(&self, lease: Acquisition<'_>, value: Option<&str>) -> Result<bool, Error> {
        self.inner.publish(self.unranked(lease), value).await
    }

    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        self.inner.force_release(name).await
    }

    async fn force_release_now(&self, name: &str) -> Result<bool, Error> {
        self.inner.force_release_now(name).await
    }
}
