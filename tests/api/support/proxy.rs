//! A TCP proxy on `127.0.0.1:0` that forwards to PostgreSQL and injects faults into the link on
//! demand, switchable while traffic flows:
//!
//! - [`Proxy::set_latency`]: every chunk, in both directions, waits that long before it is
//!   forwarded (order is kept, so a slow link, not a reordering one);
//! - [`Proxy::blackhole`]: nothing is forwarded and no new connection reaches the database
//!   while it is on; what was sent meanwhile is delivered when it ends, as TCP would after a
//!   partition heals within its retransmission timeout;
//! - [`Proxy::reset_all`]: every open connection is reset (both sockets closed with
//!   `SO_LINGER` 0, so both peers get an RST);
//! - [`Proxy::set_upstream`]: new connections go to another server (a promoted standby, as a
//!   moved DNS name or virtual IP would send them) and every open connection is reset
//!   ([`Proxy::redirect_new_connections`]: the open ones stay where they are);
//! - [`Proxy::cut_writes_at_commit`]: the next `n` write statements on `ledger_entries` reach
//!   PostgreSQL and run to their end (each is an autocommit statement, so it commits), but their
//!   response is swallowed, up to and including the `ReadyForQuery` that follows the commit, and
//!   then the connection is reset: the database did it, the server never hears so;
//! - [`Proxy::cut_after_server_bytes`]: the next `n` bytes from the server (whichever
//!   connections carry them) are forwarded, and the connection that would carry the next one is
//!   reset, usually in the middle of a message;
//! - [`Proxy::close_new_connections`]: every new connection is accepted and closed at once,
//!   before a byte is answered, without reaching PostgreSQL: what HAProxy, PgBouncer and cloud
//!   load balancers do while no backend is up;
//! - [`Proxy::refuse_connections`]: the proxy stops listening, so a connection is refused by
//!   the kernel (a TCP RST to the SYN), and listens on the same address again when it ends;
//! - [`Proxy::cut_each_connection_after`]: every connection is reset once it has carried `n`
//!   bytes in one direction (a new one counted from its first byte, an open one from the
//!   moment this was armed), until cleared: with `n` chosen to land in the answer to
//!   `SSLRequest`, the TLS handshake, the startup packet, authentication or a statement,
//!   every connection dies at that step.
//!
//! To tell write statements and their responses apart, the proxy follows the PostgreSQL wire
//! protocol's framing in both directions (startup and `SSLRequest` untagged, then one tag byte
//! and a length per message), remembers which prepared statements are writes (`Parse`) and
//! which portal runs which statement (`Bind`), and arms a cut at the `Sync` that ends a batch
//! containing an `Execute` of a write (or at a simple `Query` whose text is one).

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections reset by [`Proxy::reset_all`].
    pub resets: u64,
    /// Write statements whose response was swallowed after they committed.
    pub commit_cuts: u64,
    /// Connections cut after the armed number of server bytes.
    pub byte_cuts: u64,
    /// Connections closed at once by [`Proxy::close_new_connections`].
    pub closed_at_accept: u64,
    /// Connections cut by [`Proxy::cut_each_connection_after`].
    pub connection_cuts: u64,
}

/// Where a connection is in PostgreSQL's protocol, as the proxy has seen it: what a cut by
/// [`Proxy::cut_each_connection_after`] interrupted ([`Proxy::cuts_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The startup packet and PostgreSQL's answer to it, up to an authentication request;
    /// also after `AuthenticationOk`, up to the first `ReadyForQuery`.
    Startup,
    /// The client sent `SSLRequest`; PostgreSQL's one-byte answer has not passed.
    SslAnswer,
    /// PostgreSQL answered `S`: the rest is TLS, its handshake first.
    Tls,
    /// PostgreSQL asked for a password or a SASL exchange, and has not said
    /// `AuthenticationOk`.
    Authentication,
    /// Ready for queries: statements run.
    Ready,
}

impl Phase {
    const ALL: [Phase; 5] = [
        Phase::Startup,
        Phase::SslAnswer,
        Phase::Tls,
        Phase::Authentication,
        Phase::Ready,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// Which way bytes flow through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client (the ledger server) to PostgreSQL.
    ToServer,
    /// From PostgreSQL to the client.
    ToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::ToServer => 0,
            Direction::ToClient => 1,
        }
    }
}

/// A cut of every connection after a number of bytes in one direction, and which arming it
/// is (an open connection counts from the arming it last saw).
#[derive(Clone, Copy)]
struct EachCut {
    after: u64,
    armed: u64,
}

/// The switches and counters every connection of one proxy shares.
struct Shared {
    /// Where new connections go.
    upstream: std::sync::Mutex<SocketAddr>,
    /// Delay per forwarded chunk, in microseconds.
    latency_us: AtomicU64,
    /// `true` while nothing may pass.
    blackhole: watch::Sender<bool>,
    /// Bumped by `reset_all`; each connection resets when it changes.
    reset_epoch: watch::Sender<u64>,
    /// Write statements still to be cut at their commit.
    cut_writes: AtomicU64,
    /// Server bytes still to forward before a cut; negative when disarmed.
    cut_after_bytes: AtomicI64,
    /// New connections are closed at once.
    close_at_accept: AtomicBool,
    /// `true` while the proxy does not listen.
    refusing: watch::Sender<bool>,
    /// Per direction ([`Direction::index`]): the cut every connection meets, if armed.
    each_cut: [std::sync::Mutex<Option<EachCut>>; 2],
    /// How many times a cut of each connection was armed.
    each_cut_armings: AtomicU64,
    connections: AtomicU64,
    resets: AtomicU64,
    commit_cuts: AtomicU64,
    byte_cuts: AtomicU64,
    closed_at_accept: AtomicU64,
    connection_cuts: AtomicU64,
    /// [`Proxy::cut_each_connection_after`]'s cuts, by the [`Phase`] they interrupted.
    cuts_by_phase: [AtomicU64; 5],
}

impl Shared {
    fn upstream(&self) -> SocketAddr {
        *self
            .upstream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn each_cut(&self, direction: Direction) -> Option<EachCut> {
        *self.each_cut[direction.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What one direction of one connection counts toward [`Proxy::cut_each_connection_after`].
struct Carried {
    direction: Direction,
    /// The arming the count started from (0: none seen).
    armed: u64,
    bytes: u64,
}

impl Carried {
    /// For a connection starting now: armed cuts count its bytes from the first.
    fn new(shared: &Shared, direction: Direction) -> Carried {
        Carried {
            direction,
            armed: shared.each_cut(direction).map_or(0, |c| c.armed),
            bytes: 0,
        }
    }

    /// How many of the next `n` bytes may pass, and whether the connection is cut after them.
    fn admit(&mut self, shared: &Shared, n: usize) -> (usize, bool) {
        let Some(cut) = shared.each_cut(self.direction) else {
            return (n, false);
        };
        if cut.armed != self.armed {
            self.armed = cut.armed;
            self.bytes = 0;
        }
        let left = cut.after.saturating_sub(self.bytes);
        let n64 = u64::try_from(n).unwrap_or(u64::MAX);
        if n64 <= left {
            self.bytes += n64;
            // Exactly at the limit: the next byte cuts (a limit of 0 cuts at the first one).
            (n, false)
        } else {
            self.bytes = cut.after;
            (usize::try_from(left).unwrap_or(n), true)
        }
    }
}

/// A running proxy; dropping it stops accepting and resets every connection it carries.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            upstream: std::sync::Mutex::new(upstream),
            latency_us: AtomicU64::new(0),
            blackhole: watch::Sender::new(false),
            reset_epoch: watch::Sender::new(0),
            cut_writes: AtomicU64::new(0),
            cut_after_bytes: AtomicI64::new(-1),
            close_at_accept: AtomicBool::new(false),
            refusing: watch::Sender::new(false),
            each_cut: [std::sync::Mutex::new(None), std::sync::Mutex::new(None)],
            each_cut_armings: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            commit_cuts: AtomicU64::new(0),
            byte_cuts: AtomicU64::new(0),
            closed_at_accept: AtomicU64::new(0),
            connection_cuts: AtomicU64::new(0),
            cuts_by_phase: Default::default(),
        });
        let accept = tokio::spawn(accept_loop(shared.clone(), listener, addr));
        Proxy {
            addr,
            shared,
            accept,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A PostgreSQL URL (`postgres://user@host:port/db…`) rewritten to go through this proxy.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
        let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let userinfo = authority
            .rsplit_once('@')
            .map(|(user, _)| format!("{user}@"))
            .unwrap_or_default();
        format!("{scheme}://{userinfo}{}{tail}", self.addr)
    }

    /// Delays every chunk, in both directions, by `per_chunk` (zero for none).
    pub fn set_latency(&self, per_chunk: Duration) {
        let us = u64::try_from(per_chunk.as_micros()).unwrap_or(u64::MAX);
        self.shared.latency_us.store(us, Ordering::SeqCst);
    }

    /// Stops (`true`) or resumes (`false`) all forwarding and new connections.
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// Sends new connections to `upstream` from now on, and resets every connection open now
    /// (whichever server it reached): what clients see when a failover moves the address they
    /// connect to.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        // Before the reset: a connection that misses the reset reads the new address.
        self.redirect_new_connections(upstream);
        self.reset_all();
    }

    /// Sends new connections to `upstream` from now on, and leaves every open connection on
    /// the server it reached: what clients see when an address moves but a middlebox (or
    /// nothing at all) does not break the connections made before.
    pub fn redirect_new_connections(&self, upstream: SocketAddr) {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = upstream;
    }

    /// Where new connections go now.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream()
    }

    /// Resets every connection open now (new ones are not affected).
    pub fn reset_all(&self) {
        self.shared.reset_epoch.send_modify(|epoch| *epoch += 1);
    }

    /// Arms cuts of the next `n` write statements at their commit (replacing any still armed).
    pub fn cut_writes_at_commit(&self, n: u64) {
        self.shared.cut_writes.store(n, Ordering::SeqCst);
    }

    /// Write-statement cuts still armed.
    pub fn armed_write_cuts(&self) -> u64 {
        self.shared.cut_writes.load(Ordering::SeqCst)
    }

    /// Arms a cut after the next `n` bytes from the server (replacing one still armed).
    pub fn cut_after_server_bytes(&self, n: u64) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.shared.cut_after_bytes.store(n, Ordering::SeqCst);
    }

    /// Whether a byte cut is still armed.
    pub fn byte_cut_armed(&self) -> bool {
        self.shared.cut_after_bytes.load(Ordering::SeqCst) >= 0
    }

    /// Accepts every new connection and closes it at once (`true`), before anything reaches
    /// PostgreSQL, or forwards new connections again (`false`). Open connections are left
    /// alone. The client gets an orderly end of stream where it waits for PostgreSQL's first
    /// byte: sqlx reads it, after an `SSLRequest`, as the answer 0x00.
    pub fn close_new_connections(&self, on: bool) {
        self.shared.close_at_accept.store(on, Ordering::SeqCst);
    }

    /// Stops listening (`true`), so that connecting is refused by the kernel, or listens again
    /// on the same address (`false`). Open connections are left alone.
    pub fn refuse_connections(&self, on: bool) {
        self.shared.refusing.send_replace(on);
    }

    /// Resets every connection once it has carried `n` bytes in `direction`: a new one counted
    /// from its first byte, an open one from now; until [`Proxy::clear`] or
    /// [`Proxy::stop_cutting_each_connection`]. The `n` bytes are forwarded, then both sides
    /// get an RST; `n = 0` cuts at the first byte.
    pub fn cut_each_connection_after(&self, direction: Direction, n: u64) {
        let armed = self.shared.each_cut_armings.fetch_add(1, Ordering::SeqCst) + 1;
        *self.shared.each_cut[direction.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(EachCut { after: n, armed });
    }

    /// Disarms [`Proxy::cut_each_connection_after`] in both directions.
    pub fn stop_cutting_each_connection(&self) {
        for cut in &self.shared.each_cut {
            *cut.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
    }

    /// Turns every fault off: no latency, no blackhole, no cut armed, new connections accepted
    /// and forwarded.
    pub fn clear(&self) {
        self.set_latency(Duration::ZERO);
        self.shared.cut_writes.store(0, Ordering::SeqCst);
        self.shared.cut_after_bytes.store(-1, Ordering::SeqCst);
        self.stop_cutting_each_connection();
        self.close_new_connections(false);
        self.refuse_connections(false);
        self.blackhole(false);
    }

    /// How many connections [`Proxy::cut_each_connection_after`] cut in `phase`.
    pub fn cuts_at(&self, phase: Phase) -> u64 {
        self.shared.cuts_by_phase[phase.index()].load(Ordering::Relaxed)
    }

    /// Those cuts by phase, for failure messages.
    pub fn cuts_by_phase(&self) -> Vec<(Phase, u64)> {
        Phase::ALL.iter().map(|p| (*p, self.cuts_at(*p))).collect()
    }

    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            connections: s.connections.load(Ordering::Relaxed),
            resets: s.resets.load(Ordering::Relaxed),
            commit_cuts: s.commit_cuts.load(Ordering::Relaxed),
            byte_cuts: s.byte_cuts.load(Ordering::Relaxed),
            closed_at_accept: s.closed_at_accept.load(Ordering::Relaxed),
            connection_cuts: s.connection_cuts.load(Ordering::Relaxed),
        }
    }
}

/// Accepts connections on `listener` (bound to `addr`) and serves each; while the proxy
/// refuses connections, listens on nothing, and binds `addr` again after.
async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, addr: SocketAddr) {
    let mut refusing = shared.refusing.subscribe();
    let mut listener = Some(listener);
    loop {
        let refuse = *refusing.borrow_and_update();
        match (&listener, refuse) {
            // Closed: connecting is refused from now on.
            (Some(_), true) => listener = None,
            (None, false) => listener = Some(bind_again(addr).await),
            (None, true) => {
                if refusing.changed().await.is_err() {
                    return;
                }
            }
            (Some(open), false) => {
                tokio::select! {
                    accepted = open.accept() => {
                        let Ok((client, _)) = accepted else {
                            // EMFILE and friends: back off rather than spin.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        };
                        shared.connections.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(serve_connection(shared.clone(), client));
                    }
                    changed = refusing.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Binds `addr` again (the proxy's own port, free since it stopped listening there; a
/// short-lived socket may hold it a moment).
async fn bind_again(addr: SocketAddr) -> TcpListener {
    let mut tries = 0;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(e) if tries < 50 => {
                tries += 1;
                eprintln!("proxy: cannot listen on {addr} again yet ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the proxy cannot listen on {addr} again: {e}"),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.clear();
        self.reset_all();
    }
}

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
struct Link {
    /// The client asked for TLS: the server's first answer is one untagged byte.
    ssl_requested: AtomicBool,
    /// The response to a write statement is being swallowed until its `ReadyForQuery`.
    cut_pending: AtomicBool,
    /// Where the connection is ([`Phase`] as `u8`); `Startup` at first.
    phase: std::sync::atomic::AtomicU8,
}

impl Link {
    fn phase(&self) -> Phase {
        Phase::ALL[usize::from(self.phase.load(Ordering::SeqCst))]
    }

    fn enter(&self, phase: Phase) {
        self.phase
            .store(u8::try_from(phase.index()).unwrap_or(0), Ordering::SeqCst);
    }

    /// Counts a cut of this connection in its current phase.
    fn cut(&self, shared: &Shared) {
        shared.connection_cuts.fetch_add(1, Ordering::Relaxed);
        shared.cuts_by_phase[self.phase().index()].fetch_add(1, Ordering::Relaxed);
    }
}

async fn serve_connection(shared: Arc<Shared>, mut client: TcpStream) {
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

/// Client → PostgreSQL.
async fn to_server(
    shared: &Shared,
    link: &Link,
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
) -> End {
    let mut frontend = Frontend::default();
    let mut carried = Carried::new(shared, Direction::ToServer);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return End::Closed,
            Ok(n) => n,
        };
        let (allowed, cut) = carried.admit(shared, n);
        if cut {
            delay(shared).await;
            if allowed > 0 && to.write_all(&buf[..allowed]).await.is_err() {
                return End::Closed;
            }
            link.cut(shared);
            return End::Cut;
        }
        let chunk = &buf[..n];
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
        if to.write_all(chunk).await.is_err() {
            return End::Closed;
        }
    }
}

/// PostgreSQL → client.
async fn to_client(
    shared: &Shared,
    link: &Link,
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
) -> End {
    let mut backend = Backend::default();
    let mut carried = Carried::new(shared, Direction::ToClient);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return End::Closed,
            Ok(n) => n,
        };
        let (allowed, cut) = carried.admit(shared, n);
        if cut {
            delay(shared).await;
            if allowed > 0 && to.write_all(&buf[..allowed]).await.is_err() {
                return End::Closed;
            }
            link.cut(shared);
            return End::Cut;
        }
        let chunk = &buf[..n];
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
        if allowed > 0 && to.write_all(&chunk[..allowed]).await.is_err() {
            return End::Closed;
        }
        if cut {
            shared.byte_cuts.fetch_add(1, Ordering::Relaxed);
            return End::Cut;
        }
    }
}

/// Splits a byte stream into PostgreSQL messages.
#[derive(Default)]
struct Framer {
    buf: Vec<u8>,
}

impl Framer {
    /// Appends `data` and hands each complete message to `each` as (tag, body); `untagged`
    /// says whether the next message has no tag byte (startup phase).
    fn feed(
        &mut self,
        data: &[u8],
        mut untagged: impl FnMut() -> Untagged,
        mut each: impl FnMut(u8, &[u8]),
    ) {
        self.buf.extend_from_slice(data);
        let mut at = 0;
        loop {
            let rest = &self.buf[at..];
            let (tag, header) = match untagged() {
                Untagged::One => {
                    // A single byte answer (the server's reply to SSLRequest).
                    let Some(&b) = rest.first() else { break };
                    each(b, &[]);
                    at += 1;
                    continue;
                }
                Untagged::Length => (0u8, 4usize),
                Untagged::No => (rest.first().copied().unwrap_or(0), 5usize),
            };
            if rest.len() < header {
                break;
            }
            let len_at = header - 4;
            let len = u32::from_be_bytes([
                rest[len_at],
                rest[len_at + 1],
                rest[len_at + 2],
                rest[len_at + 3],
            ]) as usize;
            let total = len_at + len.max(4);
            if rest.len() < total {
                break;
            }
            each(tag, &rest[header..total]);
            at += total;
        }
        self.buf.drain(..at);
    }
}

enum Untagged {
    /// Tagged messages.
    No,
    /// A length-prefixed message without tag (startup, SSLRequest, CancelRequest).
    Length,
    /// One raw byte.
    One,
}

/// The client's side of the protocol, reduced to what the cuts need.
#[derive(Default)]
struct Frontend {
    framer: Framer,
    started: bool,
    /// Prepared statement name → whether it writes `ledger_entries`.
    statements: HashMap<String, bool>,
    /// Portal name → whether its statement writes.
    portals: HashMap<String, bool>,
    /// An `Execute` of a write since the last `Sync`.
    write_in_batch: bool,
}

impl Frontend {
    /// Feeds client bytes; returns how many write requests they completed (a `Sync` after an
    /// `Execute` of a write, or a simple `Query` of a write).
    fn feed(&mut self, data: &[u8], link: &Link) -> usize {
        let mut writes = 0;
        let Frontend {
            framer,
            started,
            statements,
            portals,
            write_in_batch,
        } = self;
        let started_flag = std::cell::Cell::new(*started);
        framer.feed(
            data,
            || {
                if started_flag.get() {
                    Untagged::No
                } else {
                    Untagged::Length
                }
            },
            |tag, body| {
                if !started_flag.get() {
                    // body: protocol version or request code, then parameters.
                    let code = body
                        .get(..4)
                        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(0);
                    match code {
                        80_877_103 => {
                            link.ssl_requested.store(true, Ordering::SeqCst);
                            link.enter(Phase::SslAnswer);
                        }
                        // GSSENCRequest and CancelRequest: more untagged traffic or none.
                        80_877_104 | 80_877_102 => {}
                        _ => started_flag.set(true),
                    }
                    return;
                }
                match tag {
                    b'P' => {
                        let mut fields = body.split(|b| *b == 0);
                        let name = fields.next().unwrap_or_default();
                        let query = fields.next().unwrap_or_default();
                        statements.insert(lossy(name), is_write(query));
                    }
                    b'B' => {
                        let mut fields = body.split(|b| *b == 0);
                        let portal = fields.next().unwrap_or_default();
                        let statement = fields.next().unwrap_or_default();
                        let write = statements.get(&lossy(statement)).copied().unwrap_or(false);
                        portals.insert(lossy(portal), write);
                    }
                    b'E' => {
                        let portal = body.split(|b| *b == 0).next().unwrap_or_default();
                        if portals.get(&lossy(portal)).copied().unwrap_or(false) {
                            *write_in_batch = true;
                        }
                    }
                    b'S' => writes += usize::from(std::mem::take(write_in_batch)),
                    b'Q' => writes += usize::from(is_write(body)),
                    b'C' => {
                        // Close: 'S' statement or 'P' portal, then its name.
                        if let Some((&kind, name)) = body.split_first() {
                            let name = lossy(name.split(|b| *b == 0).next().unwrap_or_default());
                            if kind == b'S' {
                                statements.remove(&name);
                            } else {
                                portals.remove(&name);
                            }
                        }
                    }
                    _ => {}
                }
            },
        );
        *started = started_flag.get();
        writes
    }
}

/// The server's side of the protocol: counts `ReadyForQuery` messages.
#[derive(Default)]
struct Backend {
    framer: Framer,
    /// The one-byte answer to an SSLRequest was seen (or none was asked for).
    ssl_answered: bool,
    /// The server accepted TLS: the stream is opaque from here on.
    opaque: bool,
}

impl Backend {
    fn feed(&mut self, data: &[u8], link: &Link) -> usize {
        if self.opaque {
            return 0;
        }
        let mut ready = 0;
        let awaiting_ssl =
            std::cell::Cell::new(!self.ssl_answered && link.ssl_requested.load(Ordering::SeqCst));
        let opaque = std::cell::Cell::new(false);
        self.framer.feed(
            data,
            || {
                if awaiting_ssl.get() {
                    Untagged::One
                } else {
                    Untagged::No
                }
            },
            |tag, body| {
                if awaiting_ssl.get() {
                    awaiting_ssl.set(false);
                    opaque.set(tag == b'S');
                    link.enter(if tag == b'S' {
                        Phase::Tls
                    } else {
                        Phase::Startup
                    });
                } else if tag == b'Z' {
                    ready += 1;
                    link.enter(Phase::Ready);
                } else if tag == b'R' {
                    // An authentication request: code 0 is AuthenticationOk.
                    let ok = body.get(..4) == Some(&[0, 0, 0, 0][..]);
                    link.enter(if ok {
                        Phase::Startup
                    } else {
                        Phase::Authentication
                    });
                }
            },
        );
        if link.ssl_requested.load(Ordering::SeqCst) && !awaiting_ssl.get() {
            self.ssl_answered = true;
        }
        if opaque.get() {
            self.opaque = true;
            self.framer.buf.clear();
        }
        ready
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether a statement's text writes the ledger's table (the statements a cut must hit: claims'
/// inserts, completions, replays, restarts), or is a COMMIT.
fn is_write(query: &[u8]) -> bool {
    let text = String::from_utf8_lossy(query).to_ascii_uppercase();
    let verb = text.trim_start();
    if verb.starts_with("COMMIT") {
        return true;
    }
    text.contains("LEDGER_ENTRIES")
        && (verb.starts_with("INSERT")
            || verb.starts_with("UPDATE")
            || verb.starts_with("DELETE")
            || (verb.starts_with("WITH") && (text.contains("UPDATE") || text.contains("DELETE"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&u32::try_from(body.len() + 4).unwrap().to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_sync_after_a_write_execute_counts_once_across_chunk_boundaries() {
        let link = Link::default();
        let mut f = Frontend::default();
        let mut startup = 8u32.to_be_bytes().to_vec();
        startup.extend_from_slice(&196_608u32.to_be_bytes());
        assert_eq!(f.feed(&startup, &link), 0);
        let mut stream = Vec::new();
        stream.extend(tagged(b'P', b"s1\0UPDATE ledger_entries SET x = 1\0\0\0"));
        stream.extend(tagged(b'B', b"\0s1\0\0\0\0\0\0\0"));
        stream.extend(tagged(b'E', b"\0\0\0\0\0"));
        stream.extend(tagged(b'S', b""));
        stream.extend(tagged(b'P', b"s2\0SELECT 1\0\0\0"));
        stream.extend(tagged(b'B', b"\0s2\0\0\0\0\0\0\0"));
        stream.extend(tagged(b'E', b"\0\0\0\0\0"));
        stream.extend(tagged(b'S', b""));
        let (a, b) = stream.split_at(7);
        assert_eq!(f.feed(a, &link) + f.feed(b, &link), 1);
    }
}
