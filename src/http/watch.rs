//! The request deadline actix leaves out: a request's head and body must
//! both have arrived `http.request_timeout_secs` after its first byte.
//! actix times the head of a connection's first request only
//! (`client_request_timeout`), and nothing of a body: on a reused
//! (keep-alive) connection the next head could come a byte at a time for
//! ever, and any body could be read again for as long.
//!
//! So each connection is watched by a task of its own, with a second
//! descriptor of its socket, that sees the first byte of each request
//! arrive (the socket turning readable while the connection is idle). A
//! request whose head has not reached the service `http.request_timeout_secs`
//! after that is shut down; the body's reader (`body::read`) gets the same
//! deadline ([`deadline`]). A connection silent for longer than
//! [`KEEP_ALIVE`] is closed by actix; one the watch missed a first byte of
//! (a pipelined request, sent before the previous answer) is shut down at
//! the latest [`KEEP_ALIVE`] later. The cost: a second descriptor and a
//! task per open connection, which end with it.

use std::any::Any;
use std::io;
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::sync::{Arc, Weak};
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Extensions, ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::HttpRequest;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

/// How long actix keeps a silent connection open between requests: its
/// default, set explicitly since the watch counts on it.
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// Where a connection is in its current request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Accepted then, and nothing of a request seen since.
    Idle(Instant),
    /// Answered then, and nothing of a next request seen since.
    Answered(Instant),
    /// A request's first byte came then; its head has not reached the
    /// service yet.
    Arriving(Instant),
    /// A request is in the service; it started arriving then.
    InService(Instant),
}

/// A connection's phase, kept in its extensions: dropped with the
/// connection, which ends its patrol.
pub struct Watch {
    phase: watch::Sender<Phase>,
    timeout: Duration,
}

impl Watch {
    /// When the request in the service must have arrived whole.
    fn deadline(&self) -> Option<Instant> {
        match *self.phase.borrow() {
            Phase::InService(started) => Some(started + self.timeout),
            Phase::Idle(_) | Phase::Answered(_) | Phase::Arriving(_) => None,
        }
    }
}

/// For `HttpServer::on_connect`: watches each new connection, shutting it
/// down once a request's head has taken `timeout` from its first byte.
pub fn on_connect(timeout: Duration) -> impl Fn(&dyn Any, &mut Extensions) + Send + Sync {
    move |connection, extensions| {
        let Some(stream) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() else {
            return;
        };
        // Out of descriptors, the connection is served as actix alone would.
        let Ok(socket) = stream.as_fd().try_clone_to_owned() else {
            return;
        };
        let Ok(socket) = TcpStream::from_std(std::net::TcpStream::from(socket)) else {
            return;
        };
        let (phase, seen) = watch::channel(Phase::Idle(Instant::now()));
        let watch = Arc::new(Watch { phase, timeout });
        actix_web::rt::spawn(patrol(socket, Arc::downgrade(&watch), seen, timeout));
        extensions.insert(watch);
    }
}

/// Follows one connection's phases until it closes: marks each request's
/// first byte, and shuts the connection down when a head or an idle spell
/// runs past its deadline.
async fn patrol(
    socket: TcpStream,
    watch: Weak<Watch>,
    mut seen: watch::Receiver<Phase>,
    timeout: Duration,
) {
    let mut forgotten = None;
    loop {
        let phase = *seen.borrow_and_update();
        let deadline = match phase {
            Phase::Idle(since) => Some(since + KEEP_ALIVE + timeout),
            Phase::Answered(since) => {
                // Readiness left from the bytes of the request just
                // answered says nothing of the next one. (A new
                // connection's is its first request's.)
                if forgotten != Some(since) {
                    forget_readiness(&socket);
                    forgotten = Some(since);
                }
                Some(since + KEEP_ALIVE + timeout)
            }
            Phase::Arriving(at) => Some(at + timeout),
            Phase::InService(_) => None,
        };
        let expired = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = seen.changed() => {
                if changed.is_err() {
                    // The connection is gone, and its watch with it.
                    return;
                }
            }
            () = expired => {
                // actix then reads the end of the stream and closes.
                if let Ok(socket) = socket.into_std() {
                    let _ = socket.shutdown(Shutdown::Both);
                }
                return;
            }
            _ = socket.readable(), if matches!(phase, Phase::Idle(_) | Phase::Answered(_)) => {
                forget_readiness(&socket);
                let Some(watch) = watch.upgrade() else { return };
                let now = Instant::now();
                // Only from the idle spell it waited in: a wake that lost
                // the race to a request served meanwhile (the bytes of
                // that request) marks nothing.
                watch.phase.send_if_modified(|current| {
                    let idle = *current == phase;
                    if idle {
                        *current = Phase::Arriving(now);
                    }
                    idle
                });
            }
        }
    }
}

/// Clears what the reactor knows of the socket's readiness without reading
/// a byte (the bytes are actix's): the next `readable` waits for new ones.
fn forget_readiness(socket: &TcpStream) {
    let _ = socket.try_io(Interest::READABLE, || {
        Err::<(), _>(io::ErrorKind::WouldBlock.into())
    });
}

/// Middleware: a request in the service is no head still arriving; its
/// answer starts the connection's idle time.
pub async fn track(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let watch = req.conn_data::<Arc<Watch>>().cloned();
    if let Some(watch) = &watch {
        let now = Instant::now();
        // A head that came in one read can reach the service before the
        // patrol saw its first byte: it started now.
        watch.phase.send_modify(|phase| {
            *phase = match *phase {
                Phase::Arriving(at) => Phase::InService(at),
                Phase::Idle(_) | Phase::Answered(_) | Phase::InService(_) => Phase::InService(now),
            }
        });
    }
    let response = next.call(req).await;
    if let Some(watch) = &watch {
        watch.phase.send_replace(Phase::Answered(Instant::now()));
    }
    response
}

/// When the request's body must have arrived: `http.request_timeout_secs`
/// after its first byte (from now where the connection is not watched).
pub fn deadline(req: &HttpRequest, timeout: Duration) -> Instant {
    req.conn_data::<Arc<Watch>>()
        .and_then(|watch| watch.deadline())
        .unwrap_or_else(|| Instant::now() + timeout)
}
