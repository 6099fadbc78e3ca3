//! [`FaultProxy`]: a TCP proxy between clients and a server that injects
//! network faults at run time — added latency, a black hole, resets — with
//! no tool outside this crate.
//!
//! ```no_run
//! # async fn f(server: std::net::SocketAddr) {
//! use std::time::Duration;
//! use lease_tests::proxy::{FaultProxy, Mode};
//!
//! let proxy = FaultProxy::start(server).await;
//! // clients connect to proxy.addr() instead of `server`
//! proxy.set_mode(Mode::Delay(Duration::from_millis(100))); // +100 ms each way
//! proxy.set_mode(Mode::BlackHole);                         // nothing gets through
//! proxy.set_mode(Mode::Pass);                              // healed: held bytes flow on
//! let cut = proxy.reset();                                 // RST every open connection
//! let stuck = proxy.black_hole_open();                     // the open ones go silent for good
//! proxy.stall_requests(|chunk| chunk.len() > 16);          // the open ones' next request waits...
//! let held = proxy.deliver_stalled();                      // ...until now
//! # let _ = (cut, stuck, held); }
//! ```
//!
//! # Modes
//!
//! - [`Mode::Pass`]: bytes are forwarded as they come.
//! - [`Mode::Delay`]: every chunk read from either side is written to the
//!   other side `d` later (order is kept; a chunk read before the mode
//!   changed keeps the delay it was read with).
//! - [`Mode::BlackHole`]: connections are accepted and kept open, bytes are
//!   read but held back, and nothing is written to either side — a network
//!   partition as the endpoints see it before TCP gives up: writes succeed,
//!   answers never come, nobody learns that the peer went away. When the
//!   mode changes back, the held bytes are delivered, as TCP would
//!   retransmit them once a partition heals. New connections are accepted
//!   but not connected upstream until then.
//!
//! # Black-holing only the open connections
//!
//! [`black_hole_open`](FaultProxy::black_hole_open) black-holes the
//! connections open at that moment *for good*, while new connections keep
//! following the mode (in [`Mode::Pass`], they reach the server at once).
//! This is a half-open connection whose path is gone but whose endpoints were
//! never told — a failover behind a virtual IP, a NAT or load-balancer entry
//! dropped, a peer that vanished: writes to it succeed, no answer ever comes,
//! no error is ever reported (until the kernel's retransmissions give up,
//! about 15 minutes on Linux), and only a new connection reaches the server.
//! Such a connection never heals: changing the mode does not deliver its
//! held bytes. Only [`reset`](FaultProxy::reset) (or dropping the proxy) ends
//! it. [`accepted`](FaultProxy::accepted) counts the connections ever
//! accepted, to see how many new ones a client opened.
//!
//! # Stalling the next request
//!
//! [`stall_requests`](FaultProxy::stall_requests) arms the connections open
//! at that moment: the next chunk a client sends on one of them that the
//! given predicate takes for a request — a statement, not a keep-alive
//! ping — and everything the client sends after it on that connection are
//! held back until [`deliver_stalled`](FaultProxy::deliver_stalled), which
//! delivers them in order and returns what was held, with the instant it
//! was sent (on [`crate::monotonic_us`]). One request is
//! stalled: other chunks sent before it go through, and so does everything
//! on the other connections and on new ones. This is a request lost in
//! the network for a while and then delivered — TCP retransmitting it after
//! a partition healed — on a connection the client is still waiting on or
//! has given up on.
//!
//! Pings are let through because connection pools send them on their own:
//! sqlx pings a connection before handing it out and when it comes back,
//! and the next statement on it waits for that ping's answer. A stalled ping
//! would keep the request that matters from ever leaving the client. So
//! would a stalled preparation of a statement (sqlx prepares a statement on
//! its first use on a connection, and sends it only once that is answered):
//! the predicate tells which chunks to stall.
//!
//! # Watching the traffic
//!
//! [`record_replies`](FaultProxy::record_replies) makes the proxy note when
//! it read each chunk the server sent (on [`crate::monotonic_us`]);
//! [`last_reply_between`](FaultProxy::last_reply_between) looks them up: the
//! instant the server's answer to a request left the server, as near as
//! can be seen from outside it, whatever delay the proxy then adds.
//! [`last_activity_us`](FaultProxy::last_activity_us) is when the proxy last
//! read anything from either side.
//!
//! [`reset`](FaultProxy::reset) closes every open connection abruptly on both
//! sides (`SO_LINGER` 0, so each side gets a TCP RST, not a FIN), whatever the
//! mode. The server's side ending (for example a killed session) ends the
//! client's side too, with whatever was still held back.
//!
//! [`start_many`](FaultProxy::start_many) makes one proxy for a client's
//! link to several servers (the members of a cluster): a listening port per
//! server, and one mode, one set of connections to reset or stall, for all.
//!
//! Dropping the proxy stops it and cuts every connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::monotonic_us;

/// What a [`FaultProxy`] does to the bytes it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Forward each chunk this long after it was read, in both directions.
    Delay(Duration),
    /// Forward nothing (hold it back) until the mode changes.
    BlackHole,
}

impl Mode {
    fn delay(self) -> Duration {
        match self {
            Mode::Delay(d) => d,
            _ => Duration::ZERO,
        }
    }
}

/// What every connection watches: the mode, which connections are
/// black-holed for good whatever the mode, and which are armed to stall
/// their next request.
#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    /// Connections numbered below this are black-holed for good
    /// ([`FaultProxy::black_hole_open`]).
    stuck_below: u64,
    /// Armed by [`FaultProxy::stall_requests`], until
    /// [`FaultProxy::deliver_stalled`].
    stall: Option<Stall>,
}

/// Which chunks of a client's a stall takes for a request.
type IsRequest = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// The predicate of the current [`Stall`].
#[derive(Default)]
struct RequestFilter(Mutex<Option<IsRequest>>);

impl std::fmt::Debug for RequestFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestFilter")
    }
}

impl RequestFilter {
    fn set(&self, is_request: IsRequest) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(is_request);
    }

    fn matches(&self, chunk: &[u8]) -> bool {
        let filter = self.0.lock().unwrap_or_else(|e| e.into_inner());
        filter.as_ref().is_some_and(|f| f(chunk))
    }
}

/// One arming of [`FaultProxy::stall_requests`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stall {
    /// Tells this arming from later ones: a chunk held by it waits until
    /// the state no longer carries it.
    generation: u64,
    /// Connections numbered below this (open when it was armed) are armed.
    below: u64,
}

/// What one connection's client sent into a stall
/// ([`FaultProxy::stall_requests`]), as [`FaultProxy::deliver_stalled`]
/// reports it.
#[derive(Debug, Clone)]
pub struct StalledRequest {
    /// The proxy's number of the connection (in order of acceptance).
    pub connection: u64,
    /// When the first held chunk was read ([`crate::monotonic_us`]).
    pub first_at_us: i64,
    /// Everything held back, in order.
    pub bytes: Vec<u8>,
}

impl State {
    /// The mode that applies to connection number `id`.
    fn mode_of(self, id: u64) -> Mode {
        if id < self.stuck_below {
            Mode::BlackHole
        } else {
            self.mode
        }
    }
}

#[derive(Debug)]
struct Shared {
    state: watch::Sender<State>,
    /// Notified (all waiters) on [`FaultProxy::reset`].
    reset: Notify,
    open: AtomicUsize,
    /// Connections accepted so far (on every listener); also the number of
    /// the next one.
    accepted: AtomicU64,
    /// Numbers the armings of [`FaultProxy::stall_requests`].
    stalls: AtomicU64,
    /// What the current arming holds back, and how it tells a request.
    stalled: Mutex<Vec<StalledRequest>>,
    is_request: RequestFilter,
    /// Whether to note when each chunk of the server's was read.
    recording: AtomicBool,
    replies: Mutex<Vec<i64>>,
    last_activity: AtomicI64,
    /// When each client connection's reading side ended (EOF or error), in
    /// µs of [`monotonic_us`].
    client_closes: Mutex<Vec<i64>>,
}

impl Shared {
    fn stalled(&self) -> std::sync::MutexGuard<'_, Vec<StalledRequest>> {
        self.stalled.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn replies(&self) -> std::sync::MutexGuard<'_, Vec<i64>> {
        self.replies.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A TCP proxy to one upstream server (or to several, one listening port
/// each: [`start_many`](FaultProxy::start_many)) whose behaviour ([`Mode`])
/// can be switched while it runs; see the [module docs](self).
#[derive(Debug)]
pub struct FaultProxy {
    addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl FaultProxy {
    /// Listen on a free port of 127.0.0.1 and forward to `upstream`, in
    /// [`Mode::Pass`].
    ///
    /// # Panics
    ///
    /// If no local port can be bound.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        Self::start_many(&[upstream]).await
    }

    /// One proxy for the link of one client to several servers (the members
    /// of a cluster): it listens on a free port of 127.0.0.1 for each of
    /// `upstreams` ([`addrs`](FaultProxy::addrs), in the same order) and
    /// forwards each port's connections to its upstream. Everything else —
    /// the mode, resets, stalls, counts, recorded replies — concerns all
    /// the ports together.
    ///
    /// # Panics
    ///
    /// If no local port can be bound.
    pub async fn start_many(upstreams: &[SocketAddr]) -> FaultProxy {
        let shared = Arc::new(Shared {
            state: watch::Sender::new(State {
                mode: Mode::Pass,
                stuck_below: 0,
                stall: None,
            }),
            reset: Notify::new(),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            stalled: Mutex::new(Vec::new()),
            is_request: RequestFilter::default(),
            recording: AtomicBool::new(false),
            replies: Mutex::new(Vec::new()),
            last_activity: AtomicI64::new(0),
            client_closes: Mutex::new(Vec::new()),
        });
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for &upstream in upstreams {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind a local port");
            addrs.push(listener.local_addr().expect("local address"));
            let accept = shared.clone();
            tasks.push(tokio::spawn(async move {
                let mut connections = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok((client, _)) => {
                                let id = accept.accepted.fetch_add(1, Ordering::Relaxed);
                                connections.spawn(connection(client, upstream, id, accept.clone()));
                            }
                            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                        },
                        Some(_) = connections.join_next(), if !connections.is_empty() => {}
                    }
                }
            }));
        }
        FaultProxy {
            addrs,
            shared,
            tasks,
        }
    }

    /// The address to connect to instead of the server's.
    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// The addresses to connect to instead of the servers', one per
    /// upstream given to [`start_many`](FaultProxy::start_many).
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.state.borrow().mode
    }

    /// Switch the mode; applies to open connections at once (except those
    /// black-holed for good by [`black_hole_open`](FaultProxy::black_hole_open)).
    pub fn set_mode(&self, mode: Mode) {
        self.shared.state.send_modify(|state| state.mode = mode);
    }

    /// Black-hole every connection open now, for good, whatever the mode
    /// (see the [module docs](self#black-holing-only-the-open-connections));
    /// connections accepted afterwards follow the mode. Returns how many
    /// connections were open.
    pub fn black_hole_open(&self) -> usize {
        let next = self.shared.accepted.load(Ordering::Relaxed);
        self.shared
            .state
            .send_modify(|state| state.stuck_below = state.stuck_below.max(next));
        self.connections()
    }

    /// Arm every connection open now: the next chunk from a client on one of
    /// them for which `is_request` is true, and all that client sends after
    /// it on that connection, are held back until
    /// [`deliver_stalled`](FaultProxy::deliver_stalled)
    /// (see the [module docs](self#stalling-the-next-request)). Returns how
    /// many connections were open. Arming again replaces the arming before
    /// (whatever it held is delivered).
    pub fn stall_requests(
        &self,
        is_request: impl Fn(&[u8]) -> bool + Send + Sync + 'static,
    ) -> usize {
        let generation = self.shared.stalls.fetch_add(1, Ordering::Relaxed) + 1;
        let below = self.shared.accepted.load(Ordering::Relaxed);
        self.shared.stalled().clear();
        self.shared.is_request.set(Arc::new(is_request));
        self.shared.state.send_modify(|state| {
            state.stall = Some(Stall { generation, below });
        });
        self.connections()
    }

    /// Deliver what the arming of [`stall_requests`](FaultProxy::stall_requests)
    /// held back (in order) and disarm it; returns what was held: nothing,
    /// or the one connection whose request was stalled.
    pub fn deliver_stalled(&self) -> Vec<StalledRequest> {
        let held = std::mem::take(&mut *self.shared.stalled());
        self.shared.state.send_modify(|state| state.stall = None);
        held
    }

    /// From now on, note when each chunk the server sends is read (see
    /// [`last_reply_between`](FaultProxy::last_reply_between)).
    pub fn record_replies(&self) {
        self.shared.recording.store(true, Ordering::Relaxed);
    }

    /// The last instant in `[from, to]` (µs, [`crate::monotonic_us`])
    /// at which the proxy read a chunk from the server, on any connection;
    /// `None` if none (or [`record_replies`](FaultProxy::record_replies) was
    /// not called).
    pub fn last_reply_between(&self, from: i64, to: i64) -> Option<i64> {
        self.shared
            .replies()
            .iter()
            .copied()
            .filter(|&t| from <= t && t <= to)
            .max()
    }

    /// When the proxy last read a chunk from either side
    /// ([`crate::monotonic_us`]; 0 if never).
    pub fn last_activity_us(&self) -> i64 {
        self.shared.last_activity.load(Ordering::Relaxed)
    }

    /// How many connections the proxy has accepted since it started.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Close every open connection abruptly (RST to both sides); returns how
    /// many there were. New connections are accepted as usual afterwards.
    pub fn reset(&self) -> usize {
        let open = self.connections();
        self.shared.reset.notify_waiters();
        open
    }

    /// When client connections stopped sending (EOF or error: the client
    /// closed them, or its process died) within `[from, to]`, in µs of
    /// [`monotonic_us`]. A killed process's connections close when it dies,
    /// so the latest of these that follows a SIGKILL is no earlier than its
    /// death, and the server cannot have seen them close before.
    pub fn client_closes_between(&self, from: i64, to: i64) -> Vec<i64> {
        self.shared
            .client_closes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .filter(|t| (from..=to).contains(t))
            .collect()
    }

    /// How many connections are open through the proxy.
    pub fn connections(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting an accept task drops its `JoinSet`, which aborts every connection.
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Counts an open connection while it lives.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `SO_LINGER` 0 on a socket that is about to be dropped: the close then
/// sends an RST at once. (Tokio deprecates `set_linger` because a *non-zero*
/// linger makes the drop block; a zero one does not.)
#[allow(deprecated)]
fn rst_on_close(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

async fn connection(mut client: TcpStream, upstream: SocketAddr, id: u64, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::Relaxed);
    let _open = Open(shared.clone());
    let reset = shared.reset.notified();
    tokio::pin!(reset);
    reset.as_mut().enable();
    // In a black hole, wait for the partition to heal before connecting.
    let mut state = shared.state.subscribe();
    let connect = async {
        let _ = state.wait_for(|s| s.mode_of(id) != Mode::BlackHole).await;
        TcpStream::connect(upstream).await
    };
    let mut server = tokio::select! {
        server = connect => match server {
            Ok(server) => server,
            Err(_) => return,
        },
        () = reset.as_mut() => {
            rst_on_close(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let was_reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        tokio::select! {
            () = pump(client_read, server_write, id, Direction::Up, &shared) => false,
            () = pump(server_read, client_write, id, Direction::Down, &shared) => false,
            () = reset.as_mut() => true,
        }
    };
    if was_reset {
        // SO_LINGER 0: closing sends an RST instead of a FIN.
        rst_on_close(&client);
        rst_on_close(&server);
    }
    // Dropping both streams closes them.
}

/// Which way a [`pump`] forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// From the client to the server: requests, which a stall holds back.
    Up,
    /// From the server to the client: replies, whose times may be noted.
    Down,
}

/// Forward one direction of connection number `id` until the reading side
/// ends or the writing side fails.
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    id: u64,
    direction: Direction,
    shared: &Shared,
) {
    // Each chunk: when to write it, and the stall that holds it back, if any.
    type Chunk = (Instant, Vec<u8>, Option<u64>);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Chunk>();
    let state = shared.state.subscribe();
    let read_state = state.clone();
    let read = async move {
        let mut buf = vec![0; 16 * 1024];
        // The stall that this connection has run into (it holds everything after).
        let mut stalled_by: Option<u64> = None;
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let now_us = monotonic_us();
            shared.last_activity.store(now_us, Ordering::Relaxed);
            let current = *read_state.borrow();
            let at = Instant::now() + current.mode_of(id).delay();
            let mut held = None;
            match direction {
                Direction::Down => {
                    if shared.recording.load(Ordering::Relaxed) {
                        shared.replies().push(now_us);
                    }
                }
                Direction::Up => {
                    if let Some(stall) = current.stall.filter(|s| id < s.below) {
                        let mut stalled = shared.stalled();
                        if stalled_by == Some(stall.generation) {
                            held = stalled_by;
                            if let Some(r) = stalled.iter_mut().find(|r| r.connection == id) {
                                r.bytes.extend_from_slice(&buf[..n]);
                            }
                        } else if stalled.is_empty() && shared.is_request.matches(&buf[..n]) {
                            // The first request of this arming, on any connection.
                            stalled_by = Some(stall.generation);
                            held = stalled_by;
                            stalled.push(StalledRequest {
                                connection: id,
                                first_at_us: now_us,
                                bytes: buf[..n].to_vec(),
                            });
                        }
                    }
                }
            }
            if tx.send((at, buf[..n].to_vec(), held)).is_err() {
                return;
            }
        }
        if direction == Direction::Up {
            shared
                .client_closes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(monotonic_us());
        }
    };
    let write = async move {
        let mut state = state;
        while let Some((at, bytes, held)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            let free = |s: &State| {
                s.mode_of(id) != Mode::BlackHole
                    && (held.is_none() || s.stall.map(|s| s.generation) != held)
            };
            if state.wait_for(free).await.is_err() {
                return;
            }
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        // The reading side ended and everything read was delivered.
        let _ = to.shutdown().await;
    };
    // Reading ends first (EOF); writing then drains what is queued.
    tokio::join!(read, write);
}
