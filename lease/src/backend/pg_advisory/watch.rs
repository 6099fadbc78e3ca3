//! The watch of a held lock's connection, for [`Backend::lost`]: the holder
//! learns that its session ended in milliseconds, not at the next heartbeat.
//!
//! [`Backend::lost`]: crate::Backend::lost

use std::future::Future;
use std::sync::Weak;
use std::task::{Context, Poll};

use sqlx::postgres::PgListener;

use super::{HeldLock, SessionConn};
use crate::Error;

/// Resolves when the session of `lock`'s watched connection ends (the
/// server's termination, the socket closed or reset), or the lock ends.
/// It polls sqlx's `try_recv` on the idle connection, under the lock's
/// state mutex: never while an operation has it out, which wakes this when
/// it puts it back ([`HeldLock::put_back`]), since its reads took the
/// socket's wake-up. A session that ended is closed and the lock ended.
pub(super) fn session_end(
    lock: Weak<HeldLock>,
    name: String,
    holder: String,
) -> impl Future<Output = ()> + Send + 'static {
    std::future::poll_fn(move |cx| {
        let Some(lock) = lock.upgrade() else {
            return Poll::Ready(());
        };
        let mut state = lock.state();
        if state.ended {
            return Poll::Ready(());
        }
        let ended = match state.conn.as_deref_mut() {
            Some(SessionConn::Watched(listener)) => poll_session(listener, cx),
            // Not watched (a clone `with_watch(false)` took it), or out.
            _ => Poll::Pending,
        };
        let Poll::Ready(why) = ended else {
            if !state.watchers.iter().any(|w| w.will_wake(cx.waker())) {
                state.watchers.push(cx.waker().clone());
            }
            return Poll::Pending;
        };
        drop(state);
        let pid = lock.pid;
        tracing::debug!(lease.name = name, holder, pid, "advisory lock lost: {why}");
        drop(lock.end());
        Poll::Ready(())
    })
}

/// One look at an idle watched connection: `Ready` with why once its
/// session has ended. Nothing is sent; a notification is read and ignored.
fn poll_session(listener: &mut PgListener, cx: &mut Context<'_>) -> Poll<String> {
    loop {
        return match std::pin::pin!(listener.try_recv()).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(_))) => continue,
            Poll::Ready(Ok(None)) => Poll::Ready("the server closed its connection".to_owned()),
            Poll::Ready(Err(e)) => {
                Poll::Ready(format!("its connection failed: {}", Error::from(e).chain()))
            }
        };
    }
}
