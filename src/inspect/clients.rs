//! The holders' client records: who each holder's client is, as it describes itself, read once
//! per distinct client.

use super::scan::read_all;
use super::{ClientInfo, FairLockInfo, LockInfo, RwLockInfo, SemaphoreInfo};
use crate::{Error, LockClient};

impl LockClient {
    /// `items` with each holder's [`ClientInfo`] filled in from the clients' records (one read
    /// per distinct client, at most [`READS_IN_FLIGHT`](super::scan::READS_IN_FLIGHT) at once). A
    /// record that is not there, or not relock's, leaves `None`.
    pub(super) async fn with_clients<T: Holders>(&self, mut items: Vec<T>) -> Result<Vec<T>, Error> {
        let mut ids = std::collections::BTreeSet::new();
        for item in &mut items {
            item.each_client(&mut |id, _| {
                ids.insert(id.to_string());
            });
        }
        if ids.is_empty() {
            return Ok(items);
        }
        let (node, prefix) = (self.node(), self.config().get_key_prefix());
        let records = read_all(ids.into_iter().collect(), |id| async move {
            let key = crate::redis::identity::record_key(prefix, &id);
            let value = node.read_record(&key).await?;
            Ok(value
                .and_then(|value| crate::redis::identity::parse(&value))
                .map(|info| (id, info)))
        })
        .await?;
        let records: std::collections::HashMap<String, ClientInfo> = records.into_iter().collect();
        for item in &mut items {
            item.each_client(&mut |id, client| *client = records.get(id).cloned());
        }
        Ok(items)
    }
}

/// What has holders whose clients [`LockClient::with_clients`] looks up.
pub(super) trait Holders {
    /// Calls `f` with each holder's client id and its client slot.
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>));
}

impl Holders for LockInfo {
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>)) {
        for holder in &mut self.holders {
            f(&holder.client_id, &mut holder.client);
        }
    }
}

impl Holders for FairLockInfo {
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>)) {
        if let Some(lock) = &mut self.lock {
            lock.each_client(f);
        }
    }
}

impl Holders for RwLockInfo {
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>)) {
        if let Some(writer) = &mut self.writer {
            writer.each_client(f);
        }
        for reader in &mut self.readers {
            f(&reader.holder.client_id, &mut reader.holder.client);
        }
    }
}

impl Holders for SemaphoreInfo {
    fn each_client(&mut self, f: &mut dyn FnMut(&str, &mut Option<ClientInfo>)) {
        for holder in &mut self.holders {
            f(&holder.client_id, &mut holder.client);
        }
    }
}
