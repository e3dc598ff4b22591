//! What is held, read from Redis, for operators (work in progress).
