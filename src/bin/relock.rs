//! `relock`: an inspector for the locks relock keeps in Redis (work in progress).

fn main() {}
