//! The Redis names of one lock. All share the hash tag `{name}`, so they live in one cluster slot.

use fred::bytes_utils::Str;
use std::sync::Arc;
use std::time::Duration;

use crate::util::telemetry;

/// The key of the lock hash, of its fence counter and the release channel.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    pub(crate) name: Str,
    pub(crate) lock: Str,
    pub(crate) fence: Str,
    pub(crate) channel: Str,
    pub(crate) kind: Kind,
}

/// What kind of hold the `lock` key of a [`LockKeys`] carries, which decides the scripts' operation
/// (see `scripts/batch.lua`).
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// A lock's hash. A refused waiter marks its holder, whose release then announces itself
    /// (see `scripts/acquire.lua`).
    Plain,
    /// A semaphore's permit holder key: renewed and released as a lock's hash is, and every release
    /// announced (waiters for permits leave no mark).
    Permit,
    /// The write lock of a read-write lock (`lock` is its write hash). `mark`: a refusal records
    /// the owner as a waiting writer, for this long (set for a caller that will wait; the record
    /// is then renewed as a hold of `watchdog_timeout`, whatever the acquisition's lease).
    Write { rw: Arc<RwKeys>, mark: Option<Duration> },
    /// One owner's read hold of a read-write lock (`lock` is that owner's reader key).
    Read(Arc<RwKeys>),
    /// A waiting writer's mark (`lock` is the waiting writers' hash, the field the owner id):
    /// renewed by the watchdog while the writer waits, released when it stops.
    Mark(Arc<RwKeys>),
    /// A fair lock (`lock` is its hash). `enqueue`: a refusal puts the owner in the queue, its
    /// place kept this long (as `Write`'s `mark`).
    Fair {
        fair: Arc<FairKeys>,
        enqueue: Option<Duration>,
    },
    /// A fair lock's waiter (`lock` is its waiter key, the field the owner id): its place in the
    /// queue lives while the watchdog renews it, and is given up when the waiter stops.
    Waiter(Arc<FairKeys>),
}

impl Kind {
    /// The primitive, for its figures, whose hold these keys are (a waiter's mark counts as its lock's).
    pub(crate) fn prim(&self) -> telemetry::Prim {
        match self {
            Kind::Plain => telemetry::Prim::Lock,
            Kind::Fair { .. } | Kind::Waiter(_) => telemetry::Prim::Fair,
            Kind::Read(_) => telemetry::Prim::Read,
            Kind::Write { .. } | Kind::Mark(_) => telemetry::Prim::Write,
            Kind::Permit => telemetry::Prim::Semaphore,
        }
    }
}

/// The Redis names of one fair lock (see `scripts/fair_acquire.lua`). All share the hash tag `{name}`.
#[derive(Debug)]
pub(crate) struct FairKeys {
    pub(crate) name: Str,
    /// The lock hash, as a plain lock's.
    pub(crate) lock: Str,
    pub(crate) fence: Str,
    /// The queue: a sorted set of waiting owner ids by arrival. A waiter's key is this followed by
    /// `:` and its owner id, with the waiter's lease as its TTL.
    pub(crate) queue: Str,
    pub(crate) channel: Str,
}

impl FairKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> FairKeys {
        let lock = format!("{prefix}:{{{name}}}:fair");
        FairKeys {
            name: name.into(),
            fence: format!("{lock}:fence").into(),
            queue: format!("{lock}:queue").into(),
            channel: format!("{lock}:released").into(),
            lock: lock.into(),
        }
    }

    /// The keys of the lock; `enqueue` as in [`Kind::Fair`].
    pub(crate) fn lock(self: &Arc<Self>, enqueue: Option<Duration>) -> LockKeys {
        LockKeys {
            name: self.name.clone(),
            lock: self.lock.clone(),
            fence: self.fence.clone(),
            channel: self.channel.clone(),
            kind: Kind::Fair {
                fair: self.clone(),
                enqueue,
            },
        }
    }

    /// The keys of the waiter `id`'s place in the queue.
    pub(crate) fn waiter(self: &Arc<Self>, id: &str) -> LockKeys {
        LockKeys {
            name: self.name.clone(),
            lock: format!("{}:{id}", self.queue).into(),
            fence: self.fence.clone(),
            channel: self.channel.clone(),
            kind: Kind::Waiter(self.clone()),
        }
    }
}

/// The Redis names of one read-write lock (see `scripts/rw_read.lua`). All share the hash tag
/// `{name}` (with a plain lock of the same name, whose keys they do not touch).
#[derive(Debug)]
pub(crate) struct RwKeys {
    pub(crate) name: Str,
    /// The write lock's hash.
    pub(crate) write: Str,
    pub(crate) fence: Str,
    /// The set of reader keys; a reader key is this followed by `:` and the owner id.
    pub(crate) readers: Str,
    /// The waiting writers' hash.
    pub(crate) waiting: Str,
    /// Where writers wait: every release of a hold of this lock is announced here.
    pub(crate) channel: Str,
    /// Where readers wait: `channel` followed by `:r` (see `scripts/rw_write_release.lua`).
    pub(crate) read_channel: Str,
}

impl RwKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> RwKeys {
        let write = format!("{prefix}:{{{name}}}:rw");
        RwKeys {
            name: name.into(),
            fence: format!("{write}:fence").into(),
            readers: format!("{write}:readers").into(),
            waiting: format!("{write}:writers").into(),
            channel: format!("{write}:released").into(),
            read_channel: format!("{write}:released:r").into(),
            write: write.into(),
        }
    }

    /// The keys of the write lock; `mark` as in [`Kind::Write`].
    pub(crate) fn write(self: &Arc<Self>, mark: Option<Duration>) -> LockKeys {
        LockKeys {
            name: self.name.clone(),
            lock: self.write.clone(),
            fence: self.fence.clone(),
            channel: self.channel.clone(),
            kind: Kind::Write {
                rw: self.clone(),
                mark,
            },
        }
    }

    /// The keys of the read side as a whole (its `lock` is the set of reader keys): what a read
    /// `Lock` carries until an owner's acquisition takes its own reader key.
    pub(crate) fn read_side(self: &Arc<Self>) -> LockKeys {
        LockKeys {
            name: self.name.clone(),
            lock: self.readers.clone(),
            fence: self.fence.clone(),
            channel: self.channel.clone(),
            kind: Kind::Read(self.clone()),
        }
    }

    /// The keys of the read hold of the owner `id` (its reader key stands where a lock hash would).
    pub(crate) fn reader(self: &Arc<Self>, id: &str) -> LockKeys {
        LockKeys {
            name: self.name.clone(),
            lock: format!("{}:{id}", self.readers).into(),
            fence: self.fence.clone(),
            channel: self.channel.clone(),
            kind: Kind::Read(self.clone()),
        }
    }

    /// The keys of a waiting writer's mark.
    pub(crate) fn mark(self: &Arc<Self>) -> LockKeys {
        LockKeys {
            name: self.name.clone(),
            lock: self.waiting.clone(),
            fence: self.fence.clone(),
            channel: self.channel.clone(),
            kind: Kind::Mark(self.clone()),
        }
    }
}

impl LockKeys {
    /// The channel a waiter of these keys waits on: a reader of a read-write lock waits apart from
    /// its writers; every other waiter on the channel its holder's release announces.
    pub(crate) fn wait_channel(&self) -> &Str {
        match &self.kind {
            Kind::Read(rw) => &rw.read_channel,
            _ => &self.channel,
        }
    }

    /// The keys of one permit holder of the semaphore `sem` (see [`SemaphoreKeys`]): its holder key
    /// stands where a lock hash would (renewed and released the same way), the index where the
    /// fence would (in the same slot; a release does not touch it), and the semaphore's channel.
    pub(crate) fn of_permit_holder(sem: &SemaphoreKeys, holder: &str) -> LockKeys {
        LockKeys {
            name: sem.name.clone(),
            lock: format!("{}:h:{holder}", sem.index).into(),
            fence: sem.index.clone(),
            channel: sem.channel.clone(),
            kind: Kind::Permit,
        }
    }

    pub(crate) fn new(prefix: &str, name: &str) -> LockKeys {
        let lock = format!("{prefix}:{{{name}}}");
        LockKeys {
            name: name.into(),
            fence: format!("{lock}:fence").into(),
            channel: format!("{lock}:released").into(),
            lock: lock.into(),
            kind: Kind::Plain,
        }
    }
}

/// The Redis names of one countdown latch: its hash and the channel that announces it opened. They
/// share the hash tag `{name}` (with a lock of the same name, whose keys they do not touch).
#[derive(Debug)]
pub(crate) struct LatchKeys {
    pub(crate) name: Str,
    pub(crate) latch: Str,
    pub(crate) channel: Str,
}

impl LatchKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> LatchKeys {
        let latch = format!("{prefix}:{{{name}}}:latch");
        LatchKeys {
            name: name.into(),
            channel: format!("{latch}:zero").into(),
            latch: latch.into(),
        }
    }
}

/// The Redis names of one semaphore: its index (the permits, and who holds how many), the prefix of
/// its holder keys (one per holder, with that holder's lease), and its release channel. All share
/// the hash tag `{name}`.
#[derive(Debug)]
pub(crate) struct SemaphoreKeys {
    pub(crate) name: Str,
    pub(crate) index: Str,
    pub(crate) channel: Str,
}

impl SemaphoreKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> SemaphoreKeys {
        let index = format!("{prefix}:{{{name}}}:sem");
        SemaphoreKeys {
            name: name.into(),
            channel: format!("{index}:released").into(),
            index: index.into(),
        }
    }
}

/// `parts` one after the other as a `Str`, in one allocation of its exact size and without `fmt`'s
/// machinery: a `format!` grows its string a few times and leaves spare capacity, which makes
/// `Str` allocate and copy once more. Every acquisition builds its owner id and its hold's field.
pub(crate) fn joined(parts: &[&str]) -> Str {
    let mut text = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        text.push_str(part);
    }
    // A `String` whose length is its capacity becomes a `Str` without a copy.
    Str::from(text)
}

/// `n` in decimal, written at the end of `buf`.
pub(crate) fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buf[at..]).unwrap_or_default()
}
