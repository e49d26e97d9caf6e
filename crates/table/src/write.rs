//! Encrypted writes (see below).
