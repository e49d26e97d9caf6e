//! Flight SQL server (in progress).
