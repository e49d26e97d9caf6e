//! Integration tests of the engine against real files: the PyArrow/PyIceberg interop
//! lake, parquet-testing's encrypted files, and demo lakes written by ClearIce.
#![allow(clippy::unwrap_used, reason = "tests: a panic is how a test fails")]
// Tests may block: they are not async workers serving anyone.
#![allow(clippy::disallowed_methods)]

mod cluster;
mod cluster_budget;
mod cluster_replay;
mod cluster_tls;
mod common;
mod confine;
mod demo;
mod hms;
mod interop;
mod keyed_mask;
mod layout;
mod memory;
mod native;
mod parquet_testing;
mod policy;
mod postgres;
mod pyarrow;
mod rest;
mod rotation;
mod row_filter;
mod row_filter_writes;
mod s3;
mod spark;
mod statistics;
mod tags;
mod tamper;
