//! Coalescing: the acquisitions and releases queued for one node while its earlier calls are in
//! flight go to Redis together, in one call of the batch script, so that load costs the server one
//! script call (and the client one command) per batch instead of one per operation. A lone operation
//! is sent at once, from its caller's task: it never waits for company. A batch is sent from the
//! task of its first operation, which answers the others; the batcher task sends only what no
//! caller could (see [`Batcher`]). A plain lock's release that goes alone needs no script: it is
//! an `HDEL` (see [`release_alone`]).
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

use fred::bytes_utils::Str;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::Either;
use futures::stream::{FuturesUnordered, StreamExt};

use fred::types::{Key, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::redis::keys::{Kind, LockKeys};
use crate::redis::link::NodeClient;
use crate::redis::scripts::{scripts, Script};
use crate::util::few::Few;
use crate::Error;

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

/// One operation of the batch script (see `scripts/batch.lua`).
pub(crate) enum Op {
    Acquire {
        lock: Str,
        fence: Str,
        /// For an undo (see `undo_unsynced`).
        channel: Str,
        owner: Str,
        lease_ms: i64,
        target: i64,
        /// A master of a quorum: its fence counter kept in step (see `scripts/acquire.lua`).
        in_step: bool,
        /// Which acquisition: a lock's, or one side of a read-write lock.
        kind: Kind,
    },
    Release {
        lock: Str,
        owner: Str,
        target: i64,
        channel: Str,
        /// Whose hold: decides the operation and its other keys.
        kind: Kind,
        /// A plain lock's release is published even if no waiter marked the hold (this client has
        /// waiters of its own on the channel, who may have left no mark: see `Node::release`).
        announce: bool,
    },
    /// A plain lock handed from the hold `from` to a new hold `to`: with a token drawn by the call
    /// (`scripts/transfer.lua`), or with the token the client granted it already
    /// (`scripts/transfer_granted.lua`).
    Transfer {
        lock: Str,
        fence: Str,
        channel: Str,
        from: Str,
        to: Str,
        lease_ms: i64,
        granted: Option<Granted>,
    },
}

/// A handoff that the client granted already, as its record in Redis says it (see
/// `scripts/transfer_granted.lua`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Granted {
    /// The receiving hold's token.
    pub(crate) token: u64,
    /// The fence's value that this client's last record of the lock left, if it knows one.
    pub(crate) expect: Option<u64>,
    /// The fence's value to set: the token, or above it to reserve the tokens in between for
    /// handoffs that are not recorded one by one (see `handoff.rs`).
    pub(crate) fence_to: u64,
}

impl Op {
    /// The release of a hold of `keys`, to `target`; `announce` as in [`Op::Release`].
    pub(crate) fn release(keys: &LockKeys, owner: &Str, target: i64, announce: bool) -> Op {
        Op::Release {
            lock: keys.lock.clone(),
            owner: owner.clone(),
            target,
            channel: keys.channel.clone(),
            kind: keys.kind.clone(),
            announce,
        }
    }
}

/// An operation's reply: a few integers (see `scripts/batch.lua`), kept inline.
pub(crate) type Ints = Few<i64>;

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

/// A round of one operation, in its caller's task, its `slot` taken: no list of calls, no channel
/// for the reply. With synced writes, a round as any other (its `WAIT` and undo are there).
///
/// Which future is decided here, and each holds only what it needs: one async fn over them would
/// keep the operation twice and a synced round's state inline, and a batched operation's future
/// above 1,024 bytes misses glibc's thread cache, which took about 500 instructions more per box
/// (callgrind).
fn direct(
    link: &Arc<NodeClient>,
    op: Op,
    slot: Slot,
) -> impl Future<Output = Result<Ints, Error>> + Send + '_ {
    if link.sync.is_some() {
        return Either::Left(async move {
            let _slot = slot;
            let (reply, rx) = oneshot::channel();
            Box::pin(round(link.clone(), vec![(op, reply)])).await;
            rx.await.unwrap_or(Err(Error::Shutdown))
        });
    }
    Either::Right(alone(link, op, Some(slot)))
}

/// One operation sent by itself where writes are not synced (a direct round, or a queued round
/// of one): a plain lock's lone release as an `HDEL` ([`release_alone`]), anything else as one
/// call of the batch script, without the lists of a round of many. A direct round's `slot` is
/// held to the end (a queued round's is held by its sender). The slot goes in, not around: a
/// block around this future would keep it twice.
fn alone(
    link: &NodeClient,
    op: Op,
    slot: Option<Slot>,
) -> impl Future<Output = Result<Ints, Error>> + Send + '_ {
    crate::util::telemetry::batch(1);
    match op.into_lone_release() {
        Ok((lock, owner, channel)) => Either::Left(async move {
            let _slot = slot;
            // Boxed: fred's command future (about 7 KB) held inline would make every round's
            // future, and every batched operation's above it, that much larger, acquisitions
            // included. At 256 tasks that cost 2-3 µs of client CPU per cycle (the
            // bench's `--quick --only uncontended` alternated twice: 12.4-13.3 µs against
            // 15.3-15.8).
            Box::pin(release_alone(link, lock, owner, channel)).await
        }),
        Err(op) => Either::Right(call_alone(link, op, slot)),
    }
}

/// [`alone`]'s call of the batch script (see [`encode_alone`]).
async fn call_alone(link: &NodeClient, op: Op, slot: Option<Slot>) -> Result<Ints, Error> {
    let _slot = slot;
    let call = encode_alone(&op, link.topology.publish());
    // Boxed, as in `alone`.
    let reply = Box::pin(link.call_one::<Value>(batch_script(call.plain), call.keys, call.args)).await;
    match reply {
        Ok(Value::Array(flat)) => {
            let mut rest = flat.as_slice();
            let reply = cut(&mut rest, &op).ok_or_else(|| malformed(1))?;
            if !rest.is_empty() {
                return Err(malformed(1));
            }
            reply
        }
        // A fresh grant's token alone, not in a list (see `scripts/batch.lua`).
        Ok(token) => decode(&op, std::slice::from_ref(&token)),
        // A lone operation runs without a pcall: its error is the call's (see `answer`).
        Err(err) => Err(Error::from_redis(err, op.lock())),
    }
}

/// One round: the batch split by slot, one call per slot, all at once (in queue order).
async fn round(link: Arc<NodeClient>, mut batch: Vec<(Op, Reply)>) {
    if let ([_], None) = (batch.as_slice(), &link.sync) {
        if let Some((op, tx)) = batch.pop() {
            let _ = tx.send(alone(&link, op, None).await);
            return;
        }
    }
    let mut groups = link.topology.by_slot(batch, |(op, _)| op.lock());
    for group in &groups {
        crate::util::telemetry::batch(group.len());
    }
    let publish = link.topology.publish();
    let calls: Vec<Call> = groups
        .iter_mut()
        .map(|group| {
            encode_runs(group, publish).unwrap_or_else(|| encode(group.iter().map(|(op, _)| op), publish))
        })
        .collect();
    // One script for the round: the plain one only if every call can take it.
    let script = batch_script(calls.iter().all(|call| call.plain));
    let calls = calls.into_iter().map(|call| (call.keys, call.args)).collect();
    let results = link.call_many::<Vec<Value>>(script, calls).await;
    for (group, result) in groups.into_iter().zip(results) {
        answer(&link, group, result).await;
    }
}

/// A plain lock's release to count 0 that goes alone (a round of one, not synced): `HDEL` of the
/// hold's field and its mark (see `scripts/release.lua`), no script. An `FCALL` with its Lua costs
/// the server more than the command it runs: an idle server spent 35 µs on the release's `FCALL`
/// against 22 on this `HDEL` (one request a millisecond). The same reply as the
/// script's. Two fields removed means a waiter marked the hold: the release message follows, a
/// request of its own (so a marked hold's waiters hear it a round trip later than from the script,
/// and its subscribers' count is unknown if the message fails).
async fn release_alone(link: &NodeClient, lock: Str, owner: Str, channel: Str) -> Result<Ints, Error> {
    use fred::interfaces::{HashesInterface, PubsubInterface};
    let mark = crate::redis::keys::joined(&[&owner, "~"]);
    crate::util::telemetry::redis_call("release");
    let removed: i64 = link
        .batch
        .hdel(Key::from(&lock), vec![Key::from(owner), Key::from(mark)])
        .await
        .map_err(|err| Error::from_redis(err, &lock))?;
    match removed {
        0 => return Ok([0].into_iter().collect()),
        1 => return Ok([2, 0].into_iter().collect()),
        _ => {}
    }
    crate::util::telemetry::redis_call("release");
    let heard: Result<i64, _> = if link.topology.sharded() {
        link.batch.spublish(channel, "1").await
    } else {
        link.batch.publish(channel, "1").await
    };
    Ok(match heard {
        Ok(heard) => [2, heard].into_iter().collect(),
        Err(err) => {
            tracing::debug!(lock = %lock, %err, "a release's message failed");
            [2].into_iter().collect()
        }
    })
}

impl Op {
    /// A plain lock's unannounced release to count 0 (see [`release_alone`]): its lock, owner and
    /// channel; else the operation.
    // The operation comes back as it went in, moved (as large as any `Op`).
    #[allow(clippy::result_large_err)]
    fn into_lone_release(self) -> Result<(Str, Str, Str), Op> {
        match self {
            Op::Release {
                lock,
                owner,
                target: 0,
                channel,
                kind: Kind::Plain,
                announce: false,
            } => Ok((lock, owner, channel)),
            op => Err(op),
        }
    }

    fn lock(&self) -> &str {
        match self {
            Op::Acquire { lock, .. } | Op::Release { lock, .. } | Op::Transfer { lock, .. } => lock,
        }
    }
}

/// One call of the batch script: its keys and arguments, and which batch script runs them.
struct Call {
    keys: Vec<Key>,
    args: Vec<Value>,
    /// Every operation is a plain lock's: the lighter [`BATCH_PLAIN`](crate::redis::scripts::BATCH_PLAIN)
    /// runs them.
    plain: bool,
}

/// The batch script for calls of which `plain` says whether all are plain.
fn batch_script(plain: bool) -> &'static Script {
    if plain {
        &scripts().batch_plain
    } else {
        &scripts().batch
    }
}

/// The call of the batch script for one operation sent alone: [`encode`]'s, but a fresh acquisition
/// of a plain lock (`A`, `Q`) goes in short, without the count of operations and the publish
/// command (see `scripts/batch.lua`), and its grant answers the token alone, not in a list. The
/// server's share of an uncontended acquisition and release is about 12 % smaller (callgrind of
/// the server).
fn encode_alone(op: &Op, publish: &'static str) -> Call {
    let mut call = encode(std::iter::once(op), publish);
    if let Some(Short::Acquire { .. }) = op.short() {
        call.args.drain(..2);
    }
    call
}

/// An operation that goes in short (see `scripts/batch.lua`).
#[derive(Clone, Copy, PartialEq)]
enum Short {
    /// A fresh acquisition of a plain lock (`A`, or `Q` in step): no target.
    Acquire { lease_ms: i64, in_step: bool },
    /// A plain lock's unannounced full release on its own channel (`R`): neither target nor
    /// channel (the script makes it from the lock's name).
    Release,
}

impl Op {
    /// How this operation goes in short, if it does.
    fn short(&self) -> Option<Short> {
        match self {
            Op::Acquire {
                lease_ms,
                target: 1,
                in_step,
                kind: Kind::Plain | Kind::Permit | Kind::Mark(_) | Kind::Waiter(_),
                ..
            } => Some(Short::Acquire {
                lease_ms: *lease_ms,
                in_step: *in_step,
            }),
            Op::Release {
                lock,
                target: 0,
                channel,
                kind: Kind::Plain,
                announce: false,
                ..
            } if is_lock_channel(lock, channel) => Some(Short::Release),
            _ => None,
        }
    }
}

/// The call of the batch script for a batch of only short operations (see [`Short`]) whose
/// acquisitions share one lease and quorum flag, in runs (see `scripts/batch.lua`): each
/// operation's owner alone, three arguments fewer per acquisition and release, which took about
/// 9 % off the server's cost of a batched cycle (callgrind of the server, pipelined).
/// The acquisitions run ahead of the releases, and `batch` is reordered to match (each run in its
/// order), so that the replies follow it. `None`, `batch` untouched, for any other batch, or one
/// with a release of a lock ahead of an acquisition of it, which the reordering would refuse.
fn encode_runs(batch: &mut [(Op, Reply)], publish: &'static str) -> Option<Call> {
    let mut acquire = None;
    let mut acquisitions = 0;
    // The locks released ahead of this operation: made at the first acquisition behind a release.
    let mut released: Option<std::collections::HashSet<&str>> = None;
    for (at, (op, _)) in batch.iter().enumerate() {
        let short = op.short()?;
        if short == Short::Release {
            if let Some(released) = released.as_mut() {
                released.insert(op.lock());
            }
            continue;
        }
        if *acquire.get_or_insert(short) != short {
            return None;
        }
        if acquisitions < at {
            let released = released.get_or_insert_with(|| {
                let before = batch[..at].iter().map(|(op, _)| op);
                before
                    .filter(|op| matches!(op, Op::Release { .. }))
                    .map(Op::lock)
                    .collect()
            });
            if released.contains(op.lock()) {
                return None;
            }
        }
        acquisitions += 1;
    }
    let (lease_ms, in_step) = match acquire {
        Some(Short::Acquire { lease_ms, in_step }) => (lease_ms, in_step),
        // Releases only: the lease is not read.
        _ => (0, false),
    };
    // Stable: each run keeps its operations' order.
    batch.sort_by_key(|(op, _)| matches!(op, Op::Release { .. }));
    let mut keys = Vec::with_capacity(batch.len() + acquisitions);
    let mut args = Vec::with_capacity(4 + batch.len());
    args.extend([
        Value::from_static_str(if in_step { "Q+" } else { "A+" }),
        Value::from_static_str(publish),
        Value::from(lease_ms),
        Value::from(acquisitions as i64),
    ]);
    for (op, _) in batch.iter() {
        let owner = match op {
            Op::Acquire {
                lock, fence, owner, ..
            } => {
                keys.extend([Key::from(lock), Key::from(fence)]);
                owner
            }
            Op::Release { lock, owner, .. } => {
                keys.push(Key::from(lock));
                owner
            }
            // Never short.
            Op::Transfer { .. } => return None,
        };
        args.push(Value::from(owner.clone()));
    }
    Some(Call {
        keys,
        args,
        plain: true,
    })
}

/// The call of the batch script for `ops`.
fn encode<'a>(ops: impl ExactSizeIterator<Item = &'a Op>, publish: &'static str) -> Call {
    let mut plain = true;
    let mut keys = Vec::with_capacity(ops.len() * 2);
    let mut args = Vec::with_capacity(2 + ops.len() * 4);
    args.push(Value::from(ops.len() as i64));
    // Static strings are sent without a copy.
    args.push(Value::from_static_str(publish));
    for op in ops {
        // The common operations in short (see `scripts/batch.lua`): a fresh acquisition without its
        // target, a plain lock's full release with neither target nor channel.
        match (op.short(), op) {
            (
                Some(Short::Acquire { lease_ms, in_step }),
                Op::Acquire {
                    lock, fence, owner, ..
                },
            ) => {
                keys.extend([Key::from(lock), Key::from(fence)]);
                let code = if in_step { "Q" } else { "A" };
                args.extend([
                    Value::from_static_str(code),
                    Value::from(owner.clone()),
                    Value::from(lease_ms),
                ]);
                continue;
            }
            (Some(Short::Release), Op::Release { lock, owner, .. }) => {
                keys.push(Key::from(lock));
                args.extend([Value::from_static_str("R"), Value::from(owner.clone())]);
                continue;
            }
            _ => {}
        }
        match op {
            Op::Acquire {
                lock,
                fence,
                owner,
                lease_ms,
                target,
                in_step,
                kind,
                ..
            } => {
                // A marking operation's fifth argument: how long its mark lives.
                let mut mark_lease: Option<Duration> = None;
                let code = match kind {
                    Kind::Plain | Kind::Permit | Kind::Mark(_) | Kind::Waiter(_) => {
                        keys.extend([Key::from(lock), Key::from(fence)]);
                        if *in_step {
                            "q"
                        } else {
                            "a"
                        }
                    }
                    Kind::Write { rw, mark } => {
                        keys.extend([lock, fence, &rw.readers, &rw.waiting].map(Key::from));
                        mark_lease = *mark;
                        match (*in_step, mark.is_some()) {
                            (false, false) => "w",
                            (false, true) => "W",
                            (true, false) => "v",
                            (true, true) => "V",
                        }
                    }
                    Kind::Read(rw) => {
                        keys.extend([lock, &rw.write, &rw.readers, &rw.waiting].map(Key::from));
                        "d"
                    }
                    Kind::Fair { fair, enqueue } => {
                        keys.extend([lock, fence, &fair.queue].map(Key::from));
                        mark_lease = *enqueue;
                        match (*in_step, enqueue.is_some()) {
                            (false, false) => "f",
                            (false, true) => "F",
                            (true, false) => "g",
                            (true, true) => "G",
                        }
                    }
                };
                plain &= matches!(code, "a" | "q");
                args.extend([
                    Value::from_static_str(code),
                    Value::from(owner.clone()),
                    Value::from(*lease_ms),
                    Value::from(*target),
                ]);
                if let Some(mark_lease) = mark_lease {
                    args.push(Value::from(mark_lease.as_millis().min(i64::MAX as u128) as i64));
                }
            }
            Op::Release {
                lock,
                owner,
                target,
                channel,
                kind,
                announce,
            } => {
                keys.push(Key::from(lock));
                let code = match kind {
                    Kind::Plain if !announce => "r",
                    Kind::Plain | Kind::Permit => "p",
                    Kind::Write { rw, .. } => {
                        keys.push(Key::from(&rw.waiting));
                        "o"
                    }
                    Kind::Mark(rw) => {
                        keys.push(Key::from(&rw.write));
                        "m"
                    }
                    Kind::Read(rw) => {
                        keys.push(Key::from(&rw.readers));
                        "x"
                    }
                    Kind::Fair { fair, .. } => {
                        keys.push(Key::from(&fair.queue));
                        "h"
                    }
                    Kind::Waiter(fair) => {
                        keys.extend([Key::from(&fair.queue), Key::from(&fair.lock)]);
                        "z"
                    }
                };
                plain &= matches!(code, "r" | "p");
                args.extend([
                    Value::from_static_str(code),
                    Value::from(owner.clone()),
                    Value::from(*target),
                    Value::from(channel.clone()),
                ]);
            }
            Op::Transfer {
                lock,
                fence,
                channel,
                from,
                to,
                lease_ms,
                granted,
            } => {
                keys.extend([Key::from(lock), Key::from(fence)]);
                let op = if granted.is_some() { "u" } else { "t" };
                args.extend([
                    Value::from_static_str(op),
                    Value::from(from.clone()),
                    Value::from(to.clone()),
                    Value::from(*lease_ms),
                ]);
                match granted {
                    // As digits: the script compares them with the fence as strings.
                    Some(granted) => args.extend([
                        Value::from(granted.token.to_string()),
                        match granted.expect {
                            Some(expect) => Value::from(expect.to_string()),
                            None => Value::from_static_str(""),
                        },
                        Value::from(granted.fence_to.to_string()),
                    ]),
                    None => args.push(Value::from(channel.clone())),
                }
            }
        }
    }
    Call { keys, args, plain }
}

/// Whether `channel` is `lock` followed by `:released` (as `LockKeys::new` names a lock's channel),
/// which the batch script makes itself for the short release `R`.
fn is_lock_channel(lock: &str, channel: &str) -> bool {
    channel.strip_prefix(lock).is_some_and(|rest| rest == ":released")
}

/// Hands each operation of one call its reply.
async fn answer(
    link: &NodeClient,
    mut batch: Vec<(Op, Reply)>,
    result: Result<crate::redis::link::Reply<Vec<Value>>, fred::error::Error>,
) {
    let result = result.map(|reply| (split(&reply.value, &batch), reply.acked));
    match result {
        Ok((Ok(mut replies), acked)) => {
            if let Err(short) = link.check_acked(acked) {
                // Boxed: only synced writes come here, and a script call held inline would make
                // every batched operation's future as large as fred's request (about 7 KB).
                Box::pin(undo_unsynced(link, &batch, &mut replies, short)).await;
            }
            for ((_, tx), reply) in batch.drain(..).zip(replies) {
                let _ = tx.send(reply);
            }
        }
        Ok((Err(err), _)) => {
            for (_, reply) in batch.drain(..) {
                let _ = reply.send(Err(err.clone()));
            }
        }
        Err(err) => {
            // A lone operation runs without a pcall: its error (a key of another type) is the
            // call's (see `scripts/batch.lua`).
            for (op, reply) in batch.drain(..) {
                let _ = reply.send(Err(Error::from_redis(err.clone(), op.lock())));
            }
        }
    }
}

/// Too few replicas acknowledged a synced call: its grants are set back to the count they had
/// (`prev`), on the same connection and so after them, and their callers get `short`.
async fn undo_unsynced(
    link: &NodeClient,
    batch: &[(Op, Reply)],
    replies: &mut [Result<Ints, Error>],
    short: Error,
) {
    let mut undos = Vec::new();
    for ((op, _), reply) in batch.iter().zip(replies.iter_mut()) {
        let Op::Acquire {
            lock,
            owner,
            channel,
            kind,
            ..
        } = op
        else {
            continue;
        };
        // Only grants: a refusal changed nothing, and says what it says.
        if let Ok([1, prev, _]) = reply.as_deref() {
            undos.push(Op::Release {
                lock: lock.clone(),
                owner: owner.clone(),
                target: (*prev).max(0),
                channel: channel.clone(),
                kind: kind.clone(),
                // A waiter may have been refused in between, and marked nothing it could see.
                announce: true,
            });
            *reply = Err(short.clone());
        }
    }
    if undos.is_empty() {
        return;
    }
    let call = encode(undos.iter(), link.topology.publish());
    if let Err(err) = link
        .call_unwaited::<Vec<Value>>(batch_script(call.plain), call.keys, call.args)
        .await
    {
        // The caller's background undo (it got an error) sets these holds right once it can.
        tracing::warn!(%err, "undoing grants that replicas did not acknowledge failed");
    }
}

/// The batch script's flat reply cut into each operation's reply, decoded as it is cut: each
/// operation's items follow their number (see `scripts/batch.lua`).
fn split(flat: &[Value], batch: &[(Op, Reply)]) -> Result<Vec<Result<Ints, Error>>, Error> {
    let mut rest = flat;
    let mut replies = Vec::with_capacity(batch.len());
    for (op, _) in batch {
        replies.push(cut(&mut rest, op).ok_or_else(|| malformed(batch.len()))?);
    }
    if !rest.is_empty() {
        return Err(malformed(batch.len()));
    }
    Ok(replies)
}

/// The next operation's reply off the front of `rest`, decoded; `None` if `rest` is too short.
fn cut(rest: &mut &[Value], op: &Op) -> Option<Result<Ints, Error>> {
    let (count, after) = rest.split_first()?;
    let count = count.as_i64().and_then(|count| usize::try_from(count).ok())?;
    if after.len() < count {
        return None;
    }
    let (items, after) = after.split_at(count);
    *rest = after;
    Some(decode(op, items))
}

/// A batch script's reply that does not fit its `ops` operations.
fn malformed(ops: usize) -> Error {
    protocol_error(format!("batch of {ops} got a malformed reply"))
}

/// One operation's reply: a list of integers, or `{-1, message}` for an error of that operation.
fn decode(op: &Op, items: &[Value]) -> Result<Ints, Error> {
    if let [Value::Integer(-1), message, ..] = items {
        let message = message.as_string().unwrap_or_default();
        let lock = op.lock();
        if message.contains("WRONGTYPE") {
            return Err(Error::WrongType(lock.to_string()));
        }
        // Redis refused a command inside the script (say, OOM under `noeviction`): a server error,
        // as fred reports one that it has no kind for, not a malformed reply.
        return Err(Error::Redis(fred::error::Error::new(
            fred::error::ErrorKind::Unknown,
            message,
        )));
    }
    let ints: Ints = items
        .iter()
        .map(|item| {
            item.as_i64()
                .ok_or_else(|| protocol_error(format!("non-integer reply {item:?}")))
        })
        .collect::<Result<_, _>>()?;
    // A grant with no previous count comes in short, its token alone (see `scripts/batch.lua`).
    match (op, ints.as_slice()) {
        (Op::Acquire { .. }, &[token]) if token >= 0 => Ok([1, 0, token].into_iter().collect()),
        _ => Ok(ints),
    }
}

fn protocol_error(message: String) -> Error {
    Error::Redis(fred::error::Error::new(fred::error::ErrorKind::Parse, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(lock: &'static str) -> (Op, Reply) {
        let op = Op::Release {
            lock: lock.into(),
            owner: "o".into(),
            target: 0,
            channel: "c".into(),
            kind: Kind::Plain,
            announce: false,
        };
        (op, oneshot::channel().0)
    }

    /// A plain lock's acquisition by `owner` to `target`, on a single master.
    fn acquire(keys: &LockKeys, owner: &Str, target: i64) -> Op {
        Op::Acquire {
            lock: keys.lock.clone(),
            fence: keys.fence.clone(),
            channel: keys.channel.clone(),
            owner: owner.clone(),
            lease_ms: 30_000,
            target,
            in_step: false,
            kind: Kind::Plain,
        }
    }

    /// The common operations go in short: a fresh acquisition without its target, a plain lock's
    /// full release with neither target nor channel (the script makes it from the lock's name);
    /// any other keeps every argument.
    #[test]
    fn the_common_operations_are_encoded_in_short() {
        let keys = LockKeys::new("relock", "stock");
        assert!(is_lock_channel(&keys.lock, &keys.channel));
        let owner = Str::from("client:t1:1");
        let ops = [
            acquire(&keys, &owner, 1),
            Op::release(&keys, &owner, 0, false),
            acquire(&keys, &owner, 2),
            Op::release(&keys, &owner, 1, false),
            Op::release(&keys, &owner, 0, true),
        ];
        let call = encode(ops.iter(), "PUBLISH");
        let args: Vec<String> = call
            .args
            .iter()
            .map(|v| v.as_string().unwrap_or_default())
            .collect();
        let expect = [
            &["5", "PUBLISH"][..],
            &["A", "client:t1:1", "30000"],
            &["R", "client:t1:1"],
            &["a", "client:t1:1", "30000", "2"],
            &["r", "client:t1:1", "1", "relock:{stock}:released"],
            &["p", "client:t1:1", "0", "relock:{stock}:released"],
        ]
        .concat();
        assert_eq!(args, expect);
        assert_eq!(call.keys.len(), 2 + 1 + 2 + 1 + 1);
        assert!(call.plain);

        // A channel that is not the lock's own keeps the long form.
        let mut other = Op::release(&keys, &owner, 0, false);
        if let Op::Release { channel, .. } = &mut other {
            *channel = "elsewhere".into();
        }
        let call = encode([other].iter(), "PUBLISH");
        assert_eq!(call.args[2].as_str().as_deref(), Some("r"));
        assert_eq!(call.args.len(), 2 + 4);
    }

    /// A batch of fresh acquisitions and full releases of plain locks goes in runs, the
    /// acquisitions first and the batch reordered to match; a release of a lock ahead of an
    /// acquisition of it, two leases, or any other operation keep the batch one by one, untouched.
    #[test]
    fn a_batch_of_short_operations_goes_in_runs_unless_a_lock_would_change_order() {
        let owner = Str::from("client:t1:1");
        let keys: Vec<LockKeys> = ["a", "b", "c", "d"]
            .iter()
            .map(|name| LockKeys::new("relock", name))
            .collect();
        let pair = |op: Op| (op, oneshot::channel().0);
        let locks = |batch: &[(Op, Reply)]| -> Vec<String> {
            batch.iter().map(|(op, _)| op.lock().to_string()).collect()
        };
        let strings = |call: &Call| -> Vec<String> {
            call.args
                .iter()
                .map(|v| v.as_string().unwrap_or_default())
                .collect()
        };

        let mut batch = vec![
            pair(acquire(&keys[0], &owner, 1)),
            pair(Op::release(&keys[1], &owner, 0, false)),
            pair(acquire(&keys[2], &owner, 1)),
            pair(Op::release(&keys[3], &owner, 0, false)),
            // The release of a lock acquired ahead of it: the runs keep that order.
            pair(Op::release(&keys[0], &owner, 0, false)),
        ];
        let call = encode_runs(&mut batch, "PUBLISH").expect("in runs");
        assert_eq!(
            locks(&batch),
            [
                &keys[0].lock,
                &keys[2].lock,
                &keys[1].lock,
                &keys[3].lock,
                &keys[0].lock
            ]
            .map(|l| l.to_string())
        );
        let mut expect = vec!["A+", "PUBLISH", "30000", "2"];
        expect.extend([&*owner; 5]);
        assert_eq!(strings(&call), expect);
        let key_names: Vec<String> = call
            .keys
            .iter()
            .map(|k| k.as_str().unwrap_or_default().to_string())
            .collect();
        let expect_keys = [
            &keys[0].lock,
            &keys[0].fence,
            &keys[2].lock,
            &keys[2].fence,
            &keys[1].lock,
            &keys[3].lock,
            &keys[0].lock,
        ]
        .map(|k| k.to_string());
        assert_eq!(key_names, expect_keys);
        assert!(call.plain);

        // Releases only.
        let mut releases = vec![pair(Op::release(&keys[0], &owner, 0, false))];
        let call = encode_runs(&mut releases, "SPUBLISH").expect("in runs");
        assert_eq!(strings(&call)[..4], ["A+", "SPUBLISH", "0", "0"]);

        // Masters of a quorum.
        let mut in_step = acquire(&keys[0], &owner, 1);
        if let Op::Acquire { in_step, .. } = &mut in_step {
            *in_step = true;
        }
        let mut quorum = vec![pair(in_step)];
        let call = encode_runs(&mut quorum, "PUBLISH").expect("in runs");
        assert_eq!(strings(&call)[..4], ["Q+", "PUBLISH", "30000", "1"]);

        // Not in runs, nothing moved.
        let other_lease = {
            let mut op = acquire(&keys[1], &owner, 1);
            if let Op::Acquire { lease_ms, .. } = &mut op {
                *lease_ms = 10_000;
            }
            op
        };
        let refused: [Vec<Op>; 3] = [
            vec![
                Op::release(&keys[0], &owner, 0, false),
                acquire(&keys[0], &owner, 1),
            ],
            vec![acquire(&keys[0], &owner, 1), other_lease],
            vec![
                Op::release(&keys[1], &owner, 0, false),
                acquire(&keys[0], &owner, 2),
            ],
        ];
        for ops in refused {
            let mut batch: Vec<(Op, Reply)> = ops.into_iter().map(pair).collect();
            let before = locks(&batch);
            assert!(encode_runs(&mut batch, "PUBLISH").is_none(), "{before:?}");
            assert_eq!(locks(&batch), before);
        }
    }

    /// A grant's short reply, its token alone, reads as the long one; a release's one item stays.
    #[test]
    fn a_grant_in_short_reads_as_the_long_form() {
        let keys = LockKeys::new("relock", "stock");
        let acquire = acquire(&keys, &"o".into(), 1);
        let token: Value = "1795711087673246".into();
        let read = decode(&acquire, &[token]).expect("a grant");
        assert_eq!(read.as_slice(), &[1, 0, 1_795_711_087_673_246]);
        let read = decode(&acquire, &ints(&[1, 2, 7])).expect("a re-entry");
        assert_eq!(read.as_slice(), &[1, 2, 7]);
        let read = decode(&acquire, &ints(&[-2])).expect("an upgrade");
        assert_eq!(read.as_slice(), &[-2]);
        let release = Op::release(&keys, &"o".into(), 0, false);
        assert_eq!(decode(&release, &ints(&[2])).expect("freed").as_slice(), &[2]);
    }

    fn ints(values: &[i64]) -> Vec<Value> {
        values.iter().map(|v| Value::Integer(*v)).collect()
    }

    #[test]
    fn a_flat_reply_is_cut_at_each_operations_count() {
        let batch = [release("a"), release("b"), release("c")];
        let mut flat = ints(&[1, 2, 2, 2, 1]);
        flat.extend([Value::Integer(2), Value::Integer(-1)]);
        flat.push("WRONGTYPE Operation against a key".into());
        let replies = split(&flat, &batch).expect("well formed");
        assert_eq!(replies[0].as_deref().ok(), Some(&[2][..]));
        assert_eq!(replies[1].as_deref().ok(), Some(&[2, 1][..]));
        assert!(matches!(&replies[2], Err(Error::WrongType(lock)) if lock == "c"));

        // Short, too long, a count that is no number: malformed, whatever the operations.
        for flat in [
            ints(&[1, 2, 2, 2]),
            ints(&[1, 2, 1, 0, 1, 0, 7]),
            vec!["x".into()],
        ] {
            assert!(split(&flat, &batch).is_err(), "{flat:?}");
        }
    }
}
