//! The head deadline actix leaves out. actix times the head of a
//! connection's first request only (`client_request_timeout`, from its
//! first byte): on a reused (keep-alive) connection, the next request's head
//! could come a byte at a time for ever and hold the socket. So each
//! connection is watched: a second descriptor of its socket, and when it
//! was accepted or last answered. One whose next request has not reached
//! the service [`KEEP_ALIVE`] + `http.request_timeout_secs` after that is
//! shut down, whether it sent part of a head or nothing at all. actix closes
//! a reused connection that stays silent for [`KEEP_ALIVE`], so a request
//! cut there had at least `http.request_timeout_secs` from its first byte,
//! and at most [`KEEP_ALIVE`] more. Bodies have their deadline in
//! `body::read`. The cost: a second descriptor per open connection.

use std::any::Any;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Extensions, ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How long actix keeps a silent connection open between requests: its
/// default, set explicitly since the watch counts on it.
pub const KEEP_ALIVE: Duration = Duration::from_secs(5);

pub struct Watch {
    /// The connection's socket, a second descriptor of it: closed with the
    /// connection (the extensions that hold the watch go with it).
    socket: TcpStream,
    /// When the connection was accepted or last answered; `None` while a
    /// request is in the service.
    idle_since: Mutex<Option<Instant>>,
    /// Dropped with the connection, which ends its patrol at once: a flood
    /// of short connections leaves no timers behind.
    _closed: oneshot::Sender<()>,
}

impl Watch {
    fn set_idle_since(&self, since: Option<Instant>) {
        *self
            .idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = since;
    }

    fn idle_since(&self) -> Option<Instant> {
        *self
            .idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// For `HttpServer::on_connect`: watches each new connection, shutting it
/// down once it has been idle or sending a head for `deadline`.
pub fn on_connect(deadline: Duration) -> impl Fn(&dyn Any, &mut Extensions) + Send + Sync {
    move |connection, extensions| {
        let Some(stream) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() else {
            return;
        };
        // Out of descriptors, the connection is served as actix alone would.
        let Ok(socket) = stream.as_fd().try_clone_to_owned() else {
            return;
        };
        let (closed_tx, closed) = oneshot::channel();
        let watch = Arc::new(Watch {
            socket: TcpStream::from(socket),
            idle_since: Mutex::new(Some(Instant::now())),
            _closed: closed_tx,
        });
        actix_web::rt::spawn(patrol(Arc::downgrade(&watch), deadline, closed));
        extensions.insert(watch);
    }
}

/// Wakes at most once per `deadline` while the connection lives, and ends
/// with it.
async fn patrol(watch: Weak<Watch>, deadline: Duration, mut closed: oneshot::Receiver<()>) {
    loop {
        // The watch is held only between sleeps: its descriptor must close
        // when the connection does.
        let next = {
            let Some(watch) = watch.upgrade() else {
                return;
            };
            match watch.idle_since() {
                Some(since) if since + deadline <= Instant::now() => {
                    // actix then reads the end of the stream and closes.
                    let _ = watch.socket.shutdown(Shutdown::Both);
                    return;
                }
                Some(since) => since + deadline,
                None => Instant::now() + deadline,
            }
        };
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            _ = &mut closed => return,
        }
    }
}

/// Middleware: a request in the service is no head still arriving; its
/// answer starts the connection's idle time.
pub async fn track(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let watch = req.conn_data::<Arc<Watch>>().cloned();
    if let Some(watch) = &watch {
        watch.set_idle_since(None);
    }
    let response = next.call(req).await;
    if let Some(watch) = &watch {
        watch.set_idle_since(Some(Instant::now()));
    }
    response
}
