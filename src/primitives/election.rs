//! Leader election over a lock: [`Election`], whose [`campaign`](Election::campaign) waits to lead
//! and returns a [`Leadership`], whose term is its fencing token; [`leader`](Election::leader) and
//! [`observe`](Election::observe) for everyone else.
//!
//! The leader holds the election's lock (`election:NAME`, renewed by the watchdog like any hold)
//! and, once it holds it, writes its record beside it by a guarded write (`term field value`), and
//! announces it on the election's channel. A reader trusts a record only while its hold (`field`)
//! is in the lock hash (`scripts/election_leader.lua`): a leader that crashed or lost its lease is
//! no leader, whatever its record says.

use std::sync::Arc;
use std::time::Duration;

use fred::bytes_utils::Str;
use futures::Stream;
use tokio::time::Instant;

use crate::engine::core::Core;
use crate::primitives::guard::LockGuard;
use crate::primitives::lock::Lock;
use crate::Error;

/// An election of one name: who leads, and the way to lead it. Cheap to clone; no I/O until used.
/// Made by [`LockClient::election`](crate::LockClient::election).
///
/// ```no_run
/// # async fn demo(client: relock::LockClient) -> Result<(), relock::Error> {
/// let election = client.election("scheduler");
/// let leadership = election.campaign("10.0.0.7:8080").await?; // waits to lead
/// println!("leading in term {}", leadership.term());
/// // Run the scheduler until the leadership is lost (or the work ends).
/// let _ = leadership.until_lost(async { /* schedule */ }).await;
/// leadership.resign().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Election {
    lock: Lock,
    core: Arc<Core>,
    /// The leader's record: `term field value`.
    record: Str,
    /// Where a new leader, and a resignation, are announced.
    channel: Str,
}

/// The current leader of an election, as [`Election::leader`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// Its term: the fencing token of its hold, larger than every earlier leader's.
    pub term: u64,
    /// The value it campaigned with (an address, a host name).
    pub value: String,
    /// How long its lease still runs unless renewed, as Redis counts it.
    pub ttl: Duration,
}

/// Leading an election: the guard of the election's lock, its term and value. Dropping it steps
/// down in the background: the lock is released, and the record, which names a hold that is gone,
/// is read by nobody as the leader; but nothing is announced, so observers learn it when the
/// lease they saw runs out. [`resign`](Leadership::resign) tells them at once.
#[must_use = "dropping the leadership resigns at once"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    term: u64,
    value: String,
    record: Str,
    channel: Str,
    /// `PUBLISH`, or `SPUBLISH` on a cluster.
    publish: &'static str,
}

impl Election {
    pub(crate) fn new(core: Arc<Core>, lock: Lock) -> Election {
        let key = lock.keys().lock.clone();
        Election {
            record: format!("{key}:leader").into(),
            channel: format!("{key}:leader:changed").into(),
            lock,
            core,
        }
    }

    /// Waits to lead, then takes office with `value` (what others read of this leader, such as
    /// its address): the record is written and announced only while the lock is held. Waits
    /// without polling, as [`Lock::acquire`] does.
    ///
    /// # Errors
    ///
    /// Those of [`Lock::acquire`]; [`Error::LeaseLost`] if the lock was lost before the record
    /// was written (then nothing was written).
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::acquire`]: a lock taken by a dropped campaign is released.
    pub async fn campaign(&self, value: &str) -> Result<Leadership, Error> {
        let guard = self.lock.acquire().await?;
        let term = guard.fencing_token().await?;
        let record = format!("{term} {} {value}", guard.field());
        let publish = self.core.masters.nodes[0].link.topology.publish();
        let (key, channel) = (&self.record, &self.channel);
        guard
            .atomically(|tx| {
                tx.set(key, &record).command(publish, &[], &[channel, "*"]);
            })
            .await?;
        tracing::info!(election = %self.name(), term, "took office");
        Ok(Leadership {
            guard,
            term,
            value: value.to_string(),
            record: self.record.clone(),
            channel: self.channel.clone(),
            publish,
        })
    }

    /// The current leader, if anyone leads: one read.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        let read = self.core.masters.nodes[0].election_leader(&self.lock.keys().lock, &self.record);
        let leader = read.await?;
        Ok(leader.map(|(term, value, ttl)| Leader { term, value, ttl }))
    }

    /// The leader as it changes: the current state first, then each change (`None`: nobody leads).
    /// It never misses the latest state, but may skip states that came and went between two reads.
    /// Woken by each new leader's and each resignation's announcement, and when the current
    /// leader's lease would run out (a crashed leader announces nothing); it does not poll.
    ///
    /// An error reading the leader is yielded, and the stream goes on after a pause.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>, Error>> + Send + 'static {
        let election = self.clone();
        let node = self.core.masters.nodes[0].clone();
        let (subscription, armed, _) = node.waiters.subscribe(&self.channel, None);
        let state = Observer {
            election,
            subscription,
            armed: Some(armed),
            last: None,
        };
        futures::stream::unfold(state, |mut state| async move {
            let item = state.next_change().await;
            Some((item, state))
        })
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.lock
            .name()
            .strip_prefix(ELECTION_PREFIX)
            .unwrap_or(self.lock.name())
    }
}

/// The lock of the election `name` is named `election:NAME`.
pub(crate) const ELECTION_PREFIX: &str = "election:";

/// The state of one [`Election::observe`] stream.
struct Observer {
    election: Election,
    subscription: crate::redis::waiters::Subscription,
    /// Armed before each read, so that an announcement between the read and the wait is kept.
    armed: Option<crate::redis::waiters::Armed>,
    /// The last state yielded (its term, or 0 for nobody); `None` before the first.
    last: Option<u64>,
}

impl Observer {
    /// Waits for the next state that differs from the last one yielded.
    async fn next_change(&mut self) -> Result<Option<Leader>, Error> {
        loop {
            let armed = self.armed.take().unwrap_or_else(|| self.subscription.armed());
            let read = self.election.leader().await;
            // Armed for the next round before this one's wait, so nothing falls between.
            let state = match read {
                Ok(state) => state,
                Err(err) => {
                    self.armed = Some(armed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return Err(err);
                }
            };
            let term = state.as_ref().map_or(0, |leader| leader.term);
            if self.last != Some(term) {
                self.last = Some(term);
                self.armed = Some(armed);
                return Ok(state);
            }
            // Unchanged: wait for an announcement, or for the leader's lease to run out.
            let until = state.map(|leader| Instant::now() + leader.ttl + Duration::from_millis(5));
            match until {
                Some(until) => {
                    tokio::select! {
                        () = armed => {}
                        () = tokio::time::sleep_until(until) => {}
                    }
                }
                None => armed.await,
            }
        }
    }
}

impl Leadership {
    /// This leader's term: the fencing token of its hold, larger than every earlier leader's. Pass
    /// it to storage that must refuse a deposed leader's writes.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The value it campaigned with.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether it still leads: false once its lease is known lost.
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Completes when the leadership is lost (its lease could not be renewed, or the lock was
    /// taken from it). Never completes while it leads.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// Runs `work` while it leads; if the leadership is lost first, `work` is dropped and
    /// `Err(Error::LeaseLost)` is returned.
    pub async fn until_lost<F: std::future::Future>(&self, work: F) -> Result<F::Output, Error> {
        self.guard.until_lost(work).await
    }

    /// The guard of the election's lock, for guarded writes under the leadership (keys with the
    /// tag `{election:NAME}`).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Steps down: the record goes and the change is announced (only while it still leads), then
    /// the lock is released, and the next campaign may win.
    pub async fn resign(self) -> Result<(), Error> {
        let (key, channel) = (&self.record, &self.channel);
        let stepped_down = self
            .guard
            .atomically(|tx| {
                tx.del(key).command(self.publish, &[], &[channel, "*"]);
            })
            .await;
        let released = self.guard.release().await;
        stepped_down?;
        released
    }
}
