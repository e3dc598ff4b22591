//! Guarded writes: commands that Redis applies only while a hold still holds its lock, checked and
//! written in one script call on the lock's own server and slot (`scripts/guarded.lua`).

use fred::types::{Key, Value};
use std::sync::Arc;

use tokio::time::Instant;

use crate::engine::core::Core;
use crate::engine::hold::Hold;
use crate::Error;

/// What a guarded write came to, while the hold held its lock.
pub(crate) enum Guarded {
    /// Applied: each command's reply, in order.
    Applied(Vec<Value>),
    /// A check did not hold: nothing was applied.
    Declined,
}

impl Core {
    /// Runs the checks and commands of `keys` and `args` (see `scripts/guarded.lua`) only while
    /// generation `gen` of `hold` holds its lock in Redis. `Err(LeaseLost)` if it does not (known
    /// here, or found in Redis: then the hold ends as lost), with nothing applied. One master only:
    /// a write cannot span the masters of a quorum.
    ///
    /// Bounded as an attempt is. A timeout leaves it unknown whether the write was applied, as
    /// for any write to Redis; it is not sent again.
    pub(crate) async fn guarded(
        self: &Arc<Self>,
        hold: &Arc<Hold>,
        gen: u64,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<Guarded, Error> {
        let current = |hold: &Hold| {
            let st = hold.state.lock();
            st.gen == gen && st.active() && st.deadline > Instant::now()
        };
        if !current(hold) {
            return Err(Error::LeaseLost);
        }
        let _ops = self.named_in_redis(hold).await;
        if !current(hold) {
            return Err(Error::LeaseLost);
        }
        let field = hold.state.lock().field.clone();
        let start = Instant::now();
        let bound = start + self.masters.attempt_bound();
        let write = self.masters.nodes[0].guarded(&hold.keys, &field, keys, args);
        let reply = self
            .within(Some(bound), write)
            .await
            .unwrap_or_else(|| Err(Error::Timeout(bound - start)))?;
        match reply {
            Value::Array(mut parts) if !parts.is_empty() => match (parts.remove(0).as_i64(), parts.pop()) {
                (Some(1), Some(Value::Array(replies))) => Ok(Guarded::Applied(replies)),
                (Some(1), Some(_)) => Ok(Guarded::Applied(Vec::new())),
                (Some(2), _) => Ok(Guarded::Declined),
                (Some(0), _) => {
                    hold.mark_lost(gen, "the lock was found released or taken by a guarded write");
                    Err(Error::LeaseLost)
                }
                _ => Err(Error::unexpected_reply("guarded", &Value::Null)),
            },
            other => Err(Error::unexpected_reply("guarded", &other)),
        }
    }
}
