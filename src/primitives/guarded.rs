//! Writes guarded by the lock: [`Tx`], the checks and commands that
//! [`LockGuard::atomically`](crate::LockGuard::atomically) applies only while its hold is current.

use fred::types::{Key, Value};

use crate::Error;

/// The checks and commands of one guarded write, built in the closure given to
/// [`LockGuard::atomically`](crate::LockGuard::atomically). Redis runs them in one script call,
/// only while the guard's hold holds its lock: same owner, same generation, lease not run out.
///
/// Every key must live in the lock's slot: give it the lock's name as its hash tag (`stock:{sku-42}`
/// for the lock `sku-42`, whose key is `relock:{sku-42}`). That makes the write work unchanged on a
/// cluster; a key of another slot is refused before anything is sent.
///
/// The checks (`when_*`) all run first: if one does not hold, nothing is applied. Then the
/// commands, in order. A command that fails ends the write with its error, and the commands before
/// it stay applied, as in `MULTI`/`EXEC`.
#[derive(Debug, Default)]
pub struct Tx {
    /// Each check's key, then each command's keys, in order.
    keys: Vec<String>,
    checks: Vec<(&'static str, String)>,
    /// Each command: its name, how many keys it takes from `keys`, and its arguments.
    commands: Vec<(String, usize, Vec<String>)>,
}

impl Tx {
    /// Applies the write only if the integer at `key` (a missing key counts as 0) is at least
    /// `min`: the inventory's "enough in stock" check.
    pub fn when_at_least(&mut self, key: &str, min: i64) -> &mut Self {
        self.keys.push(key.to_string());
        self.checks.push(("min", min.to_string()));
        self
    }

    /// Applies the write only if the string at `key` is `value`.
    pub fn when_equal(&mut self, key: &str, value: &str) -> &mut Self {
        self.keys.push(key.to_string());
        self.checks.push(("eq", value.to_string()));
        self
    }

    /// Applies the write only if `key` does not exist.
    pub fn when_absent(&mut self, key: &str) -> &mut Self {
        self.keys.push(key.to_string());
        self.checks.push(("absent", String::new()));
        self
    }

    /// Any command: its name, its keys (which come first among its arguments, as in `SET key
    /// value`), and its other arguments.
    pub fn command(&mut self, name: &str, keys: &[&str], args: &[&str]) -> &mut Self {
        self.keys.extend(keys.iter().map(|k| k.to_string()));
        let args = args.iter().map(|a| a.to_string()).collect();
        self.commands.push((name.to_string(), keys.len(), args));
        self
    }

    /// `SET key value`.
    pub fn set(&mut self, key: &str, value: &str) -> &mut Self {
        self.command("SET", &[key], &[value])
    }

    /// `DEL key`.
    pub fn del(&mut self, key: &str) -> &mut Self {
        self.command("DEL", &[key], &[])
    }

    /// `INCRBY key by`.
    pub fn incr_by(&mut self, key: &str, by: i64) -> &mut Self {
        self.command("INCRBY", &[key], &[&by.to_string()])
    }

    /// `DECRBY key by`.
    pub fn decr_by(&mut self, key: &str, by: i64) -> &mut Self {
        self.command("DECRBY", &[key], &[&by.to_string()])
    }

    /// `HSET key field value`.
    pub fn hset(&mut self, key: &str, field: &str, value: &str) -> &mut Self {
        self.command("HSET", &[key], &[field, value])
    }

    /// `RPUSH key value`.
    pub fn rpush(&mut self, key: &str, value: &str) -> &mut Self {
        self.command("RPUSH", &[key], &[value])
    }

    /// The checks' and commands' keys, if every one lives in the slot of `lock` (the lock's key):
    /// else the error that names the first that does not, and the hash tag to give it.
    pub(crate) fn keys_in_slot_of(&self, lock: &str, name: &str) -> Result<Vec<Key>, Error> {
        let slot = fred::util::redis_keyslot(lock.as_bytes());
        match self
            .keys
            .iter()
            .find(|key| fred::util::redis_keyslot(key.as_bytes()) != slot)
        {
            Some(key) => Err(Error::InvalidConfig(format!(
                "the key {key:?} of a guarded write is not in the slot of lock {name:?}: \
                 give it the lock's hash tag, as \"{key}:{{{}}}\"",
                hash_tag(lock)
            ))),
            None => Ok(self.keys.iter().map(|key| Key::from(key.as_str())).collect()),
        }
    }

    /// The script's arguments after the hold's field (see `scripts/guarded.lua`).
    pub(crate) fn args(&self) -> Vec<Value> {
        let mut args = vec![
            Value::from(self.checks.len() as i64),
            Value::from(self.commands.len() as i64),
        ];
        for (kind, value) in &self.checks {
            args.push(Value::from_static_str(kind));
            args.push(Value::from(value.as_str()));
        }
        for (name, keys, rest) in &self.commands {
            args.push(Value::from(name.as_str()));
            args.push(Value::from(*keys as i64));
            args.push(Value::from(rest.len() as i64));
            args.extend(rest.iter().map(|a| Value::from(a.as_str())));
        }
        args
    }
}

/// The hash tag of `key` as Redis Cluster reads it: what stands between its first `{` and the
/// first `}` after it (a lock's key is `prefix:{name}`), else the whole key.
fn hash_tag(key: &str) -> &str {
    let tag = key
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(tag, _)| tag);
    match tag {
        Some(tag) if !tag.is_empty() => tag,
        _ => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_outside_the_locks_slot_are_refused_with_the_tag_to_use() {
        let mut tx = Tx::default();
        tx.decr_by("stock:{sku-42}", 1).rpush("orders", "o-1");
        let err = tx.keys_in_slot_of("relock:{sku-42}", "sku-42").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("\"orders\"") && text.contains("orders:{sku-42}"),
            "{text}"
        );
        let mut tx = Tx::default();
        tx.when_at_least("stock:{sku-42}", 1).decr_by("stock:{sku-42}", 1);
        assert_eq!(tx.keys_in_slot_of("relock:{sku-42}", "sku-42").unwrap().len(), 2);
        assert_eq!(hash_tag("relock:{sku-42}"), "sku-42");
        assert_eq!(hash_tag("plain"), "plain");
    }
}
