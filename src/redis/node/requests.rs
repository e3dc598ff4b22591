//! A node's direct requests (not batched): the fence, tokens, force-unlock, reads for `inspect`,
//! the scripts of the latch and the semaphore, and `SCAN`.

use fred::bytes_utils::Str;
use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::{ClusterHash, CustomCommand, Key, Value};

use super::calls::until_run;
use super::{unexpected, Node};
use crate::redis::keys::{Kind, LockKeys, SemaphoreKeys};
use crate::redis::scripts::{scripts, Script};
use crate::Error;

impl Node {
    pub(crate) async fn raise_fence(&self, keys: &LockKeys, token: u64) -> Result<(), Error> {
        let raise = self.script_synced::<i64>(
            &scripts().raise_fence,
            vec![Key::from(&keys.fence)],
            vec![Value::from(token.to_string())],
        );
        let reply = self.bounded_on(raise, &keys.fence).await?;
        // A fence that no replica has would fall back in a failover: not raised, for the quorum.
        self.link.check_acked(reply.acked)
    }

    /// Draws the fencing token of the hold `field` of a plain lock while it holds the lock here
    /// (`scripts/draw_token.lua`): `None` if the hold is not there. `in_step`: this node is one
    /// master of a quorum (see acquire.lua). A token that no replica has would fall back in a
    /// failover: not drawn, when writes are synced.
    pub(crate) async fn draw_token(
        &self,
        keys: &LockKeys,
        field: &Str,
        in_step: bool,
    ) -> Result<Option<u64>, Error> {
        let draw = self.script_synced::<Value>(
            &scripts().draw_token,
            vec![Key::from(&keys.lock), Key::from(&keys.fence)],
            vec![
                Value::String(field.clone()),
                Value::from_static_str(if in_step { "1" } else { "0" }),
            ],
        );
        let reply = self.bounded_on(draw, &keys.lock).await?;
        self.link.check_acked(reply.acked)?;
        // A number, or its digits (the clock's as read, see prelude.lua).
        let token = match &reply.value {
            Value::Integer(n) => u64::try_from(*n).ok(),
            other => other.as_str().and_then(|digits| digits.parse::<u64>().ok()),
        };
        match token {
            Some(0) => Ok(None),
            Some(token) => Ok(Some(token)),
            None => Err(Error::unexpected_reply("draw_token", &reply.value)),
        }
    }

    /// A guarded write (`scripts/guarded.lua`): checks and commands applied only while the hold
    /// `field` is in the lock hash `keys`, in one call. `keys` and `args` are the script's after its
    /// first (the lock) and first (the field). Confirmed by replicas when writes are synced.
    pub(crate) async fn guarded(
        &self,
        lock: &LockKeys,
        field: &Str,
        mut keys: Vec<Key>,
        mut args: Vec<Value>,
    ) -> Result<Value, Error> {
        keys.insert(0, Key::from(&lock.lock));
        args.insert(0, Value::String(field.clone()));
        let write = self.script_synced::<Value>(&scripts().guarded, keys, args);
        let reply = self.bounded_on(write, &lock.lock).await?;
        self.link.check_acked(reply.acked)?;
        Ok(reply.value)
    }

    /// The leader of an election (`scripts/election_leader.lua`): its term, value and the lease it
    /// has left, if anyone leads. `lock` is the election's lock hash, `record` the leader's record.
    pub(crate) async fn election_leader(
        &self,
        lock: &Str,
        record: &Str,
    ) -> Result<Option<(u64, String, Duration)>, Error> {
        let keys = vec![Key::from(lock), Key::from(record)];
        let read = self.script::<Value>(&scripts().election_leader, keys, Vec::new());
        let reply = self.bounded_on(read, lock).await?;
        match &reply {
            Value::Array(parts) if parts.is_empty() => Ok(None),
            Value::Array(parts) if parts.len() == 3 => {
                let term = parts[0].as_str().and_then(|t| t.parse::<u64>().ok());
                let value = parts[1].as_str().map(|v| v.to_string());
                let ms = parts[2].as_i64().and_then(|ms| u64::try_from(ms).ok());
                match (term, value, ms) {
                    (Some(term), Some(value), Some(ms)) => Ok(Some((term, value, Duration::from_millis(ms)))),
                    _ => Err(Error::unexpected_reply("election_leader", &reply)),
                }
            }
            _ => Err(Error::unexpected_reply("election_leader", &reply)),
        }
    }

    /// Publishes a plain lock's release message, for a release whose reply was lost: a lone
    /// release's `PUBLISH` follows its `HDEL`'s reply (see `batch::alone::release_alone`), so an
    /// `HDEL` that ran unanswered freed the lock without a word, and its resend finds nothing to
    /// remove. Without this, a waiter of another client would sleep until the lease it saw ran
    /// out. A message too many is one harmless wake-up.
    pub(crate) async fn announce_release(&self, keys: &LockKeys) -> Result<(), Error> {
        use fred::interfaces::PubsubInterface;
        let channel = keys.channel.clone();
        crate::util::telemetry::redis_call("release");
        let _heard: i64 = if self.link.topology.sharded() {
            self.bounded(self.link.batch.spublish(channel, "1")).await?
        } else {
            self.bounded(self.link.batch.publish(channel, "1")).await?
        };
        Ok(())
    }

    pub(crate) async fn force_unlock(&self, keys: &LockKeys) -> Result<bool, Error> {
        let args = vec![
            Value::from(keys.channel.clone()),
            Value::from(self.link.topology.publish()),
        ];
        let unlock = match &keys.kind {
            // Either side of a read-write lock frees the whole of it.
            Kind::Write { rw, .. } | Kind::Read(rw) => self.script(
                &scripts().rw_force_unlock,
                [&rw.write, &rw.readers, &rw.waiting].map(Key::from).to_vec(),
                args,
            ),
            Kind::Plain | Kind::Permit | Kind::Mark(_) | Kind::Fair { .. } | Kind::Waiter(_) => {
                // A fair lock's waiters are woken by name, only the head: here, all of them.
                let message = if matches!(keys.kind, Kind::Plain | Kind::Permit) {
                    "1"
                } else {
                    "*"
                };
                let mut args = args;
                args.push(Value::from(message));
                self.script(&scripts().force_unlock, vec![Key::from(&keys.lock)], args)
            }
        };
        let removed: i64 = self.bounded_on(unlock, &keys.lock).await?;
        Ok(removed == 1)
    }

    /// Whether the lock is held: for a read-write lock's write side, by a writer; for its read side,
    /// by a live reader.
    pub(crate) async fn is_locked(&self, keys: &LockKeys) -> Result<bool, Error> {
        let (rw, read) = match &keys.kind {
            Kind::Write { rw, .. } => (rw, false),
            Kind::Read(rw) => (rw, true),
            Kind::Plain | Kind::Permit | Kind::Mark(_) | Kind::Fair { .. } | Kind::Waiter(_) => {
                let found: i64 = self.bounded(self.link.cmd.exists(&*keys.lock)).await?;
                return Ok(found == 1);
            }
        };
        let state = self.script(
            &scripts().rw_state,
            vec![Key::from(&rw.write), Key::from(&rw.readers)],
            Vec::new(),
        );
        let state: Vec<i64> = self.bounded_on(state, &keys.lock).await?;
        match state.as_slice() {
            [writer, readers] => Ok(if read { *readers > 0 } else { *writer > 0 }),
            other => Err(unexpected("rw_state", other)),
        }
    }

    /// One lock as `scripts/inspect.lua` reads it (for `inspect/`): `keys` and `which` (its
    /// `ARGV[1]`) as that script takes them, within the node's bound.
    pub(crate) async fn read_lock(&self, keys: &[&Str], which: &'static str) -> Result<Value, Error> {
        let keys = keys.iter().map(|key| Key::from(*key)).collect();
        let call = self.script(&scripts().inspect, keys, vec![Value::from(which)]);
        self.bounded(call).await
    }

    /// One semaphore as `scripts/inspect_semaphore.lua` reads it (for `inspect/`), within the
    /// node's bound; an index of another type is [`Error::WrongType`].
    pub(crate) async fn read_semaphore(&self, keys: &SemaphoreKeys) -> Result<Value, Error> {
        let call = self.script(
            &scripts().inspect_semaphore,
            vec![Key::from(&keys.index)],
            Vec::new(),
        );
        self.bounded_on(call, &keys.index).await
    }

    /// Runs a script whose one key is `key` and whose reply is an integer (the latch's), within the
    /// node's bound; a key of another type is [`Error::WrongType`]. For scripts that are
    /// idempotent and keep no order with other calls (see [`script`](Node::script)).
    pub(crate) async fn run_on(&self, script: &Script, key: &str, args: Vec<Value>) -> Result<i64, Error> {
        let call = self.script(script, vec![Key::from(key)], args);
        self.bounded_on(call, key).await
    }

    /// Runs a script over `keys` (all in one slot) whose reply is a list of integers (the
    /// semaphore's), within the node's bound; a key of another type is [`Error::WrongType`].
    pub(crate) async fn run_list(
        &self,
        script: &Script,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Vec<i64>, Error> {
        let call = self.script(script, keys.iter().map(|k| Key::from(*k)).collect(), args);
        self.bounded_on(call, keys.first().copied().unwrap_or_default())
            .await
    }

    /// [`run_list`](Node::run_list) of a write that the batcher may undo: on the connection the
    /// batcher's calls take (the synced one, when writes are synced), so that an undo sent after a
    /// call whose reply was lost runs after that call, never before it (which would leave what
    /// the call wrote in place for a lease). It does not wait for replicas.
    pub(crate) async fn run_list_undoable(
        &self,
        script: &Script,
        keys: &[&str],
        args: Vec<Value>,
    ) -> Result<Vec<i64>, Error> {
        let call = async {
            let keys: Vec<Key> = keys.iter().map(|k| Key::from(*k)).collect();
            until_run(|| self.link.call_unwaited(script, keys.clone(), args.clone())).await
        };
        self.bounded_on(call, keys.first().copied().unwrap_or_default())
            .await
    }

    /// One page of `SCAN cursor MATCH pattern COUNT count` on `server` (the server, or one cluster
    /// primary), within the node's bound.
    pub(crate) async fn scan_page(
        &self,
        server: &WithOptions<Client>,
        cursor: &str,
        pattern: &str,
        count: i64,
    ) -> Result<Value, Error> {
        let command = CustomCommand::new_static("SCAN", ClusterHash::Random, false);
        let args: Vec<Value> = vec![
            cursor.into(),
            "MATCH".into(),
            pattern.into(),
            "COUNT".into(),
            count.into(),
        ];
        self.bounded(server.custom(command, args)).await
    }
}
