//! [`Etcd`]: one etcd lease per acquisition, transactions for acquire and
//! release, keep-alives and a linearizable read of the key per renewal.
//!
//! # Ground rules
//!
//! - The record of a lease name is one key, `{prefix}{name}`, whose value is
//!   the holder and which is attached to an etcd lease (with a TTL counted by
//!   the etcd leader). Every acquisition grants a fresh etcd lease; the key
//!   is created only by a transaction that finds it absent, so the key's
//!   `create_revision` (the cluster-wide revision of that put) identifies the
//!   acquisition and is its fencing token.
//! - Renew and release concern one acquisition: renew keeps alive the etcd
//!   lease of that acquisition (the key lives exactly as long as it), on the
//!   member that leads, and trusts the keep-alive only if a linearizable
//!   read of the key, answered by the same member in the term it leads,
//!   finds the acquisition's key on that etcd lease; release
//!   deletes the key only if its `create_revision` and holder are the
//!   acquisition's, then revokes the etcd lease.
//! - Each backend value remembers the etcd lease of each acquisition it made
//!   (by name, holder and fencing token) and its keep-alive stream, shared
//!   by its clones. Another value (another
//!   process) finds the etcd lease by reading the key at each renewal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue,
    LeaseKeepAliveStream, LeaseKeeper, LeaseTimeToLiveOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};
use futures_util::{StreamExt, TryStreamExt};

use crate::{Acquisition, Backend, Error, Grant, LeaseInfo, Result, validate};

/// Leases as etcd keys attached to etcd leases, with the key's
/// `create_revision` as the fencing token.
///
/// # Calls
///
/// - **acquire**: `LeaseGrant` of a new etcd lease with the ttl rounded up to
///   whole seconds (etcd's unit; the cluster may raise it further to its
///   minimum, about 1.5 election timeouts), then one transaction: if the key
///   does not exist, put `holder` in it attached to that lease; otherwise
///   read it. Together with that transaction, a keep-alive opens the etcd
///   lease's keep-alive stream, which the acquisition's renewals use
///   (dropped if the key is not taken). If the key already holds `holder`
///   (an idempotent re-acquire), a second transaction moves the key to the
///   new etcd lease (so that it lives for the ttl asked for now) keeping its
///   `create_revision`, the fencing token, and the old etcd lease is revoked
///   in the background. An etcd lease granted but not used is revoked in
///   the background. Three requests, two round trips of latency (a
///   re-acquire: three round trips).
/// - **renew**: a `LeaseKeepAlive` of the acquisition's etcd lease on its
///   stream, which restarts its TTL (the ttl it was granted: etcd cannot
///   change a lease's TTL, so a renewal with another ttl keeps the first),
///   checked by a linearizable `Range` of the key sent together with it,
///   both to the member that leads
///   (see [Renewal](#renewal-and-a-deposed-leader)): two requests, one round
///   trip of latency. Finding the leader (a `Status` per endpoint, sent
///   together: one more round trip) is done once, and again after a
///   renewal that could not be judged, as after a leader change; the first
///   acquisition asks it together with its grant. A renewal that finds no open stream (the acquisition
///   was made through another value, or the stream failed) opens one first:
///   etcd-client 0.21 sends a keep-alive to open it and keeps only that
///   answer's TTL, not its header, so that renewal costs one more request
///   and round trip. A renewal that fails, or is cancelled, drops its
///   stream (an answer it did not read must not be taken for the next
///   one's). A lease that etcd reports gone (TTL 0: expired or revoked) or
///   whose key the read does not find with this acquisition's
///   `create_revision`, holder and etcd lease is lost.
/// - **release**: one transaction deleting the key iff its `create_revision`
///   is the acquisition's fencing token and its value the holder, then a
///   `LeaseRevoke` of the etcd lease.
///
/// The ttl the [`Lease`](crate::Lease) engine asked for stays the local
/// deadline (it is never longer than the etcd lease's TTL), so rounding up
/// is safe: the holder stops before etcd frees the key. Another holder may
/// take over only when the etcd lease has expired — up to the rounding, plus
/// etcd's expiry check (every 500 ms), after the requested ttl.
///
/// # Renewal and a deposed leader
///
/// etcd before 3.4.28 and 3.5.11 (etcd issue #15247, fixed by PR #16822,
/// which makes `LeaseRenew` check that its member still leads; Debian
/// bookworm ships 3.4.23) lets a leader that was paused and resumed, and has
/// not yet heard of the newer term, answer a keep-alive from its own lessor.
/// The new leader, promoted before that keep-alive, never extended the
/// lease and revokes it at its expiry, while the holder trusts the answer
/// and runs past it: two valid holders (the fault suite's `leader-pause`
/// row measured it, see docs/RELIABILITY.md). A keep-alive sent to a
/// *follower* has the same hazard one step removed: the follower forwards
/// it to the member it believes leads, and fills the answer's header with
/// its own id and term, not those of the member that applied it.
///
/// So a backend made by [`connect`](Etcd::connect) keeps one client per
/// endpoint besides the balanced one, asks the members which of them leads
/// (`Status`, sent to all together; again whenever a renewal could not be
/// judged) and sends each renewal — the keep-alive stream and the read —
/// to that member, which named itself leader in term T. A renewal is
/// trusted only if:
///
/// - the keep-alive answers a TTL above 0, and
/// - a linearizable read of the key (the default `GetOptions`, not
///   serializable), sent no earlier than that keep-alive, finds the key with
///   this acquisition's `create_revision`, holder and etcd lease, and
/// - both answers' headers name that member and term T.
///
/// Why that suffices: the keep-alive's header names the member that
/// answered and the term it was in when it answered. That member led in
/// T, and a member leads at most once per term: still in T after applying
/// the keep-alive, it applied it as T's leader, from T's lessor (a member
/// that stops leading within its term forwards renewals only to a leader
/// of a later term, which it must hear of first). A linearizable read is
/// served only after a quorum confirmed its leader, at a time after the
/// read was sent, so after the keep-alive was sent; if it still sees T, no
/// newer leader was promoted before the keep-alive was sent, and a leader
/// promoted after it restarts every lease's full TTL on taking over: the
/// lease lives at least until the keep-alive's send time + TTL, what the
/// engine assumes. Any other answer cannot be told apart from a renewal
/// only a deposed leader applied, and the renewal fails with
/// [`Error::Etcd`] — neither renewed nor lost: the engine retries it until
/// the local deadline, which it does not move, and the retry asks again who
/// leads. A deposed leader cannot serve a linearizable read (it has no
/// quorum): the read fails, or waits until it hears of the new term (its
/// header then has the new one), or until the call's time limit.
///
/// A backend made by [`new`](Etcd::new) from a client, or whose endpoints
/// do not include the leader (a single endpoint in front of the cluster, a
/// proxy), cannot tell which member answers: it sends renewals through the
/// balanced client and checks only that both answers come from one raft
/// term. That check misses the follower above: on such set-ups run etcd
/// 3.4.28 / 3.5.11 or later, which refuse a renewal on a member that no
/// longer leads, or rely on the fencing token.
///
/// None of this helps against the deposed leader's *revocations* (see
/// [Faults](#faults)): those come from the server.
///
/// Every call (all its round trips together) is bounded by the backend's
/// [timeout](Etcd::with_timeout) (default 5 s), after which it fails with
/// [`Error::Timeout`].
///
/// # Fencing tokens
///
/// The key's `create_revision`: the revision of the cluster at the put that
/// created it. Revisions grow with every write to the cluster, so the
/// tokens of one name grow strictly with each acquisition (by more than
/// one), and never go back: a release deletes the key, and the next
/// acquisition creates it at a later revision. Compaction removes old
/// revisions from the history, not the `create_revision` of a live key: it
/// changes nothing for a held lease.
///
/// # Faults
///
/// - **A member fails** (crash, restart, partition): the cluster goes on
///   with a majority; requests sent to that member fail (the client is
///   connected with `require_leader`, so a member cut off from the leader
///   refuses rather than hangs) and are retried by the engine until the
///   lease's local deadline, through the other endpoints given to
///   [`connect`](Etcd::connect). The etcd leases survive: a new leader
///   restarts every lease's TTL when it takes over, so a held lease is not
///   lost by a leader change. Without a majority, no request succeeds: the
///   holder's token is cancelled at its local deadline, and nobody else can
///   acquire (etcd does not expire leases without a leader) until a
///   majority is back.
/// - **Compaction** (`etcdctl compact`, auto-compaction): removes history,
///   not keys or leases: no effect on a held lease or its fencing token.
/// - **The etcd lease is revoked** (`etcdctl lease revoke`, an operator, or
///   another client): etcd deletes the key at once; the holder learns at its
///   next renewal (within `ttl/3`), whose keep-alive reports the lease gone,
///   and its token is cancelled. Another holder may acquire in between: as
///   with any takeover, the fencing token tells them apart.
/// - **The key is deleted by hand** (`etcdctl del`) without revoking its
///   etcd lease: the lease lives on and its keep-alives succeed, but the
///   renewal's read of the key does not find it, so the holder's next
///   renewal (within `ttl/3`) reports the lease lost and its token is
///   cancelled, as after a revocation. Another holder may acquire in
///   between; the fencing token tells them apart.
/// - **A leader is paused or cut off and resumes** believing it still
///   leads: a renewal it answers fails (see
///   [Renewal](#renewal-and-a-deposed-leader)), and is retried to the
///   member that leads now. But **it may revoke held leases**: on
///   resuming, its lessor still counts every lease from the last keep-alive
///   *it* saw, finds those of a pause longer than their TTL expired, and
///   proposes their revocation, which the new leader commits — although
///   the holder renewed them through the new leader, and that renewal was
///   sound (etcd issue #15247; the check that etcd 3.4.28 / 3.5.11 added
///   narrows it but does not close it: measured on 3.4.23 and on 3.5.16).
///   For the holder it is a revocation like an operator's (below): the key
///   is gone at once, another contender may acquire it, and the holder
///   learns at its next renewal (within `ttl/3` and a round trip) and its
///   token is cancelled. **Until then both believe they hold the lease**;
///   only the fencing token tells their writes apart. No client can
///   prevent it; docs/RELIABILITY.md measures it (`leader-pause`).
/// - **The leader changes**: the first renewal sent to the old leader
///   fails (another member or term answers); its retry asks who leads and
///   opens a keep-alive stream there.
///
/// # Building
///
/// `etcd-client` compiles etcd's protobuf definitions in its build script,
/// which needs `protoc`: install it (`apt-get install protobuf-compiler`,
/// `brew install protobuf`) or set `PROTOC` to its path. (This repository's
/// `.cargo/config.toml` points `PROTOC` at a vendored one for its own builds.)
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lease::{backend::Etcd, Lease};
///
/// # #[tokio::main] async fn main() -> Result<(), lease::Error> {
/// let etcd = Etcd::connect(["http://127.0.0.1:2379", "http://127.0.0.1:22379"])
///     .await?
///     .with_prefix("myapp/lease/")?;
/// let lease = Lease::new(etcd);
/// if let Some(guard) = lease.try_acquire("nightly-report", Duration::from_secs(30)).await? {
///     println!("fencing token {:?}", guard.fencing_token());
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    /// One client per endpoint given to [`connect`](Etcd::connect), to send
    /// renewals to the member that leads; `None` for a backend built on a
    /// client ([`new`](Etcd::new)).
    members: Option<Arc<Members>>,
    prefix: Arc<str>,
    timeout: Duration,
    /// The etcd lease (and keep-alive stream) of each acquisition made
    /// through this value (and its clones), by (name, holder, fencing
    /// token).
    leases: Arc<Mutex<Leases>>,
}

/// The etcd lease of each acquisition, by (name, holder, fencing token).
type Leases = HashMap<(String, String, u64), Held>;

/// The key of an acquisition in [`Leases`].
fn entry(name: &str, holder: &str, fence: u64) -> (String, String, u64) {
    (name.to_owned(), holder.to_owned(), fence)
}

/// The members of the cluster as given to [`Etcd::connect`], one client
/// each, and the one that leads as last found (see
/// [Renewal](Etcd#renewal-and-a-deposed-leader)).
struct Members {
    /// By endpoint, in the order given.
    clients: Vec<Client>,
    /// Where renewals go, until a renewal through it fails.
    route: Mutex<Option<Route>>,
    /// Held while the members are asked who leads, so that renewals that
    /// all found no route ask once.
    finding: tokio::sync::Mutex<()>,
}

/// Where renewals go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// To the member at this index of [`Members::clients`], which said it
    /// leads in this term: a renewal is trusted only if both its answers
    /// come from that member in that term.
    Leader { index: usize, origin: Origin },
    /// Every endpoint answered and none leads (the leader is a member that
    /// was not given, as behind a proxy or a single endpoint): through the
    /// balanced client, with the weaker check of one raft term.
    Unlisted,
}

/// Who answered a request, from its response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Origin {
    member_id: u64,
    term: u64,
}

impl Origin {
    fn of(header: Option<&etcd_client::ResponseHeader>) -> Option<Self> {
        header.map(|h| Self {
            member_id: h.member_id(),
            term: h.raft_term(),
        })
    }
}

/// Forgets the route a renewal used unless the renewal got answers it
/// could judge: after an error, a timeout, an answer from another member
/// or term, or a cancellation, the next renewal asks again who leads.
struct RouteCheck<'a> {
    members: Option<&'a Members>,
    route: Option<Route>,
    judged: bool,
}

impl Drop for RouteCheck<'_> {
    fn drop(&mut self) {
        if self.judged {
            return;
        }
        if let (Some(members), Some(route)) = (self.members, self.route) {
            let mut cached = members.route.lock().unwrap_or_else(|e| e.into_inner());
            if *cached == Some(route) {
                *cached = None;
            }
        }
    }
}

/// An acquisition's etcd lease and its keep-alive stream.
struct Held {
    id: i64,
    /// Its release was sent and has not been confirmed (it failed, or was
    /// cancelled by the engine's limit). Such an acquisition is never
    /// renewed, and an acquisition by the same holder that finds its key
    /// finishes that release first (see [`Etcd::try_acquire`]).
    releasing: bool,
    /// Taken out by a renewal while it runs, put back only after the
    /// renewal read its answer: a stream with an unread answer is dropped.
    stream: Option<KeepAlive>,
}

/// A keep-alive stream of one etcd lease: where keep-alives are sent, and
/// where their answers come back (in order).
struct KeepAlive {
    /// The member it was opened to (an index of [`Members::clients`]), or
    /// `None` through the balanced client.
    member: Option<usize>,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Etcd {
    /// The key prefix used unless [`with_prefix`](Etcd::with_prefix) sets another.
    pub const DEFAULT_PREFIX: &'static str = "lease/";
    /// The longest key prefix, in bytes.
    pub const MAX_PREFIX_LEN: usize = 64;
    /// How long each call may take unless [`with_timeout`](Etcd::with_timeout) says otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The most renewals [`renew_many`](Backend::renew_many) has in flight
    /// at a time.
    pub const RENEW_IN_FLIGHT: usize = 64;

    /// Connect to the etcd cluster at `endpoints` (such as
    /// `["http://127.0.0.1:2379"]`), and only those: the client balances its
    /// requests over them and does not discover other members. Give it
    /// every member, so that it goes on when one fails, and so that
    /// renewals can be sent to the member that leads (see
    /// [Renewal](#renewal-and-a-deposed-leader)).
    ///
    /// The connection sends HTTP/2 pings (every 5 s, 2 s to answer) so that
    /// a member that went silent is noticed, asks for a leader on every
    /// request (a member cut off from the leader refuses at once), and
    /// gives up connecting after the default timeout (5 s).
    ///
    /// # Errors
    ///
    /// [`Error::Etcd`] for an invalid or empty list of endpoints.
    pub async fn connect<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
    ) -> Result<Self, Error> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Self::DEFAULT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(2))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        Self::connect_with(endpoints, options).await
    }

    /// [`connect`](Etcd::connect) with the client's `options` (credentials,
    /// timeouts, TLS) instead of its defaults. Every client it makes (one
    /// balanced over `endpoints`, and one per endpoint for renewals) uses
    /// them.
    ///
    /// # Errors
    ///
    /// [`Error::Etcd`] for an invalid or empty list of endpoints, or when
    /// the client cannot start (an authentication that fails).
    pub async fn connect_with<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
        options: ConnectOptions,
    ) -> Result<Self, Error> {
        let endpoints: Vec<String> = endpoints
            .into_iter()
            .map(|e| e.as_ref().to_owned())
            .collect();
        let client = Client::connect(&endpoints, Some(options.clone())).await?;
        // Connected lazily, as the balanced client: a member that is down
        // now is reached when it is back.
        let mut clients = Vec::with_capacity(endpoints.len());
        for endpoint in &endpoints {
            clients.push(Client::connect([endpoint], Some(options.clone())).await?);
        }
        Ok(Self {
            members: Some(Arc::new(Members {
                clients,
                route: Mutex::new(None),
                finding: tokio::sync::Mutex::new(()),
            })),
            ..Self::new(client)
        })
    }

    /// A backend on `client`, with the key prefix `lease/` and a 5 s
    /// timeout per call. The client's own settings (endpoints, timeouts,
    /// authentication) apply.
    ///
    /// A backend made this way cannot tell which member answers, and its
    /// renewals have the weaker check that
    /// [Renewal](#renewal-and-a-deposed-leader) describes: prefer
    /// [`connect`](Etcd::connect) or [`connect_with`](Etcd::connect_with).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            members: None,
            prefix: Self::DEFAULT_PREFIX.into(),
            timeout: Self::DEFAULT_TIMEOUT,
            leases: Arc::default(),
        }
    }

    /// Use `prefix` in front of every key (default `lease/`); may be empty.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPrefix`] if `prefix` is longer than 64 bytes or
    /// contains `{` or `}` (the rule of every backend with a key prefix, so
    /// that one prefix suits them all).
    pub fn with_prefix(self, prefix: impl Into<String>) -> Result<Self, Error> {
        let prefix: String = prefix.into();
        if prefix.len() > Self::MAX_PREFIX_LEN || prefix.contains(['{', '}']) {
            return Err(Error::InvalidPrefix {
                len: prefix.len(),
                prefix,
            });
        }
        Ok(Self {
            prefix: prefix.into(),
            ..self
        })
    }

    /// Give every call (all its round trips) at most `timeout` (default 5 s);
    /// a call that takes longer fails with [`Error::Timeout`]. The engine
    /// applies its own, often shorter, limits on top (a renewal gets at most
    /// `ttl/3`).
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The timeout of each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The client the backend sends its requests with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The etcd key of the lease `name`: `{prefix}{name}`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), lease::Error> {
    /// let etcd = lease::backend::Etcd::connect(["http://127.0.0.1:2379"]).await?;
    /// assert_eq!(etcd.key("report"), "lease/report");
    /// # Ok(()) }
    /// ```
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The etcd lease TTL, in seconds, for a lease of `ttl`: rounded up to
    /// whole seconds (the cluster may raise it to its minimum).
    pub fn lease_ttl_secs(ttl: Duration) -> i64 {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
    }

    /// What [`inspect`](Backend::inspect) answers for the key `kv`.
    async fn info(&self, kv: &KeyValue) -> Result<LeaseInfo, Error> {
        let name = String::from_utf8_lossy(&kv.key()[self.prefix.len().min(kv.key().len())..])
            .into_owned();
        let expires_in = if kv.lease() == 0 {
            None
        } else {
            let mut client = self.client.clone();
            let ttl = client
                .lease_time_to_live(kv.lease(), Some(LeaseTimeToLiveOptions::new()))
                .await?
                .ttl();
            u64::try_from(ttl)
                .ok()
                .filter(|&s| s > 0)
                .map(Duration::from_secs)
        };
        Ok(LeaseInfo::new(
            name,
            String::from_utf8_lossy(kv.value()),
            expires_in,
            fence_of(kv),
        ))
    }

    fn leases(&self) -> MutexGuard<'_, Leases> {
        // Every update is a single insert or remove: a poisoned lock is consistent.
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember(&self, lease: Acquisition<'_>, id: i64, stream: Option<KeepAlive>) {
        if let Some(fence) = lease.fencing_token {
            self.leases().insert(
                entry(lease.name, lease.holder, fence),
                Held {
                    id,
                    stream,
                    releasing: false,
                },
            );
        }
    }

    /// Open a keep-alive stream of the etcd lease `id` on `route`'s member
    /// (etcd-client sends a first keep-alive and waits for its answer).
    async fn open_stream(&self, id: i64, route: Option<Route>) -> Result<KeepAlive, Error> {
        let (member, mut client) = self.client_for(route);
        let (keeper, stream) = client.lease_keep_alive(id).await?;
        Ok(KeepAlive {
            member,
            keeper,
            stream,
        })
    }

    /// The member index and the client that requests on `route` go through.
    fn client_for(&self, route: Option<Route>) -> (Option<usize>, Client) {
        match (member_of(route), &self.members) {
            (Some(index), Some(members)) => (Some(index), members.clients[index].clone()),
            _ => (None, self.client.clone()),
        }
    }

    /// Where renewals go: the route last found, or the member that says it
    /// leads now (one `Status` to every endpoint, sent together; the first
    /// that names itself is taken — a renewal checks it). `None` for a
    /// backend built on a client.
    async fn route(&self) -> Result<Option<Route>, Error> {
        let Some(members) = &self.members else {
            return Ok(None);
        };
        let cached = || *members.route.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(route) = cached() {
            return Ok(Some(route));
        }
        let _finding = members.finding.lock().await;
        if let Some(route) = cached() {
            return Ok(Some(route));
        }
        let route = find_leader(&members.clients).await?;
        tracing::debug!(?route, "etcd: renewals go to this member");
        *members.route.lock().unwrap_or_else(|e| e.into_inner()) = Some(route);
        Ok(Some(route))
    }

    /// Run `call` while the route is found, if it is not known: the route
    /// if it was found by the time `call` is done.
    async fn alongside_route<T>(&self, call: impl Future<Output = T>) -> (T, Option<Route>) {
        let route = self.route();
        tokio::pin!(route, call);
        let mut found = None;
        let mut finding = true;
        loop {
            tokio::select! {
                biased;
                r = &mut route, if finding => {
                    finding = false;
                    found = r.ok().flatten();
                }
                out = &mut call => return (out, found),
            }
        }
    }

    /// Take out the keep-alive stream of `lease`'s etcd lease `id`, if one
    /// is open to `route`'s member and not in use by another renewal (a
    /// stream to another member is dropped).
    fn take_stream(
        &self,
        lease: Acquisition<'_>,
        fence: u64,
        id: i64,
        route: Option<Route>,
    ) -> Option<KeepAlive> {
        let member = member_of(route);
        self.leases()
            .get_mut(&entry(lease.name, lease.holder, fence))
            .filter(|held| held.id == id && !held.releasing)
            .and_then(|held| held.stream.take())
            .filter(|open| open.member == member)
    }

    fn forget(&self, lease: Acquisition<'_>) {
        if let Some(fence) = lease.fencing_token {
            self.leases()
                .remove(&entry(lease.name, lease.holder, fence));
        }
    }

    /// Mark `lease` as being released: never renewed again, its keep-alive
    /// stream closed. The etcd lease it had, if this value knows it.
    fn releasing(&self, lease: Acquisition<'_>) -> Option<i64> {
        let fence = lease.fencing_token?;
        let mut leases = self.leases();
        let held = leases.get_mut(&entry(lease.name, lease.holder, fence))?;
        held.releasing = true;
        held.stream = None;
        Some(held.id)
    }

    /// Whether the key `kv` of `name` is an acquisition of `holder` through
    /// this value whose release was sent and not confirmed.
    fn unconfirmed_release(&self, name: &str, holder: &str, kv: &KeyValue) -> bool {
        fence_of(kv).is_some_and(|fence| {
            self.leases()
                .get(&entry(name, holder, fence))
                .is_some_and(|held| held.releasing && held.id == kv.lease())
        })
    }

    /// Run `call` within the backend's timeout.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| Error::Timeout {
                operation,
                after: self.timeout,
            })?
    }

    /// Revoke the etcd lease `id` in the background (best effort: an unused
    /// lease expires by itself at its TTL).
    fn revoke_later(&self, id: i64) {
        let mut client = self.client.clone();
        let timeout = self.timeout;
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tracing::debug!(id, "etcd: revoking an unused etcd lease");
                let _ = tokio::time::timeout(timeout, client.lease_revoke(id)).await;
            });
        }
    }

    /// The etcd lease of `lease`, if that acquisition is still the key's:
    /// remembered, or read from the key.
    async fn lease_of(&self, lease: Acquisition<'_>) -> Result<Option<i64>, Error> {
        let Some(fence) = lease.fencing_token else {
            return Ok(None);
        };
        let remembered = self
            .leases()
            .get(&entry(lease.name, lease.holder, fence))
            .map(|held| (!held.releasing).then_some(held.id));
        if let Some(id) = remembered {
            return Ok(id);
        }
        let kv = self.read(lease.name).await?;
        Ok(kv
            .filter(|kv| fence_of(kv) == Some(fence) && kv.value() == lease.holder.as_bytes())
            .map(|kv| kv.lease()))
    }

    /// The key of `name`, if it exists.
    async fn read(&self, name: &str) -> Result<Option<KeyValue>, Error> {
        let mut client = self.client.clone();
        let mut response = client.get(self.key(name), None).await?;
        Ok(response.take_kvs().into_iter().next())
    }

    /// One renewal of the acquisition `lease`, whose etcd lease is `id`: a
    /// keep-alive on the acquisition's stream to the member that leads
    /// (opened first if it has none there) sent together with a
    /// linearizable read of the key on the same member, judged by
    /// [`verdict`]. The stream goes back to the acquisition only after a
    /// renewal that succeeded; on an error, a loss or a cancellation it is
    /// dropped, with any answer left unread on it. A renewal whose answers
    /// could not be judged (an error, another member or term, a timeout)
    /// forgets the route, and the next one asks again who leads.
    async fn renew_once(&self, lease: Acquisition<'_>, fence: u64, id: i64) -> Result<bool, Error> {
        let route = self.route().await?;
        let mut check = RouteCheck {
            members: self.members.as_deref(),
            route,
            judged: false,
        };
        let open = match self.take_stream(lease, fence, id, route) {
            Some(open) => open,
            // etcd-client sends a first keep-alive to open the stream,
            // checks its TTL and drops the rest of the answer (its header):
            // the keep-alive sent below is the one whose answer is judged.
            None => match self.open_stream(id, route).await {
                Ok(opened) => opened,
                // etcd-client's answer to a keep-alive whose reply has TTL 0.
                Err(Error::Etcd(etcd_client::Error::LeaseKeepAliveError(m)))
                    if m == "lease not found" =>
                {
                    check.judged = true;
                    return Ok(false);
                }
                Err(e) => return Err(e),
            },
        };
        let KeepAlive {
            member,
            mut keeper,
            mut stream,
        } = open;
        let keep_alive = async {
            keeper.keep_alive().await?;
            stream.message().await
        };
        // Polled second by `try_join!`: sent no earlier than the keep-alive
        // is handed to its stream. `GetOptions` default: a linearizable
        // read (not serializable).
        let mut reader = self.client_for(route).1;
        let read = reader.get(self.key(lease.name), None);
        let (answer, mut read) = tokio::try_join!(keep_alive, read)?;
        let Some(answer) = answer else {
            return Err(Error::Protocol(
                "etcd closed the keep-alive stream without an answer".to_owned(),
            ));
        };
        let key = read.take_kvs().into_iter().next();
        let leader = match route {
            Some(Route::Leader { origin, .. }) => Some(origin),
            _ => None,
        };
        let seen = Renewal {
            ttl: answer.ttl(),
            keep_alive: Origin::of(answer.header()),
            read: Origin::of(read.header()),
            key: key.as_ref().map(|kv| KeySeen {
                create_revision: kv.create_revision(),
                lease: kv.lease(),
                holder_matches: kv.value() == lease.holder.as_bytes(),
            }),
        };
        tracing::debug!(
            lease.name = lease.name,
            fence,
            ?route,
            ?seen,
            "etcd: renewal answered"
        );
        let renewed = verdict(seen, fence, id, leader)?;
        check.judged = true;
        if renewed {
            self.keep_stream(
                lease,
                fence,
                id,
                KeepAlive {
                    member,
                    keeper,
                    stream,
                },
            );
        }
        Ok(renewed)
    }

    /// Give the open stream back to the acquisition after a renewal. A
    /// stream whose acquisition this value does not remember (released
    /// meanwhile, or made through another value) is dropped.
    fn keep_stream(&self, lease: Acquisition<'_>, fence: u64, id: i64, open: KeepAlive) {
        let key = entry(lease.name, lease.holder, fence);
        if let Some(held) = self
            .leases()
            .get_mut(&key)
            .filter(|held| held.id == id && !held.releasing)
        {
            held.stream = Some(open);
        }
    }

    async fn try_acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        let mut client = self.client.clone();
        // Who leads is asked (when not known) together with the grant: the
        // keep-alive stream opens to that member. Without an answer by the
        // time the grant is answered it opens through the balanced client,
        // and the first renewal opens one to the leader.
        let (granted, route) = self
            .alongside_route(client.lease_grant(Self::lease_ttl_secs(ttl), None))
            .await;
        let granted = granted?.id();
        tracing::debug!(id = granted, "etcd: granted");
        let key = self.key(name);
        let mut finished_release = false;
        let kv = loop {
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    holder,
                    Some(PutOptions::new().with_lease(granted)),
                )])
                .or_else([TxnOp::get(key.clone(), None)]);
            // The keep-alive stream of the new etcd lease opens together
            // with the transaction (one round trip for both), so that every
            // renewal is one round trip; it is dropped if the key is not
            // taken.
            let (response, stream) =
                tokio::join!(client.txn(txn), self.open_stream(granted, route));
            let stream = stream.ok();
            let response = match response {
                Ok(response) => response,
                Err(e) => {
                    self.revoke_later(granted);
                    return Err(e.into());
                }
            };
            if response.succeeded() {
                let revision = response.header().map(|h| h.revision()).ok_or_else(|| {
                    Error::Protocol("etcd answered a transaction without a header".to_owned())
                })?;
                let fence = positive(revision)?;
                self.remember(Acquisition::new(name, holder, Some(fence)), granted, stream);
                return Ok(Some(Grant::new(Some(fence))));
            }
            drop(stream);
            let existing = response.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                _ => None,
            });
            let Some(kv) = existing.filter(|kv| kv.value() == holder.as_bytes()) else {
                // Held by another holder (or, impossibly, read as absent).
                self.revoke_later(granted);
                return Ok(None);
            };
            if finished_release || !self.unconfirmed_release(name, holder, &kv) {
                break kv;
            }
            // The key is this holder's earlier acquisition, whose release
            // was sent and not confirmed (the engine kept the name for a
            // ttl since; etcd frees a key only at its lease's expiry sweep,
            // later). That release may still be delivered: finish it (revoke
            // its etcd lease, which deletes the key) and acquire afresh,
            // with a new fencing token, rather than re-acquire it with the
            // old one, which the late release would then end.
            finished_release = true;
            tracing::debug!(id = kv.lease(), "etcd: finishing an unconfirmed release");
            match client.lease_revoke(kv.lease()).await {
                Ok(_) => {}
                Err(etcd_client::Error::GRpcStatus(s))
                    if s.message().contains("lease not found") => {}
                Err(e) => {
                    self.revoke_later(granted);
                    return Err(e.into());
                }
            }
            self.forget(Acquisition::new(name, holder, fence_of(&kv)));
        };
        // Held by the same holder: an idempotent re-acquire. The key moves
        // to the new etcd lease, so that it lives for the ttl asked for now
        // (the old lease may have been granted a shorter one); `put` keeps
        // the key's `create_revision`, the fencing token. If the key changed
        // in between (expired, released), nothing is acquired this time.
        let fence = positive(kv.create_revision())?;
        let key = self.key(name);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, kv.create_revision()),
                Compare::value(key.clone(), CompareOp::Equal, holder),
            ])
            .and_then([TxnOp::put(
                key,
                holder,
                Some(PutOptions::new().with_lease(granted)),
            )]);
        let (moved, stream) = tokio::join!(client.txn(txn), self.open_stream(granted, route));
        let stream = stream.ok();
        let moved = match moved {
            Ok(response) => response.succeeded(),
            Err(e) => {
                self.revoke_later(granted);
                return Err(e.into());
            }
        };
        if !moved {
            self.revoke_later(granted);
            return Ok(None);
        }
        if kv.lease() != 0 {
            // Nothing is attached to the old etcd lease any more.
            self.revoke_later(kv.lease());
        }
        self.remember(Acquisition::new(name, holder, Some(fence)), granted, stream);
        Ok(Some(Grant::new(Some(fence))))
    }
}

/// The member a renewal on `route` goes to, `None` through the balanced client.
fn member_of(route: Option<Route>) -> Option<usize> {
    match route {
        Some(Route::Leader { index, .. }) => Some(index),
        _ => None,
    }
}

/// Ask every member (`clients`, one each) who leads, all at once: the first
/// that answers naming itself, in the term of its answer. [`Route::Unlisted`]
/// if every member answered and none leads, but one named a leader; an
/// error if none named one (an election), or every request failed.
async fn find_leader(clients: &[Client]) -> Result<Route, Error> {
    let mut asked: futures_util::stream::FuturesUnordered<_> = clients
        .iter()
        .enumerate()
        .map(|(index, client)| {
            let mut client = client.clone();
            async move { (index, client.status().await) }
        })
        .collect();
    let mut failure = None;
    let mut members = Vec::new();
    let mut named = Vec::new();
    while let Some((index, answer)) = asked.next().await {
        let status = match answer {
            Ok(status) => status,
            Err(e) => {
                failure = Some(e);
                continue;
            }
        };
        let Some(origin) = Origin::of(status.header()) else {
            continue;
        };
        if status.leader() != 0 && status.leader() == origin.member_id {
            return Ok(Route::Leader { index, origin });
        }
        members.push(origin.member_id);
        if status.leader() != 0 {
            named.push(status.leader());
        }
    }
    if let Some(e) = failure {
        return Err(e.into());
    }
    // Every member answered. A leader that is one of them but did not say
    // so answered before it was elected: ask again, later.
    if !named.is_empty() && named.iter().all(|leader| !members.contains(leader)) {
        return Ok(Route::Unlisted);
    }
    Err(Error::Etcd(etcd_client::Error::InvalidArgs(
        "no etcd member given to the backend said it leads (an election?)".to_owned(),
    )))
}

/// The fencing token of the key `kv`: its `create_revision`.
fn fence_of(kv: &KeyValue) -> Option<u64> {
    u64::try_from(kv.create_revision()).ok().filter(|&f| f > 0)
}

/// What a renewal saw: the answer to its keep-alive and to its read of the key.
#[derive(Debug, Clone, Copy)]
struct Renewal {
    /// The TTL the keep-alive answered (0 or less: the etcd lease is gone).
    ttl: i64,
    /// The member and raft term in the keep-alive answer's header.
    keep_alive: Option<Origin>,
    /// The member and raft term in the linearizable read's header.
    read: Option<Origin>,
    /// The key, if the read found it.
    key: Option<KeySeen>,
}

/// The key as the renewal's read found it.
#[derive(Debug, Clone, Copy)]
struct KeySeen {
    create_revision: i64,
    /// The etcd lease the key is attached to.
    lease: i64,
    /// Whether its value is the acquisition's holder.
    holder_matches: bool,
}

/// Whether a renewal of the acquisition with fencing token `fence` and etcd
/// lease `id` succeeded: `Ok(true)` renewed, `Ok(false)` lost, an error when
/// the answers cannot be trusted (the engine retries until its local
/// deadline, which this renewal does not extend). `leader` is the member
/// the renewal was sent to and the term in which it said it leads, if the
/// backend knows its members.
///
/// - The keep-alive reports the etcd lease gone (TTL 0): lost.
/// - The linearizable read does not find the key with this acquisition's
///   `create_revision`, holder and etcd lease (expired, released, deleted by
///   hand, moved to another etcd lease): lost — that read is the cluster's
///   state after the renewal was sent.
/// - With a `leader`: either answer comes from another member, or from
///   another term: an error. The member no longer leads, or never did: it
///   may have applied the keep-alive as a deposed leader, or forwarded it
///   to one (etcd before 3.4.28 / 3.5.11 lets a deposed leader that has not
///   heard of the new term renew, see the type's docs).
/// - Without one: the two answers come from different raft terms: an error.
fn verdict(seen: Renewal, fence: u64, id: i64, leader: Option<Origin>) -> Result<bool, Error> {
    if seen.ttl <= 0 {
        return Ok(false);
    }
    let ours = seen.key.is_some_and(|k| {
        u64::try_from(k.create_revision).ok() == Some(fence) && k.lease == id && k.holder_matches
    });
    if !ours {
        return Ok(false);
    }
    let (Some(kept), Some(read)) = (seen.keep_alive, seen.read) else {
        return Err(Error::Protocol(
            "etcd answered a renewal without a response header".to_owned(),
        ));
    };
    let untrusted = |why: String| {
        Err(Error::Etcd(etcd_client::Error::LeaseKeepAliveError(
            format!("{why}: a leader change may have lost the renewal"),
        )))
    };
    match leader {
        Some(leader) if kept != leader || read != leader => untrusted(format!(
            "the renewal was sent to member {:x}, which led in raft term {}, and was answered \
             by member {:x} in term {} (keep-alive) and member {:x} in term {} (read)",
            leader.member_id, leader.term, kept.member_id, kept.term, read.member_id, read.term
        )),
        None if kept.term != read.term => untrusted(format!(
            "the keep-alive was answered in raft term {} and the read of the key in term {}",
            kept.term, read.term
        )),
        _ => Ok(true),
    }
}

fn positive(revision: i64) -> Result<u64, Error> {
    u64::try_from(revision)
        .ok()
        .filter(|&r| r > 0)
        .ok_or_else(|| Error::Protocol(format!("etcd answered the revision {revision}")))
}

impl Backend for Etcd {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        validate::call(name, holder, ttl)?;
        self.bounded("acquire", self.try_acquire(name, holder, ttl))
            .await
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        validate::call(lease.name, lease.holder, ttl)?;
        self.bounded("renew", async {
            let (Some(fence), Some(id)) = (lease.fencing_token, self.lease_of(lease).await?) else {
                return Ok(false);
            };
            let alive = self.renew_once(lease, fence, id).await?;
            if !alive {
                self.forget(lease);
            }
            Ok(alive)
        })
        .await
    }

    /// One [`renew`](Backend::renew) per lease (etcd keeps leases alive one
    /// by one), at most [`Etcd::RENEW_IN_FLIGHT`] at a time, so that each
    /// renewal's time limit runs from when it is sent, not from the start of
    /// a queue of thousands. `Err` (the whole batch is retried) at the first
    /// renewal that fails.
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        // Collected first: a stream over the closure is not `Send` for
        // every lifetime the trait's future must accept.
        let calls: Vec<_> = leases
            .iter()
            .map(|&(lease, ttl)| self.renew(lease, ttl))
            .collect();
        futures_util::stream::iter(calls)
            .buffered(Self::RENEW_IN_FLIGHT)
            .try_collect()
            .await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        let Some(fence) = lease.fencing_token.and_then(|f| i64::try_from(f).ok()) else {
            return Ok(());
        };
        // Whatever the outcome, this acquisition is not renewed again: its
        // keep-alive stream closes now. It is forgotten once the release is
        // confirmed; until then a new acquisition by the holder finishes it.
        let id = self.releasing(lease);
        self.bounded("release", async {
            let key = self.key(lease.name);
            let mut compare = vec![
                Compare::create_revision(key.clone(), CompareOp::Equal, fence),
                Compare::value(key.clone(), CompareOp::Equal, lease.holder),
            ];
            if let Some(id) = id {
                // Not the same acquisition's key moved to another etcd
                // lease by a re-acquire made meanwhile.
                compare.push(Compare::lease(key.clone(), CompareOp::Equal, id));
            }
            let txn = Txn::new().when(compare).and_then([TxnOp::delete(
                key,
                Some(DeleteOptions::new().with_prev_key()),
            )]);
            let mut client = self.client.clone();
            let response = client.txn(txn).await?;
            self.forget(lease);
            let deleted = response.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Delete(mut d) => d.take_prev_kvs().into_iter().next(),
                _ => None,
            });
            if let Some(kv) = deleted.filter(|kv| kv.lease() != 0) {
                // The key is gone; its etcd lease has nothing left to keep.
                // A failed revoke only leaves it to expire.
                tracing::debug!(id = kv.lease(), "etcd: released; revoking its etcd lease");
                let _ = client.lease_revoke(kv.lease()).await;
            }
            Ok(())
        })
        .await
    }

    /// The key of `name` and its etcd lease's remaining TTL (two round
    /// trips); `Ok(None)` when there is no key (never acquired, released,
    /// or expired: etcd deletes the key with its lease).
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        validate::name(name)?;
        self.bounded("inspect", async {
            match self.read(name).await? {
                Some(kv) => self.info(&kv).await.map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    /// Every lease under the prefix (one range read, then one `LeaseTimeToLive`
    /// per key, sent together), sorted by name; as
    /// [`inspect`](Backend::inspect) answers each. Names are the keys without
    /// the prefix (a key that is not UTF-8 is shown lossily).
    ///
    /// # Errors
    ///
    /// [`Error::Etcd`], or [`Error::Timeout`] after the backend's timeout.
    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        self.bounded("list", async {
            let mut client = self.client.clone();
            let kvs = client
                .get(
                    self.prefix.as_bytes(),
                    Some(GetOptions::new().with_prefix()),
                )
                .await?
                .take_kvs();
            let infos = futures_util::future::join_all(kvs.iter().map(|kv| self.info(kv))).await;
            let mut infos: Vec<LeaseInfo> = infos.into_iter().collect::<Result<_, _>>()?;
            infos.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(infos)
        })
        .await
    }

    /// End the lease on `name` now, whoever holds it: revoke the etcd lease
    /// its key is attached to (etcd deletes the key with it). `Ok(true)` if
    /// a lease was ended, `Ok(false)` if `name` was not held. The evicted
    /// holder's next renewal finds its etcd lease gone (within `ttl/3`) and
    /// its token is cancelled; the next acquisition's fencing token is
    /// larger (revisions only grow).
    ///
    /// # Errors
    ///
    /// [`Error::Etcd`], or [`Error::Timeout`] after the backend's timeout.
    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        self.bounded("force_release", async {
            let Some(kv) = self.read(name).await? else {
                return Ok(false);
            };
            let mut client = self.client.clone();
            if kv.lease() == 0 {
                // Not written by this backend (no etcd lease): delete the
                // key iff it is still the one read.
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        kv.key().to_vec(),
                        CompareOp::Equal,
                        kv.create_revision(),
                    )])
                    .and_then([TxnOp::delete(kv.key().to_vec(), None)]);
                return Ok(client.txn(txn).await?.succeeded());
            }
            match client.lease_revoke(kv.lease()).await {
                Ok(_) => Ok(true),
                // Expired between the read and the revoke: not held.
                // ("etcdserver: requested lease not found", gRPC NotFound.)
                Err(etcd_client::Error::GRpcStatus(s))
                    if s.message().contains("lease not found") =>
                {
                    Ok(false)
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEADER: u64 = 0xa1;
    const FOLLOWER: u64 = 0xf2;

    fn origin(member_id: u64, term: u64) -> Option<Origin> {
        Some(Origin { member_id, term })
    }

    fn seen(keep_alive_term: u64, read_term: u64) -> Renewal {
        Renewal {
            ttl: 5,
            keep_alive: origin(LEADER, keep_alive_term),
            read: origin(LEADER, read_term),
            key: Some(KeySeen {
                create_revision: 40,
                lease: 7,
                holder_matches: true,
            }),
        }
    }

    #[test]
    fn without_members_a_renewal_is_trusted_only_within_one_raft_term() {
        assert!(verdict(seen(3, 3), 40, 7, None).unwrap());
        // A keep-alive answered in an older term than the read (a deposed
        // leader's answer): an error, retried, neither renewed nor lost.
        assert!(matches!(
            verdict(seen(3, 4), 40, 7, None),
            Err(Error::Etcd(_))
        ));
        assert!(matches!(
            verdict(seen(4, 3), 40, 7, None),
            Err(Error::Etcd(_))
        ));
        let headless = Renewal {
            read: None,
            ..seen(3, 3)
        };
        assert!(matches!(
            verdict(headless, 40, 7, None),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn a_renewal_is_trusted_only_from_the_member_that_leads_in_its_term() {
        let leader = origin(LEADER, 3);
        assert!(verdict(seen(3, 3), 40, 7, leader).unwrap());
        // A keep-alive forwarded by a follower (the header is the
        // follower's, in the newer term it heard of meanwhile): the check by
        // terms alone trusts it, the check by member does not.
        let forwarded = Renewal {
            keep_alive: origin(FOLLOWER, 4),
            read: origin(FOLLOWER, 4),
            ..seen(3, 3)
        };
        assert!(verdict(forwarded, 40, 7, None).unwrap());
        assert!(matches!(
            verdict(forwarded, 40, 7, leader),
            Err(Error::Etcd(_))
        ));
        // The member that led, answering in a later term (it was deposed and
        // heard of it before filling the header): not trusted.
        assert!(matches!(
            verdict(seen(4, 4), 40, 7, leader),
            Err(Error::Etcd(_))
        ));
        assert!(matches!(
            verdict(seen(3, 4), 40, 7, leader),
            Err(Error::Etcd(_))
        ));
        let read_elsewhere = Renewal {
            read: origin(FOLLOWER, 3),
            ..seen(3, 3)
        };
        assert!(matches!(
            verdict(read_elsewhere, 40, 7, leader),
            Err(Error::Etcd(_))
        ));
    }

    #[test]
    fn a_renewal_that_does_not_find_its_key_is_lost() {
        // Even across a term change: the linearizable read is the truth.
        let gone = Renewal {
            key: None,
            ..seen(3, 4)
        };
        assert!(!verdict(gone, 40, 7, None).unwrap());
        assert!(!verdict(gone, 40, 7, origin(LEADER, 3)).unwrap());
        assert!(
            !verdict(seen(3, 3), 41, 7, None).unwrap(),
            "another acquisition"
        );
        assert!(
            !verdict(seen(3, 3), 40, 8, None).unwrap(),
            "another etcd lease"
        );
        let other_holder = Renewal {
            key: Some(KeySeen {
                holder_matches: false,
                ..seen(3, 3).key.unwrap()
            }),
            ..seen(3, 3)
        };
        assert!(!verdict(other_holder, 40, 7, None).unwrap());
        let expired = Renewal {
            ttl: 0,
            ..seen(3, 3)
        };
        assert!(!verdict(expired, 40, 7, None).unwrap());
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(Etcd::lease_ttl_secs(Duration::from_millis(10)), 1);
        assert_eq!(Etcd::lease_ttl_secs(Duration::from_millis(1_000)), 1);
        assert_eq!(Etcd::lease_ttl_secs(Duration::from_millis(1_001)), 2);
        assert_eq!(Etcd::lease_ttl_secs(Duration::from_secs(86_400)), 86_400);
    }
}
