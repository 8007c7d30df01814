//! run (stub, being written).
