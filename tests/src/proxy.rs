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
//! # let _ = cut; }
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
//! [`reset`](FaultProxy::reset) closes every open connection abruptly on both
//! sides (`SO_LINGER` 0, so each side gets a TCP RST, not a FIN), whatever the
//! mode. The server's side ending (for example a killed session) ends the
//! client's side too, with whatever was still held back.
//!
//! Dropping the proxy stops it and cuts every connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

#[derive(Debug)]
struct Shared {
    mode: watch::Sender<Mode>,
    /// Notified (all waiters) on [`FaultProxy::reset`].
    reset: Notify,
    open: AtomicUsize,
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
            mode: watch::Sender::new(Mode::Pass),
            reset: Notify::new(),
            open: AtomicUsize::new(0),
            upstream,
        });
        let accept = shared.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => {
                            connections.spawn(connection(client, accept.clone()));
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
        *self.shared.mode.borrow()
    }

    /// Switch the mode; applies to open connections at once.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
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

async fn connection(mut client: TcpStream, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::Relaxed);
    let _open = Open(shared.clone());
    let reset = shared.reset.notified();
    tokio::pin!(reset);
    reset.as_mut().enable();
    // In a black hole, wait for the partition to heal before connecting.
    let mut mode = shared.mode.subscribe();
    let connect = async {
        let _ = mode.wait_for(|m| *m != Mode::BlackHole).await;
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
            () = pump(client_read, server_write, shared.mode.subscribe()) => false,
            () = pump(server_read, client_write, shared.mode.subscribe()) => false,
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

/// Forward one direction until the reading side ends or the writing side fails.
async fn pump(mut from: ReadHalf<'_>, mut to: WriteHalf<'_>, mode: watch::Receiver<Mode>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read_mode = mode.clone();
    let read = async move {
        let mut buf = vec![0; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let at = Instant::now() + read_mode.borrow().delay();
            if tx.send((at, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let write = async move {
        let mut mode = mode;
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if mode.wait_for(|m| *m != Mode::BlackHole).await.is_err() {
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
