//! Cancellation: running result streams registered under their ticket, so that
//! `CancelFlightInfo` can abort them (dropping a stream cancels its query).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Abort handles of running results, by ticket bytes.
pub(crate) type Running = Arc<Mutex<HashMap<Vec<u8>, Vec<futures::stream::AbortHandle>>>>;

/// Removes a result's cancel handle when its stream ends or is dropped.
pub(crate) struct Unregister {
    pub(crate) running: Running,
    pub(crate) ticket: Vec<u8>,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        if let Ok(mut r) = self.running.lock() {
            r.remove(&self.ticket);
        }
    }
}
