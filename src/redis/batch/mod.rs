//! The batcher: a node's acquisitions, releases and transfers on their way to Redis, coalesced
//! into calls of the batch script (see `scripts/batch.lua`). Here the batcher and its task; in
//! `op` the operations, in `round` and `alone` how a round is sent and answered, in `encode` and
//! `runs` the script's arguments, in `decode` its replies, in `undo` the undo of unacknowledged
//! grants.
//!
//! May use: `crate::util`, `crate::Error`, and the transport's `keys`, `link` and `scripts`; never
//! the engine, the primitives, `inspect` or `blocking`.
//!
//! Coalescing: the acquisitions and releases queued for one node while its earlier calls are in
//! flight go to Redis together, in one call of the batch script, so that load costs the server one
//! script call (and the client one command) per batch instead of one per operation. A lone operation
//! is sent at once, from its caller's task: it never waits for company. A batch is sent from the
//! task of its first operation, which answers the others; the batcher task sends only what no
//! caller could (see [`Batcher`]). A plain lock's release that goes alone needs no script: it is
//! an `HDEL` (see [`release_alone`](alone::release_alone)).
//!
//! A few rounds may be in flight per node; each is handed to the connection as it is made, so
//! operations reach the server in the order they were queued (an undo always runs after the grant
//! it undoes). On a cluster a round is one call per slot (one script call touches one slot), all
//! sent at once; the operations of one lock share a slot, so their order holds.
//!
//! With synced writes (`sync_replicas`), a round's calls go on the node's synced connection,
//! followed by one `WAIT` per primary they reached (see `NodeClient::call_many`). Acquisitions that
//! too few replicas acknowledged are undone on that connection before their callers hear
//! [`Error::ReplicaSync`]; releases need no acknowledgement (a replica that still has a lock only
//! makes it safer).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::Either;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::redis::link::NodeClient;
use crate::util::few::Few;
use crate::Error;
use round::{direct, round};

mod alone;
mod decode;
mod encode;
mod op;
mod round;
mod runs;
mod undo;

pub(crate) use op::{Announce, Granted, Op};

/// The most operations in one call: bounds the time one call blocks the server.
const MAX_BATCH: usize = 256;
/// How much longer than a request's bound the batcher gives one of its rounds: its callers, whose
/// bounds started earlier, give up first.
const ROUND_MARGIN: Duration = Duration::from_millis(20);
/// The most rounds in flight per node: queued operations wait (and coalesce) only behind these.
const MAX_IN_FLIGHT: usize = 16;
/// Below this many rounds in flight, an operation with nothing queued ahead of it goes directly.
/// Above it, operations queue, and the first of them leads: it lets the tasks that are ready add
/// theirs before it sends: under load, several operations per call. Only an idle node sends an
/// operation by itself: against 4 (the bench's `--quick --only uncontended,contended`
/// alternated four times), 16 tasks cost the server 16.7-17.0 µs per cycle against 18.0-18.6, at
/// the same cycles/s; 1 and 256 tasks and the contended rows the same within noise. (4 had taken
/// 11 % off 16 direct rounds' Redis CPU; an operation that goes by itself runs the batch function's
/// dearest path per operation.)
const DIRECT_MAX: usize = 1;

/// An operation's reply: a few integers (see `scripts/batch.lua`), kept inline.
pub(crate) type Ints = Few<i64>;

/// Where a queued operation's reply goes: its caller, unless it left.
type Reply = oneshot::Sender<Result<Ints, Error>>;

/// A round on its way: one call per slot, bounded, its slot given back when it ends or is dropped.
type Sending = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A node's batcher: the operations' way to Redis.
///
/// An operation that finds fewer than [`DIRECT_MAX`] rounds in flight and nothing queued runs as a
/// round of one in the caller's own task (no hop to another task and back: the common case under
/// light load). Otherwise it queues. The first to queue while a round slot is free (at most
/// [`MAX_IN_FLIGHT`]) *leads*: it yields once, so that the tasks ready now queue theirs too, then
/// sends everything queued as one round from its own task and answers the others. So an operation
/// takes one hop between tasks at most (its answer), where a batcher task took two (there and back).
/// What queues while no slot is free, or what a leader leaves when it is dropped before sending, the
/// batcher task sends as soon as a slot is free.
pub(crate) struct Batcher {
    shared: Arc<Shared>,
}

struct Shared {
    link: Arc<NodeClient>,
    state: parking_lot::Mutex<State>,
    /// For the batcher task: a slot freed with operations queued and no leader, a leader dropped
    /// before it sent, or the `Batcher` gone. A permit is kept if the task is busy, so no kick is
    /// lost.
    kick: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    /// Rounds in flight: direct ones, leaders' and the task's.
    in_flight: usize,
    queue: VecDeque<(Op, Reply)>,
    /// A queued operation's task will send the queue (see [`Batcher`]).
    leader: bool,
    /// The `Batcher` is gone: the task ends once the queue is sent and its rounds answered.
    closed: bool,
}

impl State {
    /// Whether the batcher task should send the queue now.
    fn task_sends(&self) -> bool {
        !self.queue.is_empty() && !self.leader && self.in_flight < MAX_IN_FLIGHT
    }

    /// The next round's operations, its slot taken: what is queued, without the operations whose
    /// callers are gone (their wait ran out: nobody would learn the outcome, and every caller undoes
    /// what it may have left).
    fn take_round(&mut self) -> Vec<(Op, Reply)> {
        self.queue.retain(|(_, reply)| !reply.is_closed());
        let batch: Vec<_> = self.queue.drain(..self.queue.len().min(MAX_BATCH)).collect();
        if !batch.is_empty() {
            self.in_flight += 1;
        }
        batch
    }
}

/// A round slot, given back when the round ends or is dropped; the batcher task is kicked if
/// operations wait for it and nobody leads.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        let kick = {
            let mut state = self.0.state.lock();
            state.in_flight -= 1;
            state.task_sends()
        };
        if kick {
            self.0.kick.notify_one();
        }
    }
}

/// A leader before it sent: if dropped then (its caller gone), the batcher task sends the queue.
struct Leading<'a>(&'a Shared);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let kick = {
            let mut state = self.0.state.lock();
            state.leader = false;
            state.task_sends()
        };
        if kick {
            self.0.kick.notify_one();
        }
    }
}

/// A leader's round, driven in the leader's task; if that task drops it (its caller's wait ran
/// out), the rest runs as a task of its own, since the other operations in it wait for it.
struct Driven(Option<Sending>);

impl Future for Driven {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(call) = self.0.as_mut() {
            std::task::ready!(call.as_mut().poll(cx));
            self.0 = None;
        }
        Poll::Ready(())
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        if let (Some(call), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(call);
        }
    }
}

impl Batcher {
    /// Starts the batcher task of a node. It stops when the `Batcher` is dropped, what is queued is
    /// sent and its calls in flight are answered.
    pub(crate) fn start(link: Arc<NodeClient>) -> Batcher {
        let shared = Arc::new(Shared {
            link,
            state: parking_lot::Mutex::new(State::default()),
            kick: tokio::sync::Notify::new(),
        });
        tokio::spawn(run(shared.clone()));
        Batcher { shared }
    }

    /// Runs one operation; its reply as integers, or the error of that operation or of the call.
    ///
    /// The operation takes its place (a round of its own, or the queue) when this is called, not
    /// when the future is first polled: so the future does not carry the operation across its
    /// awaits (an async fn keeps its arguments for its whole life, and every batched operation's
    /// future, boxed once per acquisition and release, would be that much larger).
    pub(crate) fn run(&self, op: Op) -> impl Future<Output = Result<Ints, Error>> + Send + '_ {
        let shared = &self.shared;
        let start = {
            let mut state = shared.state.lock();
            if state.in_flight < DIRECT_MAX && state.queue.is_empty() {
                state.in_flight += 1;
                Start::Direct(Slot(shared.clone()), op)
            } else {
                let (reply, rx) = oneshot::channel();
                state.queue.push_back((op, reply));
                let role = if !state.leader && state.in_flight < MAX_IN_FLIGHT {
                    state.leader = true;
                    Role::Lead(Leading(shared))
                } else {
                    Role::Follow
                };
                Start::Queued(role, rx)
            }
        };
        // Two futures, not one async block over both: a block would keep the operation twice (in
        // `start`, and in the call it is moved into).
        match start {
            // Its first poll, in the caller's first poll, hands the call to the connection: it is
            // ordered after every operation sent before it, as a queued one would be.
            Start::Direct(slot, op) => Either::Left(direct(&shared.link, op, slot)),
            Start::Queued(role, rx) => Either::Right(async move {
                Self::play(shared, role).await;
                rx.await.unwrap_or(Err(Error::Shutdown))
            }),
        }
    }

    /// An operation's part in sending: its own round, or the queue as leader, or none.
    async fn play(shared: &Arc<Shared>, role: Role<'_>) {
        match role {
            Role::Lead(leading) => {
                // Let the tasks that are ready now queue their operations too, so that they go in
                // this round rather than in one call each.
                tokio::task::yield_now().await;
                let batch = shared.state.lock().take_round();
                if batch.is_empty() {
                    drop(leading);
                } else {
                    let mut round = Driven(Some(shared.send(batch)));
                    // Handed to the connection while still the leader (the task and the next
                    // leader wait for that), so rounds reach the server in queue order.
                    let sent = futures::poll!(&mut round);
                    drop(leading);
                    if sent.is_pending() {
                        round.await;
                    }
                }
            }
            Role::Follow => {}
        }
    }
}

/// Where an operation starts (see [`Batcher`]).
enum Start<'a> {
    /// A round of its own (its slot taken), run now by its caller, who gets the reply directly.
    Direct(Slot, Op),
    /// Queued, with its part in sending and the way its reply comes.
    Queued(Role<'a>, oneshot::Receiver<Result<Ints, Error>>),
}

/// A queued operation's part in sending (see [`Batcher`]).
enum Role<'a> {
    /// Sends the queue.
    Lead(Leading<'a>),
    /// Queued: a leader or the task sends it.
    Follow,
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.shared.state.lock().closed = true;
        self.shared.kick.notify_one();
    }
}

impl Shared {
    /// The call of a round whose slot is taken: bounded here too (its callers' own bounds drop only
    /// their waiting), so that a round that is never answered frees its slot.
    fn send(self: &Arc<Self>, batch: Vec<(Op, Reply)>) -> Sending {
        let slot = Slot(self.clone());
        let link = self.link.clone();
        let deadline = Instant::now() + link.bound() + ROUND_MARGIN;
        Box::pin(async move {
            let _slot = slot;
            link.deadlines.within(deadline, round(link.clone(), batch)).await;
        })
    }
}

/// The batcher task: sends what queued while no slot was free or no leader was left, as soon as a
/// slot is free.
async fn run(shared: Arc<Shared>) {
    let mut in_flight = FuturesUnordered::new();
    loop {
        let (sends, closed) = {
            let state = shared.state.lock();
            (state.task_sends(), state.closed && state.queue.is_empty())
        };
        if sends {
            // As a leader does: let the tasks that are ready now queue theirs too.
            tokio::task::yield_now().await;
        }
        loop {
            let batch = {
                let mut state = shared.state.lock();
                if !state.task_sends() {
                    break;
                }
                state.take_round()
            };
            if batch.is_empty() {
                break;
            }
            let mut call = shared.send(batch);
            // Polled once here, in queue order: that hands the command to the connection, so
            // batches reach the server in the order their operations were queued.
            if futures::poll!(call.as_mut()).is_pending() {
                in_flight.push(call);
            }
        }
        if closed && in_flight.is_empty() {
            return;
        }
        tokio::select! {
            () = shared.kick.notified() => {}
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
        }
    }
}
