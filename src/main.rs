//! qdarts command line.
fn main() {}
