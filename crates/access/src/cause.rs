//! Reading DataFusion errors by the typed ClearIce error inside them.

/// The first cause of type `T` in an engine error: the error itself, its sources, and what
/// DataFusion's `External` wraps (ClearIce's own errors travel there). How callers decide
/// behaviour by error type (gRPC code, audit action) instead of by message.
pub fn cause_of<T: std::error::Error + 'static>(
    e: &datafusion::error::DataFusionError,
) -> Option<&T> {
    use datafusion::error::DataFusionError;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<T>() {
            return Some(t);
        }
        if let Some(DataFusionError::External(inner)) = err.downcast_ref::<DataFusionError>()
            && let Some(t) = inner.downcast_ref::<T>()
        {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

/// An error on one line.
pub fn one_line(e: &impl std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
