//! The process's memory pool (`[execution]`): what every statement's operators reserve
//! from, and the knob a refusal names.

use std::num::NonZeroUsize;
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    FairSpillPool, GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
    TrackConsumersPool, UnboundedMemoryPool,
};

use crate::config::{ExecutionConfig, MemoryPoolKind};

/// Unbounded unless `[execution] memory_limit_mb` is set; a bounded pool's refusal names
/// its five largest consumers and the setting.
pub(crate) fn pool(execution: &ExecutionConfig) -> Arc<dyn MemoryPool> {
    let Some(mb) = execution.memory_limit_mb.filter(|&mb| mb > 0) else {
        return Arc::new(UnboundedMemoryPool::default());
    };
    let bytes = usize::try_from(mb)
        .unwrap_or(usize::MAX)
        .saturating_mul(1 << 20);
    let top = NonZeroUsize::new(5).expect("5 is not zero");
    let inner: Arc<dyn MemoryPool> = match execution.memory_pool {
        MemoryPoolKind::Fair => Arc::new(TrackConsumersPool::new(FairSpillPool::new(bytes), top)),
        MemoryPoolKind::Greedy => {
            Arc::new(TrackConsumersPool::new(GreedyMemoryPool::new(bytes), top))
        }
    };
    Arc::new(ProcessPool { inner, mb })
}

/// A bounded pool whose refusals say which setting bounds it.
#[derive(Debug)]
struct ProcessPool {
    inner: Arc<dyn MemoryPool>,
    mb: u64,
}

impl MemoryPool for ProcessPool {
    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.inner.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.inner
            .try_grow(reservation, additional)
            .map_err(|e| match e {
                DataFusionError::ResourcesExhausted(m) => {
                    DataFusionError::ResourcesExhausted(format!(
                        "{m} (the process's memory pool of {} MiB, [execution] memory_limit_mb)",
                        self.mb
                    ))
                }
                e => e,
            })
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.inner.memory_limit()
    }
}
