//! The operations of the batch script (see `scripts/batch.lua`): what a node's batcher carries.

use fred::bytes_utils::Str;

use crate::redis::keys::{Kind, LockKeys};

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
        /// Whether and how it is published.
        announce: Announce,
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

/// How a release is published, where its kind leaves a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    /// A plain lock's release is published only if a waiter marked the hold; the other kinds'
    /// always are.
    IfMarked,
    /// A plain lock's release is published even if no waiter marked the hold (this client has
    /// waiters of its own on the channel, who may have left no mark: see `Node::release`).
    Always,
    /// The undo of a grant that a refused round of a quorum made: published as `IfMarked` is, with
    /// a message that says it is an undo (`~` before the usual one), since it frees nothing a
    /// holder had. A waiter woken by it waits out its rate limit (see `lock::acquire`).
    Undo,
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
    /// handoffs that are not recorded one by one (see `engine/core/handoff.rs`).
    pub(crate) fence_to: u64,
}

impl Op {
    /// The release of a hold of `keys`, to `target`, published as `announce` says.
    pub(crate) fn release(keys: &LockKeys, owner: &Str, target: i64, announce: Announce) -> Op {
        Op::Release {
            lock: keys.lock.clone(),
            owner: owner.clone(),
            target,
            channel: keys.channel.clone(),
            kind: keys.kind.clone(),
            announce,
        }
    }

    /// A plain lock's unannounced release to count 0 (see
    /// [`release_alone`](super::alone::release_alone)): its lock, owner and channel; else the
    /// operation.
    // The operation comes back as it went in, moved (as large as any `Op`).
    #[allow(clippy::result_large_err)]
    pub(super) fn into_lone_release(self) -> Result<(Str, Str, Str), Op> {
        match self {
            Op::Release {
                lock,
                owner,
                target: 0,
                channel,
                kind: Kind::Plain,
                announce: Announce::IfMarked,
            } => Ok((lock, owner, channel)),
            op => Err(op),
        }
    }

    /// The key of the operation's lock: it decides the call's slot, and errors name it.
    pub(super) fn lock(&self) -> &str {
        match self {
            Op::Acquire { lock, .. } | Op::Release { lock, .. } | Op::Transfer { lock, .. } => lock,
        }
    }
}

/// A plain lock's acquisition by `owner` to `target`, on a single master.
#[cfg(test)]
pub(super) fn acquire(keys: &LockKeys, owner: &Str, target: i64) -> Op {
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
