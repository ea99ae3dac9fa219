//! A shop's webhook endpoint, real and misbehaving on command: a small
//! HTTP/1.1 server on a port of its own that records every request it
//! reads (head, body, and what it answered) and answers as its [`Mode`]
//! says: 200, a status of the test's choice, late, never, or by dropping
//! the connection. The order events' tests deliver to it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A head longer than this, or a body, is not a webhook: the connection is dropped.
const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 1024 * 1024;

/// How the receiver answers the requests that follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200, at once.
    Accept,
    /// This status (a 5xx, a 4xx, a 3xx), at once.
    Answer(u16),
    /// 200 after this long (after the sender's timeout, say).
    Slow(Duration),
    /// Reads the request and never answers (the connection stays open).
    Stall,
    /// Reads the request and closes the connection without a word.
    Crash,
}

/// One request as the receiver read it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    /// The status it was answered with; `None` when it got no answer.
    pub answered: Option<u16>,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// The body as JSON (`null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }

    /// Whether the receiver answered it 2xx: the shop has it.
    pub fn acknowledged(&self) -> bool {
        self.answered
            .is_some_and(|status| (200..300).contains(&status))
    }
}

#[derive(Debug)]
struct State {
    mode: Mode,
    received: Vec<Received>,
}

/// The running receiver; it stops when dropped.
pub struct Receiver {
    port: u16,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Receiver {
    /// Listens on a free port of 127.0.0.1, answering [`Mode::Accept`].
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let port = listener.local_addr().expect("the receiver's port").port();
        let state = Arc::new(Mutex::new(State {
            mode: Mode::Accept,
            received: Vec::new(),
        }));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Self { port, state, task }
    }

    /// The URL to deliver to.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/stagedoor/events", self.port)
    }

    pub fn set(&self, mode: Mode) {
        lock(&self.state).mode = mode;
    }

    /// Every request read so far, in order of arrival.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.state).received.clone()
    }

    /// Waits until `done` holds of the requests read, up to `patience`;
    /// they are returned either way.
    pub async fn until(
        &self,
        patience: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + patience;
        loop {
            let received = self.received();
            if done(&received) || Instant::now() >= deadline {
                return received;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One connection: requests one after another (keep-alive), each answered
/// as the mode says when it was read.
async fn serve(mut stream: TcpStream, state: Arc<Mutex<State>>) {
    let mut buffer = Vec::new();
    loop {
        let Some((method, path, headers, body)) = read_request(&mut stream, &mut buffer).await
        else {
            return;
        };
        let mode = lock(&state).mode;
        let index = {
            let mut state = lock(&state);
            state.received.push(Received {
                method,
                path,
                headers,
                body,
                answered: None,
                at: Instant::now(),
            });
            state.received.len() - 1
        };
        let status = match mode {
            Mode::Accept => 200,
            Mode::Answer(status) => status,
            Mode::Slow(delay) => {
                tokio::time::sleep(delay).await;
                200
            }
            Mode::Stall => {
                tokio::time::sleep(Duration::from_secs(3_600)).await;
                return;
            }
            Mode::Crash => return,
        };
        let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
        // Recorded as answered once written, whether or not the sender
        // still listens (a late 200 is a delivery the shop has).
        lock(&state).received[index].answered = Some(status);
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

type Request = (String, String, BTreeMap<String, String>, Vec<u8>);

/// Reads one request (its head, then `content-length` bytes of body);
/// `None` when the connection ends first or the request is too large.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Request> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        if buffer.len() > MAX_HEAD {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, path) = (
        request_line.next()?.to_owned(),
        request_line.next()?.to_owned(),
    );
    let headers: BTreeMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|length| length.parse().ok())
        .unwrap_or(0);
    if length > MAX_BODY {
        return None;
    }
    let body_start = head_end + 4;
    while buffer.len() < body_start + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[body_start..body_start + length].to_vec();
    buffer.drain(..body_start + length);
    Some((method, path, headers, body))
}
