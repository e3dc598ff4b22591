//! Small tools every layer uses: deadlines on the monotonic clock, a small inline collection, and
//! telemetry (metrics, spans, labels).
//!
//! May use: the shared vocabulary (`error`, `config`) only.

pub(crate) mod deadline;
pub(crate) mod few;
pub(crate) mod telemetry;
