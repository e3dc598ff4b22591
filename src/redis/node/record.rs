//! The client's record in Redis (see `redis/identity.rs`): one string key with a TTL, written, read and
//! removed through a node.

use fred::bytes_utils::Str;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use fred::types::Key;

use super::Node;
use crate::Error;

impl Node {
    /// Sets the string `key` to `value` with a TTL of `lease` (a client's record, see
    /// `redis/identity.rs`): one `SET … PX`, bounded by the node's timeout.
    pub(crate) async fn write_record(&self, key: &Str, value: &Str, lease: Duration) -> Result<(), Error> {
        let ms = lease.as_millis().clamp(1, i64::MAX as u128) as i64;
        self.link
            .cmd
            .set::<(), _, _>(
                Key::from(key),
                value.clone(),
                Some(fred::types::Expiration::PX(ms)),
                None,
                false,
            )
            .await
            .map_err(|err| self.link.redis_error(err))
    }

    /// Removes the key `key` (a client's record, as its client shuts down). Best effort.
    pub(crate) async fn remove_record(&self, key: &Str) {
        if let Err(err) = self.link.cmd.del::<i64, _>(Key::from(key)).await {
            tracing::debug!(%err, "the client's record was not removed");
        }
    }

    /// The string at `key` (a client's record), if it is one: `None` if there is none or it
    /// holds another type.
    pub(crate) async fn read_record(&self, key: &str) -> Result<Option<String>, Error> {
        match self.link.cmd.get::<Option<String>, _>(key).await {
            Ok(value) => Ok(value),
            Err(err) if err.details().starts_with("WRONGTYPE") => Ok(None),
            Err(err) => Err(self.link.redis_error(err)),
        }
    }
}
