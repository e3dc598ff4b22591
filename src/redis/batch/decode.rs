//! The decoding of the batch script's replies: its flat list cut into each operation's reply.

use fred::types::Value;

use super::{Ints, Op, Reply};
use crate::Error;

/// The batch script's flat reply cut into each operation's reply, decoded as it is cut: each
/// operation's items follow their number (see `scripts/batch.lua`).
pub(super) fn split(flat: &[Value], batch: &[(Op, Reply)]) -> Result<Vec<Result<Ints, Error>>, Error> {
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
pub(super) fn cut(rest: &mut &[Value], op: &Op) -> Option<Result<Ints, Error>> {
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
pub(super) fn malformed(ops: usize) -> Error {
    protocol_error(format!("batch of {ops} got a malformed reply"))
}

/// One operation's reply: a list of integers, or `{-1, message}` for an error of that operation.
pub(super) fn decode(op: &Op, items: &[Value]) -> Result<Ints, Error> {
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

/// A reply that does not read as the batch script's, as fred reports one it cannot parse.
fn protocol_error(message: String) -> Error {
    Error::Redis(fred::error::Error::new(fred::error::ErrorKind::Parse, message))
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;
    use crate::redis::batch::op::{acquire, Announce};
    use crate::redis::keys::{Kind, LockKeys};

    fn release(lock: &'static str) -> (Op, Reply) {
        let op = Op::Release {
            lock: lock.into(),
            owner: "o".into(),
            target: 0,
            channel: "c".into(),
            kind: Kind::Plain,
            announce: Announce::IfMarked,
        };
        (op, oneshot::channel().0)
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
        let release = Op::release(&keys, &"o".into(), 0, Announce::IfMarked);
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
