//! One connection of its own, outside the pool, that listens on a channel
//! for as long as what it tells lives, connecting again after each loss:
//! the answer cache's invalidations, and any other notice a service's
//! instances share. What it tells must assume it missed notices while it
//! was not listening: it hears [`Listener::listening`] `false` on each
//! loss and `true` once the `LISTEN` is in place, and every notice sent
//! after that `true` reaches it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Socket};

/// How long the listener waits before it connects again, and at most
/// between two looks at whether what it tells is still there.
const RECONNECT: Duration = Duration::from_secs(1);

/// What a listening connection tells.
pub trait Listener: Send + Sync + 'static {
    /// A statement the connection runs about once a second while it
    /// listens, whose first column (a `bigint`) goes to [`Self::counted`]:
    /// e.g. how many other connections listen.
    const EVERY_SECOND: Option<&'static str> = None;

    /// The connection listens (`true`) or was lost (`false`).
    fn listening(&self, now: bool);
    /// A notice's payload, in the order they were sent.
    fn notice(&self, payload: &str);
    /// What [`Self::EVERY_SECOND`] counted.
    fn counted(&self, _count: i64) {}
}

/// Listens on `channel` for `listener`, on a connection to `config`'s
/// database named `application_name`, until `listener` is dropped. `lost`
/// is logged, with the error, each time the connection is lost.
pub fn spawn<L, T>(
    listener: &Arc<L>,
    channel: &'static str,
    mut config: tokio_postgres::Config,
    tls: T,
    application_name: &str,
    lost: &'static str,
) where
    L: Listener,
    T: MakeTlsConnect<Socket> + Clone + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    // A connection whose peer vanished without a word is found out in
    // seconds, not hours: until then a notice could go unheard.
    config
        .application_name(application_name)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(1))
        .keepalives_retries(3);
    let listener = Arc::downgrade(listener);
    tokio::spawn(async move {
        loop {
            if listener.strong_count() == 0 {
                return;
            }
            if let Err(error) = listen_once(&listener, channel, &config, tls.clone()).await {
                tracing::warn!(%error, "{lost}");
            }
            if let Some(listener) = listener.upgrade() {
                listener.listening(false);
            }
            tokio::time::sleep(RECONNECT).await;
        }
    });
}

/// One listening connection, until it is lost.
async fn listen_once<L: Listener, T>(
    listener: &Weak<L>,
    channel: &str,
    config: &tokio_postgres::Config,
    tls: T,
) -> Result<(), tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = config.connect(tls).await?;
    let (notices, mut received) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(notice))) => {
                    if notices.send(notice).is_err() {
                        return Ok(());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error),
                None => return Ok(()),
            }
        }
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    if let Some(listener) = listener.upgrade() {
        listener.listening(true);
    }
    let mut every_second = tokio::time::interval(RECONNECT);
    every_second.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let notice = tokio::select! {
            notice = received.recv() => notice,
            // The connection goes soon after what it tells, not with the
            // next notice.
            _ = every_second.tick() => {
                if listener.strong_count() == 0 {
                    return Ok(());
                }
                if let Some(statement) = L::EVERY_SECOND {
                    let count: i64 = client.query_one(statement, &[]).await?.try_get(0)?;
                    if let Some(listener) = listener.upgrade() {
                        listener.counted(count);
                    }
                }
                continue;
            }
        };
        let (Some(notice), Some(listener)) = (notice, listener.upgrade()) else {
            break;
        };
        listener.notice(notice.payload());
    }
    drop(client);
    match driver.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}
