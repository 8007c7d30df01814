//! plan (stub, being written).
