//! stats (stub, being written).
