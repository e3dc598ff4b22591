//! Coalescing: the acquisitions and releases queued for one node while its previous call is in
//! flight go to Redis together, in one call of the batch script, so that load costs the server one
//! script call (and the client one command) per batch instead of one per operation. A lone operation
//! is sent at once: it never waits for company.
//!
//! A few calls may be in flight per node; each is handed to the connection as it is made, so
//! operations reach the server in the order they were queued (an undo always runs after the grant
//! it undoes).

use std::collections::VecDeque;
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};

use fred::clients::{Client, WithOptions};
use fred::types::{Key, Value};
use tokio::sync::{mpsc, oneshot};

use crate::scripts::scripts;
use crate::Error;

/// The most operations in one call: bounds the time one call blocks the server.
const MAX_BATCH: usize = 256;
/// The most calls in flight per node: operations queue (and coalesce) only behind these.
const MAX_IN_FLIGHT: usize = 4;

/// One operation of the batch script (see `scripts/batch.lua`).
pub(crate) enum Op {
    Acquire {
        lock: Arc<str>,
        fence: Arc<str>,
        owner: Arc<str>,
        lease_ms: i64,
        target: i64,
    },
    Release {
        lock: Arc<str>,
        owner: Arc<str>,
        target: i64,
        channel: Arc<str>,
    },
}

type Reply = oneshot::Sender<Result<Vec<i64>, Error>>;

/// The sending side of a node's batcher.
pub(crate) struct Batcher {
    tx: mpsc::UnboundedSender<(Op, Reply)>,
}

impl Batcher {
    /// Starts the batcher task of a node on its command client (with relock's per-command options).
    pub(crate) fn start(client: WithOptions<Client>) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(client, rx));
        Batcher { tx }
    }

    /// Runs one operation; its reply as integers, or the error of that operation or of the call.
    pub(crate) async fn run(&self, op: Op) -> Result<Vec<i64>, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx.send((op, reply)).map_err(|_| Error::Shutdown)?;
        rx.await.unwrap_or(Err(Error::Shutdown))
    }
}

async fn run(client: WithOptions<Client>, mut rx: mpsc::UnboundedReceiver<(Op, Reply)>) {
    let mut in_flight = FuturesUnordered::new();
    let mut queue: VecDeque<(Op, Reply)> = VecDeque::new();
    let mut open = true;
    while open || !queue.is_empty() || !in_flight.is_empty() {
        tokio::select! {
            op = rx.recv(), if open => match op {
                Some(op) => queue.push_back(op),
                None => open = false,
            },
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
        }
        while let Ok(op) = rx.try_recv() {
            queue.push_back(op);
        }
        // An operation whose caller is gone (its wait ran out) is not sent: nobody would learn its
        // outcome, and every caller undoes what it may have left.
        queue.retain(|(_, reply)| !reply.is_closed());
        while in_flight.len() < MAX_IN_FLIGHT && !queue.is_empty() {
            let batch: Vec<_> = queue.drain(..queue.len().min(MAX_BATCH)).collect();
            let mut call = Box::pin(call(client.clone(), batch));
            // Polled once here, in queue order: that hands the command to the connection, so
            // batches reach the server in the order their operations were queued.
            if futures::poll!(call.as_mut()).is_pending() {
                in_flight.push(call);
            }
        }
    }
}

async fn call(client: WithOptions<Client>, mut batch: Vec<(Op, Reply)>) {
    let mut keys = Vec::with_capacity(batch.len() * 2);
    let mut args = Vec::with_capacity(1 + batch.len() * 4);
    args.push(Value::from(batch.len() as i64));
    for (op, _) in batch.iter() {
        match op {
            Op::Acquire {
                lock,
                fence,
                owner,
                lease_ms,
                target,
            } => {
                keys.push(Key::from(&**lock));
                keys.push(Key::from(&**fence));
                args.extend([
                    Value::from("a"),
                    Value::from(&**owner),
                    Value::from(*lease_ms),
                    Value::from(*target),
                ]);
            }
            Op::Release {
                lock,
                owner,
                target,
                channel,
            } => {
                keys.push(Key::from(&**lock));
                args.extend([
                    Value::from("r"),
                    Value::from(&**owner),
                    Value::from(*target),
                    Value::from(&**channel),
                ]);
            }
        }
    }
    let result: Result<Vec<Value>, _> = scripts().batch.run(&client, keys, args).await;
    match result {
        Ok(replies) if replies.len() == batch.len() => {
            for ((op, reply), value) in batch.drain(..).zip(replies) {
                let _ = reply.send(decode(&op, value));
            }
        }
        Ok(replies) => {
            let err = protocol_error(format!("batch of {} got {} replies", batch.len(), replies.len()));
            for (_, reply) in batch.drain(..) {
                let _ = reply.send(Err(err.clone()));
            }
        }
        Err(err) => {
            for (_, reply) in batch.drain(..) {
                let _ = reply.send(Err(Error::Redis(err.clone())));
            }
        }
    }
}

/// One operation's reply: a list of integers, or `{-1, message}` for an error of that operation.
fn decode(op: &Op, value: Value) -> Result<Vec<i64>, Error> {
    let Value::Array(items) = value else {
        return Err(protocol_error(format!("unexpected reply {value:?}")));
    };
    if let (Some(Value::Integer(-1)), Some(message)) = (items.first(), items.get(1)) {
        let message = message.as_string().unwrap_or_default();
        let lock = match op {
            Op::Acquire { lock, .. } | Op::Release { lock, .. } => lock,
        };
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
    items
        .into_iter()
        .map(|item| {
            item.as_i64()
                .ok_or_else(|| protocol_error(format!("non-integer reply {item:?}")))
        })
        .collect()
}

fn protocol_error(message: String) -> Error {
    Error::Redis(fred::error::Error::new(fred::error::ErrorKind::Parse, message))
}
