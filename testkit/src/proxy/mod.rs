//! The fault proxy: a TCP proxy on `127.0.0.1:0` that forwards to PostgreSQL and injects faults
//! into the link on demand, switchable while traffic flows. The fault tests, the failover tests
//! and the history check put one between each ledger server and its database:
//!
//! ```no_run
//! # async fn example(cluster_port: u16, database_url: &str) {
//! use testkit::proxy::Proxy;
//!
//! let proxy = Proxy::start(([127, 0, 0, 1], cluster_port).into()).await;
//! let url = proxy.url_for(database_url); // the server connects through the proxy
//! proxy.blackhole(true); // a partition, until `blackhole(false)`
//! # }
//! ```
//!
//! The faults:
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

mod link;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use link::serve_connection;

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
