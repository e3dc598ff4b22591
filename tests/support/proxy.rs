//! The fault-injecting proxy of `relock::testing`, under the name the tests use.

pub use relock::testing::{in_front_of, Proxy};
