//! The one error type of the crate.

use std::time::Duration;

/// Everything that can go wrong with a lock.
///
/// Bad input (`InvalidName`, `InvalidDuration`, `InvalidConfig`) is reported before any I/O, so it
/// never changes anything in Redis.
///
/// ```
/// use relock::Error;
///
/// let err = Error::Quorum { granted: 2, answered: 3, needed: 3, nodes: 5 };
/// assert!(err.to_string().contains("2 of 5"));
/// assert!(!err.is_bad_input());
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The owner does not hold the lock (any more): a release by a non-owner, or of a lease that was
    /// lost. Nothing was changed in Redis.
    #[error("the lock is not held by this owner")]
    NotHeld,
    /// The lease was lost while work ran under it (see [`LockGuard::until_lost`](crate::LockGuard::until_lost)).
    #[error("the lease of the lock was lost")]
    LeaseLost,
    /// A release of a hold whose lease this client knew was lost (renewals failed until it ran
    /// out, or a renewal found the lock gone or taken): answered at once, without asking a server
    /// that may be gone. Whatever Redis may still have of the hold is removed in the background.
    #[error(
        "the lock's lease was lost{} before this release (renewals failed, or found the lock gone or taken): it was not held any more",
        match ago {
            Some(ago) => format!(" {:.1} s ago", ago.as_secs_f64()),
            None => String::new(),
        }
    )]
    Lost {
        /// How long before the release the loss was found, if known.
        ago: Option<Duration>,
    },
    /// A lock name that cannot be used (empty, too long, or containing `{`, `}` or a control character).
    #[error("invalid lock name: {0}")]
    InvalidName(String),
    /// A duration outside the accepted range.
    #[error("invalid duration: {0}")]
    InvalidDuration(String),
    /// A configuration that cannot work.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// Redis did not answer within the configured bound.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Not enough Redis masters granted or answered (MultiLock).
    #[error(
        "quorum not reached: {granted} of {nodes} masters granted, {answered} answered, {needed} needed"
    )]
    Quorum {
        /// Masters that granted the request.
        granted: usize,
        /// Masters that answered at all.
        answered: usize,
        /// Masters needed for a majority.
        needed: usize,
        /// Masters in the quorum.
        nodes: usize,
    },
    /// Too few masters of a [`MultiLock`](crate::MultiLock) may vote: the others were seen
    /// starting (or restarting) less than a lease ago, and may have forgotten locks they granted, so
    /// they sit out until a lease has passed since (the restart quarantine, see
    /// [`QuorumConfig::restart_quarantine`](crate::QuorumConfig::restart_quarantine)). Nothing was
    /// sent. Waiting acquisitions wait it out within their bound.
    #[error(
        "quorum not reached: {voting} of {nodes} masters may vote, {needed} needed; the others started less than a lease ago and sit out the restart quarantine, which ends in {ends_in:?}"
    )]
    Quarantine {
        /// Masters that may vote now.
        voting: usize,
        /// Masters needed for a majority.
        needed: usize,
        /// Masters in the quorum.
        nodes: usize,
        /// How long until enough masters may vote.
        ends_in: Duration,
    },
    /// The key at the lock's name holds a value of another type, which relock does not touch.
    #[error("the key {0} holds a value that is not a relock lock (WRONGTYPE)")]
    WrongType(String),
    /// The owner asked for the write lock of a read-write lock while it holds its read lock. An
    /// upgrade would deadlock as soon as two readers tried it, so it is refused at once: release
    /// the read lock first (or take the write lock first: a writer may also read). Nothing was
    /// changed in Redis.
    #[error("the read-write lock {0} is read by this owner, which cannot take its write lock")]
    Upgrade(String),
    /// The owner asked for a lock it holds already, and the lock is not reentrant (see
    /// [`LockConfig::reentrant`](crate::LockConfig::reentrant)): waiting would wait for itself.
    /// Nothing was sent. Futures joined inside one task are one owner: give each its own
    /// [`Owner`](crate::Owner).
    #[error(
        "the lock {0} is held by this owner already and is not reentrant (futures joined in one task are one owner: give each its own Owner)"
    )]
    AlreadyHeld(String),
    /// Fewer replicas than [`sync_replicas`](crate::LockConfig::sync_replicas) acknowledged an
    /// acquisition within `sync_timeout`. The grant was undone at once on the primary (should that
    /// undo fail, it is retried in the background): the caller holds nothing.
    #[error("only {acked} of the {needed} replicas asked for acknowledged the acquisition in time")]
    ReplicaSync {
        /// Replicas that acknowledged.
        acked: usize,
        /// Replicas asked for.
        needed: usize,
    },
    /// A call of [`blocking`](crate::blocking) was made from inside an async runtime, where it would
    /// block a runtime thread (and could deadlock it): use the async API there.
    #[error("a blocking relock call was made from inside an async runtime; use the async API there")]
    InsideRuntime,
    /// The server at `addr` could not be reached at connect: the connection was refused, its host
    /// name did not resolve, or the TLS handshake failed (`reason` says which, as a sentence).
    /// Reported at the first failed connection, not at the end of the command timeout.
    #[error("could not connect to {addr}: {reason}")]
    Connect {
        /// The server, as `host:port`.
        addr: String,
        /// What went wrong.
        reason: String,
    },
    /// The client was shut down.
    #[error("the lock client was shut down")]
    Shutdown,
    /// An error from Redis or from the connection to it.
    #[error("redis error: {0}")]
    Redis(#[from] fred::error::Error),
}

impl Error {
    /// True for errors caused by the caller's input (name, durations, configuration).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidName(_) | Error::InvalidDuration(_) | Error::InvalidConfig(_)
        )
    }

    /// True for errors that may go away by themselves: Redis did not answer or could not be
    /// reached (a timeout, a connection error, a failover or a server loading its data), too few
    /// replicas or masters answered ([`ReplicaSync`](Error::ReplicaSync),
    /// [`Quorum`](Error::Quorum)), or masters sit out the restart quarantine
    /// ([`Quarantine`](Error::Quarantine)).
    ///
    /// A waiting acquisition (`acquire`, `try_acquire_for`) tries again after a transient error,
    /// with a growing pause, until its bound, and returns the last error only then; `acquire`,
    /// which has no bound of the caller's, keeps trying for one lease of errors in a row (or until
    /// a quarantine ends). Any other error (a key of another type, a user the server refuses, bad
    /// input, a shutdown) is returned at once.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Timeout(_)
            | Error::Quorum { .. }
            | Error::Quarantine { .. }
            | Error::ReplicaSync { .. }
            | Error::Connect { .. } => true,
            Error::Redis(err) => {
                use fred::error::ErrorKind;
                match err.kind() {
                    ErrorKind::IO
                    | ErrorKind::Timeout
                    | ErrorKind::Canceled
                    | ErrorKind::Cluster
                    | ErrorKind::Routing
                    | ErrorKind::Sentinel
                    | ErrorKind::Backpressure => true,
                    // The server's own word: busy with a script, loading its data, a cluster or a
                    // replica in the middle of a change.
                    _ => [
                        "LOADING",
                        "BUSY",
                        "TRYAGAIN",
                        "CLUSTERDOWN",
                        "MASTERDOWN",
                        "READONLY",
                        "MOVED",
                        "ASK ",
                    ]
                    .iter()
                    .any(|word| err.details().starts_with(word)),
                }
            }
            _ => false,
        }
    }

    /// An answer that decides the attempt as a refusal would, on the master that gave it: a key of
    /// another type, or an upgrade.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(self, Error::WrongType(_) | Error::Upgrade(_))
    }

    /// A reply of a shape the script in question never gives (another server, or a script of
    /// another version under the same name): a parse error.
    pub(crate) fn unexpected_reply(what: &str, reply: &dyn std::fmt::Debug) -> Error {
        Error::Redis(fred::error::Error::new(
            fred::error::ErrorKind::Parse,
            format!("unexpected reply to {what}: {reply:?}"),
        ))
    }

    /// Maps a Redis error about `key` to the most telling variant.
    pub(crate) fn from_redis(err: fred::error::Error, key: &str) -> Error {
        if err.details().contains("WRONGTYPE") {
            Error::WrongType(key.to_string())
        } else {
            Error::Redis(err)
        }
    }
}
