//! pyenv (stub, being written).
