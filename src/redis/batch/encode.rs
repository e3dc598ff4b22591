//! The encoding of operations into the batch script's keys and arguments: each operation by its
//! kind, the common ones in short (see `scripts/batch.lua`); a batch of only short ones goes in
//! runs (see `runs`).

use fred::bytes_utils::Str;
use std::time::Duration;

use fred::types::{Key, Value};

use super::{Announce, Granted, Op};
use crate::redis::keys::Kind;
use crate::redis::scripts::{scripts, Script};

/// One call of the batch script: its keys and arguments, and which batch script runs them.
pub(super) struct Call {
    pub(super) keys: Vec<Key>,
    pub(super) args: Vec<Value>,
    /// Every operation is a plain lock's: the lighter [`BATCH_PLAIN`](crate::redis::scripts::BATCH_PLAIN)
    /// runs them.
    pub(super) plain: bool,
}

/// The batch script for calls of which `plain` says whether all are plain.
pub(super) fn batch_script(plain: bool) -> &'static Script {
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
pub(super) fn encode_alone(op: &Op, publish: &'static str) -> Call {
    let mut call = encode(std::iter::once(op), publish);
    if let Some(Short::Acquire { .. }) = op.short() {
        call.args.drain(..2);
    }
    call
}

/// An operation that goes in short (see `scripts/batch.lua`).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Short {
    /// A fresh acquisition of a plain lock (`A`, or `Q` in step): no target.
    Acquire { lease_ms: i64, in_step: bool },
    /// A plain lock's unannounced full release on its own channel (`R`): neither target nor
    /// channel (the script makes it from the lock's name).
    Release,
}

impl Op {
    /// How this operation goes in short, if it does.
    pub(super) fn short(&self) -> Option<Short> {
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
                announce: Announce::IfMarked,
                ..
            } if is_lock_channel(lock, channel) => Some(Short::Release),
            _ => None,
        }
    }
}

/// The call of the batch script for `ops`.
pub(super) fn encode<'a>(ops: impl ExactSizeIterator<Item = &'a Op>, publish: &'static str) -> Call {
    let mut call = Call {
        keys: Vec::with_capacity(ops.len() * 2),
        args: Vec::with_capacity(2 + ops.len() * 4),
        plain: true,
    };
    call.args.push(Value::from(ops.len() as i64));
    // Static strings are sent without a copy.
    call.args.push(Value::from_static_str(publish));
    for op in ops {
        // The common operations in short (see `scripts/batch.lua`): a fresh acquisition without its
        // target, a plain lock's full release with neither target nor channel.
        match (op.short(), op) {
            (
                Some(Short::Acquire { lease_ms, in_step }),
                Op::Acquire {
                    lock, fence, owner, ..
                },
            ) => call.short_acquire(lock, fence, owner, lease_ms, in_step),
            (Some(Short::Release), Op::Release { lock, owner, .. }) => call.short_release(lock, owner),
            (
                _,
                Op::Acquire {
                    lock,
                    fence,
                    owner,
                    lease_ms,
                    target,
                    in_step,
                    kind,
                    ..
                },
            ) => {
                let (code, mark_lease) = call.acquire_keys(kind, *in_step, lock, fence);
                call.acquire_args(code, owner, *lease_ms, *target, mark_lease);
            }
            (
                _,
                Op::Release {
                    lock,
                    owner,
                    target,
                    channel,
                    kind,
                    announce,
                },
            ) => {
                let code = call.release_keys(kind, *announce, lock);
                call.release_args(code, owner, *target, channel);
            }
            (
                _,
                Op::Transfer {
                    lock,
                    fence,
                    channel,
                    from,
                    to,
                    lease_ms,
                    granted,
                },
            ) => {
                call.keys.extend([Key::from(lock), Key::from(fence)]);
                call.transfer_args(from, to, *lease_ms, *granted, channel);
            }
        }
    }
    call
}

/// [`encode`]'s steps: each operation's keys and arguments, appended to the call.
impl Call {
    /// A fresh acquisition of a plain lock in short (`A`, or `Q` in step): no target.
    fn short_acquire(&mut self, lock: &Str, fence: &Str, owner: &Str, lease_ms: i64, in_step: bool) {
        self.keys.extend([Key::from(lock), Key::from(fence)]);
        let code = if in_step { "Q" } else { "A" };
        self.args.extend([
            Value::from_static_str(code),
            Value::from(owner.clone()),
            Value::from(lease_ms),
        ]);
    }

    /// A plain lock's unannounced full release on its own channel in short (`R`): neither target
    /// nor channel.
    fn short_release(&mut self, lock: &Str, owner: &Str) {
        self.keys.push(Key::from(lock));
        self.args
            .extend([Value::from_static_str("R"), Value::from(owner.clone())]);
    }

    /// An acquisition's keys, which its kind decides, and its code; for a marking acquisition,
    /// also how long its mark lives (its fifth argument).
    fn acquire_keys(
        &mut self,
        kind: &Kind,
        in_step: bool,
        lock: &Str,
        fence: &Str,
    ) -> (&'static str, Option<Duration>) {
        match kind {
            Kind::Plain | Kind::Permit | Kind::Mark(_) | Kind::Waiter(_) => {
                self.keys.extend([Key::from(lock), Key::from(fence)]);
                (if in_step { "q" } else { "a" }, None)
            }
            Kind::Write { rw, mark } => {
                self.keys
                    .extend([lock, fence, &rw.readers, &rw.waiting].map(Key::from));
                let code = match (in_step, mark.is_some()) {
                    (false, false) => "w",
                    (false, true) => "W",
                    (true, false) => "v",
                    (true, true) => "V",
                };
                (code, *mark)
            }
            Kind::Read(rw) => {
                self.keys
                    .extend([lock, &rw.write, &rw.readers, &rw.waiting].map(Key::from));
                ("d", None)
            }
            Kind::Fair { fair, enqueue } => {
                self.keys.extend([lock, fence, &fair.queue].map(Key::from));
                let code = match (in_step, enqueue.is_some()) {
                    (false, false) => "f",
                    (false, true) => "F",
                    (true, false) => "g",
                    (true, true) => "G",
                };
                (code, *enqueue)
            }
        }
    }

    /// An acquisition's arguments in full: its code, owner, lease and target, and a marking
    /// acquisition's `mark_lease`.
    fn acquire_args(
        &mut self,
        code: &'static str,
        owner: &Str,
        lease_ms: i64,
        target: i64,
        mark_lease: Option<Duration>,
    ) {
        self.plain &= matches!(code, "a" | "q");
        self.args.extend([
            Value::from_static_str(code),
            Value::from(owner.clone()),
            Value::from(lease_ms),
            Value::from(target),
        ]);
        if let Some(mark_lease) = mark_lease {
            self.args
                .push(Value::from(mark_lease.as_millis().min(i64::MAX as u128) as i64));
        }
    }

    /// A release's keys, the lock's and those its kind adds, and its code.
    fn release_keys(&mut self, kind: &Kind, announce: Announce, lock: &Str) -> &'static str {
        self.keys.push(Key::from(lock));
        let undo = announce == Announce::Undo;
        match kind {
            Kind::Plain => match announce {
                Announce::IfMarked => "r",
                Announce::Always => "p",
                Announce::Undo => "y",
            },
            Kind::Permit => "p",
            Kind::Write { rw, .. } => {
                self.keys.push(Key::from(&rw.waiting));
                if undo {
                    "O"
                } else {
                    "o"
                }
            }
            Kind::Mark(rw) => {
                self.keys.push(Key::from(&rw.write));
                "m"
            }
            Kind::Read(rw) => {
                self.keys.push(Key::from(&rw.readers));
                if undo {
                    "X"
                } else {
                    "x"
                }
            }
            Kind::Fair { fair, .. } => {
                self.keys.push(Key::from(&fair.queue));
                "h"
            }
            Kind::Waiter(fair) => {
                self.keys.extend([Key::from(&fair.queue), Key::from(&fair.lock)]);
                "z"
            }
        }
    }

    /// A release's arguments in full: its code, owner, target and channel.
    fn release_args(&mut self, code: &'static str, owner: &Str, target: i64, channel: &Str) {
        self.plain &= matches!(code, "r" | "p" | "y");
        self.args.extend([
            Value::from_static_str(code),
            Value::from(owner.clone()),
            Value::from(target),
            Value::from(channel.clone()),
        ]);
    }

    /// A transfer's arguments: `t` with the channel, or `u` with what the client `granted`.
    fn transfer_args(
        &mut self,
        from: &Str,
        to: &Str,
        lease_ms: i64,
        granted: Option<Granted>,
        channel: &Str,
    ) {
        let op = if granted.is_some() { "u" } else { "t" };
        self.args.extend([
            Value::from_static_str(op),
            Value::from(from.clone()),
            Value::from(to.clone()),
            Value::from(lease_ms),
        ]);
        match granted {
            // As digits: the script compares them with the fence as strings.
            Some(granted) => self.args.extend([
                Value::from(granted.token.to_string()),
                match granted.expect {
                    Some(expect) => Value::from(expect.to_string()),
                    None => Value::from_static_str(""),
                },
                Value::from(granted.fence_to.to_string()),
            ]),
            None => self.args.push(Value::from(channel.clone())),
        }
    }
}

/// Whether `channel` is `lock` followed by `:released` (as `LockKeys::new` names a lock's channel),
/// which the batch script makes itself for the short release `R`.
fn is_lock_channel(lock: &str, channel: &str) -> bool {
    channel.strip_prefix(lock).is_some_and(|rest| rest == ":released")
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::redis::batch::op::acquire;
    use crate::redis::keys::LockKeys;

    /// The owner of every operation here.
    pub(in crate::redis::batch) fn owner() -> Str {
        Str::from("client:t1:1")
    }

    /// A call's arguments as strings.
    pub(in crate::redis::batch) fn strings(call: &Call) -> Vec<String> {
        call.args
            .iter()
            .map(|v| v.as_string().unwrap_or_default())
            .collect()
    }

    /// An undo is never sent in short (its message differs), and keeps its kind's keys: a plain
    /// lock's goes to the plain script, a read-write lock's sides to the full one.
    #[test]
    fn undos_have_codes_of_their_own() {
        let keys = LockKeys::new("relock", "stock");
        let rw = std::sync::Arc::new(crate::redis::keys::RwKeys::new("relock", "stock"));
        let owner = owner();
        let undo = |keys: &LockKeys| {
            let call = encode([Op::release(keys, &owner, 0, Announce::Undo)].iter(), "PUBLISH");
            (strings(&call)[2].clone(), call.keys.len(), call.plain)
        };
        assert_eq!(undo(&keys), ("y".to_string(), 1, true));
        assert_eq!(undo(&rw.write(None)), ("O".to_string(), 2, false));
        assert_eq!(undo(&rw.reader("r1")), ("X".to_string(), 2, false));
    }

    /// The common operations go in short: a fresh acquisition without its target, a plain lock's
    /// full release with neither target nor channel (the script makes it from the lock's name);
    /// any other keeps every argument.
    #[test]
    fn the_common_operations_are_encoded_in_short() {
        let keys = LockKeys::new("relock", "stock");
        assert!(is_lock_channel(&keys.lock, &keys.channel));
        let owner = owner();
        let ops = [
            acquire(&keys, &owner, 1),
            Op::release(&keys, &owner, 0, Announce::IfMarked),
            acquire(&keys, &owner, 2),
            Op::release(&keys, &owner, 1, Announce::IfMarked),
            Op::release(&keys, &owner, 0, Announce::Always),
        ];
        let call = encode(ops.iter(), "PUBLISH");
        let expect = [
            &["5", "PUBLISH"][..],
            &["A", "client:t1:1", "30000"],
            &["R", "client:t1:1"],
            &["a", "client:t1:1", "30000", "2"],
            &["r", "client:t1:1", "1", "relock:{stock}:released"],
            &["p", "client:t1:1", "0", "relock:{stock}:released"],
        ]
        .concat();
        assert_eq!(strings(&call), expect);
        assert_eq!(call.keys.len(), 2 + 1 + 2 + 1 + 1);
        assert!(call.plain);

        // A channel that is not the lock's own keeps the long form.
        let mut other = Op::release(&keys, &owner, 0, Announce::IfMarked);
        if let Op::Release { channel, .. } = &mut other {
            *channel = "elsewhere".into();
        }
        let call = encode([other].iter(), "PUBLISH");
        assert_eq!(call.args[2].as_str().as_deref(), Some("r"));
        assert_eq!(call.args.len(), 2 + 4);
    }
}
