//! spec (stub, being written).
