//! `CountDownLatch`: Redisson's `RCountDownLatch`, whose waiters are woken by a message.

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::check_name;
use crate::engine::core::Core;
use crate::redis::keys::LatchKeys;
use crate::redis::node::Node;
use crate::redis::scripts::scripts;
use crate::Error;

/// A countdown latch shared through Redis: one side [`set_count`](CountDownLatch::set_count)s it,
/// workers [`count_down`](CountDownLatch::count_down), and waiters
/// [`wait`](CountDownLatch::wait) until the count reaches zero. Waiting costs no polling: the call
/// that brings the count to zero publishes one message that wakes every waiter (of every client).
///
/// Made by [`LockClient::latch`](crate::LockClient::latch); cheap to clone, no I/O until used.
///
/// - **Reusable**: once at zero the latch is open (its key is gone), and `set_count` may arm it
///   again; while it counts, `set_count` changes nothing and returns `false`.
/// - **A resend counts once**: each `count_down` call carries its own id, recorded in the latch,
///   so the same call delivered twice (a resend after a dropped connection) is one arrival.
///   Two calls are two arrivals, also after an [`Error::Timeout`] whose first call may have
///   landed: read [`count`](CountDownLatch::count) before calling again where that matters.
/// - **No lease**: the latch lives in Redis until it opens, whoever set it; a worker that crashes
///   before counting down leaves the waiters waiting, so bound the wait
///   ([`wait_for`](CountDownLatch::wait_for)) where workers may crash.
/// - Not on a [`MultiLock`](crate::MultiLock): a latch is a counter, and a count split over
///   independent masters has no majority to agree on.
///
/// ```no_run
/// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
/// use std::time::Duration;
///
/// let batch = client.latch("nightly-import");
/// batch.set_count(3).await?;                   // three workers
/// // ... each worker, when done: client.latch("nightly-import").count_down().await?;
/// if batch.wait_for(Duration::from_secs(600)).await? {
///     // every worker counted down
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct CountDownLatch {
    core: Arc<Core>,
    keys: Arc<LatchKeys>,
}

impl CountDownLatch {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> CountDownLatch {
        let keys = Arc::new(LatchKeys::new(core.config.get_key_prefix(), name));
        CountDownLatch { core, keys }
    }

    /// The latch's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Arms the latch with `count` (at least 1), only if it is open (never set, or counted down to
    /// zero): `true` if it was set, `false` if it is still counting (nothing changed). Fails with
    /// [`Error::InvalidConfig`] for a count of 0 and [`Error::InvalidName`] for a bad name, before
    /// any I/O; within the command timeout otherwise.
    pub async fn set_count(&self, count: u64) -> Result<bool, Error> {
        self.check()?;
        if count == 0 || count > i64::MAX as u64 {
            return Err(Error::InvalidConfig(format!(
                "a latch's count is 1 to {}, not {count}",
                i64::MAX
            )));
        }
        // A new id per arming (see `count_down`), below 2^53 so that the scripts' Lua numbers hold it.
        let round = (Uuid::new_v4().as_u64_pair().0 >> 11).max(1);
        let args = vec![Value::from(count as i64), Value::from(round.to_string())];
        let set = self
            .node()
            .run_on(&scripts().latch_set, &self.keys.latch, args)
            .await?;
        Ok(set == 1)
    }

    /// Counts one arrival in the current round (the count [`set_count`](CountDownLatch::set_count)
    /// armed); returns the count left (0 once the latch is open). At zero the latch opens and every
    /// waiter wakes. On an open latch it changes nothing. Two requests, each within the command
    /// timeout: it reads the round, then counts the arrival in it.
    ///
    /// An error (a timeout, a dropped connection) does not say that the arrival was not counted:
    /// the call may have landed, and the connection may still deliver it after the caller got the
    /// error (the chaos harness saw one land 1.4 s after its caller's `Timeout`, resent on
    /// reconnect). Each call carries an id, so it is counted once however often it lands; call
    /// again only for an arrival that should count twice. And each carries the round it read: one
    /// that lands after its round opened changes nothing (answering 0), and never counts in a
    /// round armed since.
    pub async fn count_down(&self) -> Result<u64, Error> {
        let (left, round) = self.read().await?;
        if left == 0 {
            return Ok(0);
        }
        let node = self.node();
        let id = Uuid::new_v4().simple().to_string();
        let args = vec![
            Value::from(id),
            Value::from(self.keys.channel.clone()),
            Value::from(node.publish()),
            Value::from(round.to_string()),
        ];
        let left = node
            .run_on(&scripts().latch_count_down, &self.keys.latch, args)
            .await?;
        Ok(left.max(0) as u64)
    }

    /// The count left: 0 when the latch is open. Within the command timeout.
    pub async fn count(&self) -> Result<u64, Error> {
        self.read().await.map(|(left, _)| left)
    }

    /// The count left and the current round's id (0 when open, or armed by a relock before rounds).
    async fn read(&self) -> Result<(u64, i64), Error> {
        self.check()?;
        let reply = self
            .node()
            .run_list(&scripts().latch_count, &[&self.keys.latch], Vec::new())
            .await?;
        match reply[..] {
            [left, round] => Ok((left.max(0) as u64, round)),
            _ => Err(Error::unexpected_reply("a latch read", &reply)),
        }
    }

    /// Waits until the latch is open (count zero). Each read of the count is bounded by the command
    /// timeout; the wait itself is not: see [`wait_for`](CountDownLatch::wait_for).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves nothing behind (its subscription goes with it).
    pub async fn wait(&self) -> Result<(), Error> {
        self.wait_until(None).await.map(|_| ())
    }

    /// Waits at most `wait` for the latch to open: `true` if it did, `false` if it was still
    /// counting then. Returns within `wait` (plus scheduling delays), whatever the server does; if
    /// no read of the count was answered by then, the result is [`Error::Timeout`], not `false`.
    ///
    /// # Cancel safety
    ///
    /// As [`wait`](CountDownLatch::wait).
    pub async fn wait_for(&self, wait: Duration) -> Result<bool, Error> {
        let until = crate::engine::wait::deadline(wait)?;
        self.wait_until(Some(until)).await
    }

    /// Reads the count after arming a wake-up, so that the message of a count_down between the
    /// read and the sleep is not missed; any wake-up (the message, or the subscriber's own
    /// "something may have been missed") leads to another read. A latch armed again right after it
    /// opened may so keep a waiter that woke late: it never releases one early.
    async fn wait_until(&self, until: Option<Instant>) -> Result<bool, Error> {
        self.check()?;
        let node = self.node();
        let (subscription, mut armed, _) = node.waiters.subscribe(&self.keys.channel, None);
        let mut answered = false;
        loop {
            let count = match until {
                Some(until) => match tokio::time::timeout_at(until, self.count()).await {
                    Ok(count) => count?,
                    Err(_) if answered => return Ok(false),
                    Err(_) => return Err(Error::Timeout(self.core.config.get_command_timeout())),
                },
                None => self.count().await?,
            };
            answered = true;
            if count == 0 {
                return Ok(true);
            }
            match until {
                Some(until) => {
                    if tokio::time::timeout_at(until, &mut armed).await.is_err() {
                        return Ok(false);
                    }
                }
                None => (&mut armed).await,
            }
            if self.core.is_closed() {
                return Err(Error::Shutdown);
            }
            armed = subscription.armed();
        }
    }

    fn check(&self) -> Result<(), Error> {
        check_name(&self.keys.name)?;
        if self.core.is_closed() {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    fn node(&self) -> &Node {
        &self.core.masters.nodes[0]
    }
}

impl std::fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountDownLatch")
            .field("name", &self.keys.name)
            .finish()
    }
}
