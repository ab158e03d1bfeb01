//! The server's TCP connections, bounded so that an operator's bad day (a client that opens
//! connections and never speaks, a service manager's 1024-descriptor limit) cannot starve the
//! runtime: the descriptor limit is raised at start-up, open connections are capped, a
//! connection that sends nothing for a while is closed, and an accept loop that runs out of
//! descriptors backs off and says so instead of spinning.
//!
//! [`Listener::incoming`] is the stream of accepted connections that the gRPC server serves.
//! Each is a [`Connection`]: the `TcpStream` with a slot in the [`Registry`], which knows
//! which connections have never sent a byte. When the cap is reached, or the process runs out
//! of descriptors, the oldest connection that never spoke is closed to make room; a live
//! client speaks within milliseconds of connecting, so only silent ones are ever chosen.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// The first pause after an accept failed for want of descriptors; it doubles up to
/// [`ACCEPT_BACKOFF_MAX`] while the failures go on.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// The process's open-files limit before and after [`raise_descriptor_limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescriptorLimit {
    /// The soft limit the process started with.
    pub soft_before: u64,
    /// The soft limit now: the hard limit, if raising it worked.
    pub soft: u64,
    /// The hard limit, which only a privileged process can raise.
    pub hard: u64,
}

/// Raises the soft limit on open files to the hard limit (service managers commonly start a
/// process at 1024 soft, 524288 hard), and reports both.
///
/// # Errors
/// When the limits cannot be read or set.
pub fn raise_descriptor_limit() -> io::Result<DescriptorLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; RLIMIT_NOFILE is a valid resource.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let soft_before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own; the soft limit does not exceed the hard.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(DescriptorLimit {
        soft_before,
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    })
}

/// How many connections to allow when `--max-connections` is 0: what the descriptor limit
/// leaves after `reserved` descriptors for the database pool, files and the runtime, and at
/// most 65536.
pub fn connections_for(limit: &DescriptorLimit, reserved: u64) -> usize {
    let spare = limit.soft.saturating_sub(reserved).clamp(16, 65_536);
    usize::try_from(spare).unwrap_or(65_536)
}

/// How the listener bounds its connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// The most connections open at once; beyond it, the oldest silent one is closed or the
    /// new one refused.
    pub max_connections: usize,
    /// A connection from which nothing was read for this long is closed. Live HTTP/2 clients
    /// answer the server's keepalive pings, so only silent or dead peers reach it.
    pub idle_timeout: Duration,
}

/// The open connections, by the order they were accepted.
#[derive(Debug, Default)]
pub struct Registry {
    /// Open connections: accept sequence number → slot.
    open: Mutex<BTreeMap<u64, Arc<Slot>>>,
    /// The next sequence number.
    next: AtomicU64,
    /// Whether the connection cap is being hit now (to log once per episode).
    at_cap: AtomicBool,
}

/// What the registry knows of one connection.
#[derive(Debug)]
struct Slot {
    /// The socket's descriptor, for closing a silent connection from outside its task. Valid
    /// while the slot is in the registry: [`Connection`] removes it before the socket closes.
    fd: i32,
    /// Set once the peer sent its first byte.
    spoke: AtomicBool,
}

impl Registry {
    /// How many connections are open now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Slot>>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn add(self: &Arc<Self>, stream: &TcpStream) -> (u64, Arc<Slot>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            fd: stream.as_raw_fd(),
            spoke: AtomicBool::new(false),
        });
        self.lock().insert(id, slot.clone());
        (id, slot)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Closes the oldest connection that has never sent a byte, if there is one: shuts its
    /// socket down, so that the task serving it reads end-of-file and drops it. `true` when
    /// one was closed.
    fn close_oldest_silent(&self) -> bool {
        let open = self.lock();
        let Some((&id, slot)) = open
            .iter()
            .find(|(_, slot)| !slot.spoke.load(Ordering::Acquire))
        else {
            return false;
        };
        // Marked as if it spoke, so that it is not chosen twice before its task drops it.
        slot.spoke.store(true, Ordering::Release);
        // SAFETY: the descriptor belongs to a socket still open: its Connection removes the
        // slot (under this lock, which we hold) before the socket is closed, so the number
        // cannot have been reused. shutdown() does not close the descriptor.
        unsafe {
            libc::shutdown(slot.fd, libc::SHUT_RDWR);
        }
        tracing::debug!(connection = id, "closed a connection that never spoke");
        true
    }
}

/// An accepted connection: the socket, its slot in the registry and its idle timer.
pub struct Connection {
    stream: TcpStream,
    id: u64,
    slot: Arc<Slot>,
    registry: Arc<Registry>,
    /// Fires when nothing was read for `idle_timeout` (re-armed lazily, see `poll_read`).
    idle: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    last_read: Instant,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Before the socket field closes its descriptor: see Slot::fd.
        self.registry.remove(self.id);
    }
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last_read = Instant::now();
                    if !self.slot.spoke.load(Ordering::Relaxed) {
                        self.slot.spoke.store(true, Ordering::Release);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                // The timer is set once per idle period, not per read: when it fires after a
                // read moved `last_read`, it is set again to the new end.
                loop {
                    let end = self.last_read + self.idle_timeout;
                    if self.idle.deadline() != end {
                        self.idle.as_mut().reset(end);
                    }
                    match self.idle.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(()) if Instant::now() >= self.last_read + self.idle_timeout => {
                            tracing::debug!(
                                connection = self.id,
                                idle = ?self.idle_timeout,
                                "closing a connection that sent nothing"
                            );
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "the connection sent nothing for the idle timeout",
                            )));
                        }
                        Poll::Ready(()) => {}
                    }
                }
            }
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A listener whose accepted connections are bounded by [`ConnectionLimits`].
pub struct Listener {
    listener: TcpListener,
    limits: ConnectionLimits,
    registry: Arc<Registry>,
}

impl Listener {
    /// Bounds the connections `listener` accepts.
    pub fn new(listener: TcpListener, limits: ConnectionLimits) -> Listener {
        Listener {
            listener,
            limits,
            registry: Arc::default(),
        }
    }

    /// The open connections (for tests and metrics).
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The accepted connections, as a stream for the gRPC server; ends when the server drops
    /// it (which closes the listening socket).
    pub fn incoming(self) -> impl tokio_stream::Stream<Item = io::Result<Connection>> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut backoff = Backoff::default();
            loop {
                let stream = tokio::select! {
                    () = tx.closed() => return,
                    accepted = backoff.accept(&self.listener, Some(&self.registry)) => accepted,
                };
                let Some(connection) = self.admit(stream) else {
                    continue;
                };
                if tx.send(Ok(connection)).await.is_err() {
                    return;
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }

    /// Registers an accepted socket, making room under the cap by closing the oldest silent
    /// connection, or refusing the new one when every open connection is live.
    fn admit(&self, stream: TcpStream) -> Option<Connection> {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let open = self.registry.len();
        if open >= self.limits.max_connections {
            let made_room = self.registry.close_oldest_silent();
            if !self.registry.at_cap.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    max_connections = self.limits.max_connections,
                    open,
                    "connection limit reached: closing connections that never spoke, \
                     refusing new ones while every open connection is live (--max-connections)"
                );
            }
            if !made_room {
                return None; // dropping the socket refuses it
            }
        } else if open < self.limits.max_connections * 9 / 10
            && self.registry.at_cap.swap(false, Ordering::AcqRel)
        {
            tracing::info!(open, "connections below the limit again");
        }
        let (id, slot) = self.registry.add(&stream);
        let now = Instant::now();
        Some(Connection {
            stream,
            id,
            slot,
            registry: self.registry.clone(),
            idle: Box::pin(tokio::time::sleep_until(now + self.limits.idle_timeout)),
            idle_timeout: self.limits.idle_timeout,
            last_read: now,
        })
    }
}

/// How long accepts must go without running out of descriptors before an episode counts as
/// over (and the next shortage is warned of again).
const EPISODE_QUIET: Duration = Duration::from_secs(10);

/// Accepts with a back-off when the process (or the system) is out of descriptors or memory,
/// logging at WARN once per such episode.
#[derive(Debug, Default)]
pub struct Backoff {
    /// The current pause; zero when the last accept succeeded.
    pause: Duration,
    /// When an accept last failed for want of descriptors, while the episode lasts.
    last_shortage: Option<Instant>,
    /// Accepts that failed so in this episode.
    failures: u64,
}

impl Backoff {
    /// The next accepted connection. Errors that concern only the connection being accepted
    /// (it was reset before we took it) are skipped; running out of descriptors makes room
    /// through `registry` when it can (closing a silent connection), and pauses.
    pub async fn accept(
        &mut self,
        listener: &TcpListener,
        registry: Option<&Registry>,
    ) -> TcpStream {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    self.pause = Duration::ZERO;
                    if self
                        .last_shortage
                        .is_some_and(|at| at.elapsed() >= EPISODE_QUIET)
                    {
                        tracing::info!(
                            failed_accepts = self.failures,
                            "accepting connections again: descriptors suffice"
                        );
                        self.last_shortage = None;
                        self.failures = 0;
                    }
                    return stream;
                }
                Err(e) if out_of_resources(&e) => {
                    if self.last_shortage.is_none() {
                        tracing::warn!(
                            error = %e,
                            listen = ?listener.local_addr().ok(),
                            "cannot accept connections: out of file descriptors (raise the \
                             open-files limit, or lower --max-connections); closing connections \
                             that never spoke and retrying"
                        );
                    }
                    self.last_shortage = Some(Instant::now());
                    self.failures += 1;
                    self.pause = if self.pause.is_zero() {
                        ACCEPT_BACKOFF_MIN
                    } else {
                        (self.pause * 2).min(ACCEPT_BACKOFF_MAX)
                    };
                    if registry.is_some_and(Registry::close_oldest_silent) {
                        // The closed connection's task needs a moment to drop its socket.
                        self.pause = ACCEPT_BACKOFF_MIN;
                    }
                    tokio::time::sleep(self.pause).await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a connection failed while being accepted");
                }
            }
        }
    }
}

/// Whether an accept error means the process or system is out of descriptors or memory.
fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_automatic_cap_leaves_room_for_the_pool_and_stays_in_bounds() {
        let limit = |soft| DescriptorLimit {
            soft_before: soft,
            soft,
            hard: soft,
        };
        assert_eq!(connections_for(&limit(1024), 80), 944);
        assert_eq!(connections_for(&limit(50), 80), 16);
        assert_eq!(connections_for(&limit(10_000_000), 80), 65_536);
    }

    #[test]
    fn raising_the_limit_reaches_the_hard_limit() {
        let limit = raise_descriptor_limit().expect("getrlimit");
        assert_eq!(limit.soft, limit.hard);
        assert!(limit.soft >= limit.soft_before);
    }
}
