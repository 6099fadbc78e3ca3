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
//! # let _ = (cut, stuck); }
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
//! [`reset`](FaultProxy::reset) closes every open connection abruptly on both
//! sides (`SO_LINGER` 0, so each side gets a TCP RST, not a FIN), whatever the
//! mode. The server's side ending (for example a killed session) ends the
//! client's side too, with whatever was still held back.
//!
//! Dropping the proxy stops it and cuts every connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

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

/// What every connection watches: the mode, and which connections are
/// black-holed for good whatever the mode.
#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    /// Connections numbered below this are black-holed for good
    /// ([`FaultProxy::black_hole_open`]).
    stuck_below: u64,
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
    /// Connections accepted so far; also the number of the next one.
    accepted: AtomicU64,
    upstream: SocketAddr,
}

/// A TCP proxy to one upstream server whose behaviour ([`Mode`]) can be
/// switched while it runs; see the [module docs](self).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listen on a free port of 127.0.0.1 and forward to `upstream`, in
    /// [`Mode::Pass`].
    ///
    /// # Panics
    ///
    /// If no local port can be bound.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let addr = listener.local_addr().expect("local address");
        let shared = Arc::new(Shared {
            state: watch::Sender::new(State {
                mode: Mode::Pass,
                stuck_below: 0,
            }),
            reset: Notify::new(),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            upstream,
        });
        let accept = shared.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => {
                            let id = accept.accepted.fetch_add(1, Ordering::Relaxed);
                            connections.spawn(connection(client, id, accept.clone()));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        FaultProxy { addr, shared, task }
    }

    /// The address to connect to instead of the server's.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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

    /// How many connections are open through the proxy.
    pub fn connections(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its `JoinSet`, which aborts every connection.
        self.task.abort();
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

async fn connection(mut client: TcpStream, id: u64, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::Relaxed);
    let _open = Open(shared.clone());
    let reset = shared.reset.notified();
    tokio::pin!(reset);
    reset.as_mut().enable();
    // In a black hole, wait for the partition to heal before connecting.
    let mut state = shared.state.subscribe();
    let connect = async {
        let _ = state.wait_for(|s| s.mode_of(id) != Mode::BlackHole).await;
        TcpStream::connect(shared.upstream).await
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
            () = pump(client_read, server_write, id, shared.state.subscribe()) => false,
            () = pump(server_read, client_write, id, shared.state.subscribe()) => false,
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

/// Forward one direction of connection number `id` until the reading side
/// ends or the writing side fails.
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    id: u64,
    state: watch::Receiver<State>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read_state = state.clone();
    let read = async move {
        let mut buf = vec![0; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let at = Instant::now() + read_state.borrow().mode_of(id).delay();
            if tx.send((at, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let write = async move {
        let mut state = state;
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if state
                .wait_for(|s| s.mode_of(id) != Mode::BlackHole)
                .await
                .is_err()
            {
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
