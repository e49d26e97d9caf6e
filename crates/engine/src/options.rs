//! ClearIce's own session options: `SET clearice.<name> = <value>`, next to DataFusion's
//! `datafusion.*` (a DataFusion config extension; confined sessions may not set them).

use datafusion::common::config::ConfigExtension;
use datafusion::common::extensions_options;

extensions_options! {
    /// ClearIce's own session options (`SET clearice.<name> = <value>`).
    pub struct ClearIceOptions {
        /// Evaluate the dynamic filters of hash joins and TopK on the rows of the scans
        /// they reach ([`DynamicFilterExec`](crate::DynamicFilterExec)), not only on
        /// file and row-group statistics. Has no effect with `datafusion.execution.parquet.pushdown_filters` on: the
        /// Parquet reader then evaluates them itself.
        pub row_level_dynamic_filters: bool, default = true
    }
}

impl ConfigExtension for ClearIceOptions {
    const PREFIX: &'static str = "clearice";
}
