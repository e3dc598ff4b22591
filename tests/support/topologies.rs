//! The deployments of `relock::testing` (a Redis Cluster, a primary with replicas, a Sentinel
//! group), under the names the tests use.

pub use relock::testing::{Cluster as RedisCluster, Replicated, SentinelGroup};
