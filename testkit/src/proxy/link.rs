//! One proxied connection: the two pumps (client → PostgreSQL and back) and how each fault
//! the [`Proxy`](super::Proxy) arms acts on them (latency, blackhole, resets, cuts).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};

use super::wire::{Backend, Frontend};
use super::{Carried, Direction, Phase, Shared};

/// How a connection ended.
enum End {
    /// One side closed or failed: close the other side too, gently.
    Closed,
    /// `reset_all`: RST both sides.
    Reset,
    /// An armed cut: RST both sides.
    Cut,
}

/// Per-connection flags the two directions share (one task polls both, but the task must be
/// `Send`, hence atomics rather than cells).
#[derive(Default)]
pub(super) struct Link {
    /// The client asked for TLS: the server's first answer is one untagged byte.
    pub(super) ssl_requested: AtomicBool,
    /// The response to a write statement is being swallowed until its `ReadyForQuery`.
    cut_pending: AtomicBool,
    /// Where the connection is ([`Phase`] as `u8`); `Startup` at first.
    phase: std::sync::atomic::AtomicU8,
}

impl Link {
    fn phase(&self) -> Phase {
        Phase::ALL[usize::from(self.phase.load(Ordering::SeqCst))]
    }

    pub(super) fn enter(&self, phase: Phase) {
        self.phase
            .store(u8::try_from(phase.index()).unwrap_or(0), Ordering::SeqCst);
    }

    /// Counts a cut of this connection in its current phase.
    fn cut(&self, shared: &Shared) {
        shared.connection_cuts.fetch_add(1, Ordering::Relaxed);
        shared.cuts_by_phase[self.phase().index()].fetch_add(1, Ordering::Relaxed);
    }
}

pub(super) async fn serve_connection(shared: Arc<Shared>, mut client: TcpStream) {
    let mut reset = shared.reset_epoch.subscribe();
    reset.borrow_and_update();
    let _ = client.set_nodelay(true);
    if shared.close_at_accept.load(Ordering::SeqCst) {
        shared.closed_at_accept.fetch_add(1, Ordering::Relaxed);
        close_at_once(client).await;
        return;
    }
    // A partitioned link connects to nothing: hold the client until the blackhole ends.
    tokio::select! {
        () = wait_open(&shared) => {}
        _ = reset.changed() => {
            rst(&client);
            return;
        }
    }
    let Ok(mut upstream) = TcpStream::connect(shared.upstream()).await else {
        rst(&client);
        return;
    };
    let _ = upstream.set_nodelay(true);
    let link = Link::default();
    let end = {
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        tokio::select! {
            end = to_server(&shared, &link, client_read, upstream_write) => end,
            end = to_client(&shared, &link, upstream_read, client_write) => end,
            _ = reset.changed() => {
                shared.resets.fetch_add(1, Ordering::Relaxed);
                End::Reset
            }
        }
    };
    match end {
        End::Closed => {
            let _ = client.shutdown().await;
            let _ = upstream.shutdown().await;
        }
        End::Reset | End::Cut => {
            rst(&client);
            rst(&upstream);
        }
    }
}

/// Closing a socket with `SO_LINGER` 0 sends an RST instead of a FIN.
fn rst(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Ends a connection nothing was answered on with a FIN, as a proxy without a backend does:
/// what the client sent is read and dropped (a socket closed with unread data sends an RST
/// instead), until the client closes too or a second passes.
async fn close_at_once(mut client: TcpStream) {
    let _ = client.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

async fn wait_open(shared: &Shared) {
    let mut blackhole = shared.blackhole.subscribe();
    let _ = blackhole.wait_for(|on| !*on).await;
}

/// Waits as the current faults say before a chunk may go on.
async fn delay(shared: &Shared) {
    let us = shared.latency_us.load(Ordering::SeqCst);
    if us > 0 {
        tokio::time::sleep(Duration::from_micros(us)).await;
    }
    wait_open(shared).await;
}

/// One direction of a connection: where bytes come from and go, and what its cuts count.
struct Pump<'a> {
    shared: &'a Shared,
    link: &'a Link,
    carried: Carried,
    from: ReadHalf<'a>,
    to: WriteHalf<'a>,
    buf: Vec<u8>,
}

impl<'a> Pump<'a> {
    fn new(
        shared: &'a Shared,
        link: &'a Link,
        direction: Direction,
        from: ReadHalf<'a>,
        to: WriteHalf<'a>,
    ) -> Pump<'a> {
        Pump {
            shared,
            link,
            carried: Carried::new(shared, direction),
            from,
            to,
            buf: vec![0u8; 64 * 1024],
        }
    }

    /// Reads the next chunk into `buf` and returns its length, or how the connection ends:
    /// closed by either side, or cut by [`Proxy::cut_each_connection_after`](super::Proxy)
    /// once the part it admits was forwarded.
    async fn next_chunk(&mut self) -> Result<usize, End> {
        let n = match self.from.read(&mut self.buf).await {
            Ok(0) | Err(_) => return Err(End::Closed),
            Ok(n) => n,
        };
        let (allowed, cut) = self.carried.admit(self.shared, n);
        if cut {
            delay(self.shared).await;
            if allowed > 0 && self.to.write_all(&self.buf[..allowed]).await.is_err() {
                return Err(End::Closed);
            }
            self.link.cut(self.shared);
            return Err(End::Cut);
        }
        Ok(n)
    }
}

/// Client → PostgreSQL.
async fn to_server(shared: &Shared, link: &Link, from: ReadHalf<'_>, to: WriteHalf<'_>) -> End {
    let mut frontend = Frontend::default();
    let mut pump = Pump::new(shared, link, Direction::ToServer, from, to);
    loop {
        let n = match pump.next_chunk().await {
            Ok(n) => n,
            Err(end) => return end,
        };
        let chunk = &pump.buf[..n];
        let writes = frontend.feed(chunk, link);
        delay(shared).await;
        // Armed before the statement leaves, so its response cannot slip past.
        if writes > 0
            && shared
                .cut_writes
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                })
                .is_ok()
        {
            link.cut_pending.store(true, Ordering::SeqCst);
        }
        if pump.to.write_all(chunk).await.is_err() {
            return End::Closed;
        }
    }
}

/// PostgreSQL → client.
async fn to_client(shared: &Shared, link: &Link, from: ReadHalf<'_>, to: WriteHalf<'_>) -> End {
    let mut backend = Backend::default();
    let mut pump = Pump::new(shared, link, Direction::ToClient, from, to);
    loop {
        let n = match pump.next_chunk().await {
            Ok(n) => n,
            Err(end) => return end,
        };
        let chunk = &pump.buf[..n];
        let ready = backend.feed(chunk, link);
        if link.cut_pending.load(Ordering::SeqCst) {
            // The write's response, swallowed whole; its ReadyForQuery comes after the commit.
            if ready > 0 {
                shared.commit_cuts.fetch_add(1, Ordering::Relaxed);
                return End::Cut;
            }
            continue;
        }
        let mut allowed = n;
        let mut cut = false;
        let _ = shared
            .cut_after_bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                if left < 0 {
                    return None;
                }
                let left_bytes = usize::try_from(left).unwrap_or(usize::MAX);
                if left_bytes >= n {
                    allowed = n;
                    cut = false;
                    Some(left - i64::try_from(n).unwrap_or(i64::MAX))
                } else {
                    allowed = left_bytes;
                    cut = true;
                    Some(-1)
                }
            });
        delay(shared).await;
        if allowed > 0 && pump.to.write_all(&chunk[..allowed]).await.is_err() {
            return End::Closed;
        }
        if cut {
            shared.byte_cuts.fetch_add(1, Ordering::Relaxed);
            return End::Cut;
        }
    }
}
