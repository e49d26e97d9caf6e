//! Whose key client a table Iceberg encrypts itself uses for one principal's scan.
//!
//! ```text
//!  table key routed to        its key encryption keys are unwrapped by
//!  ───────────────────        ────────────────────────────────────────────
//!  the local provider         the engine's KMS ([kms]), as the catalog built the table
//!  a crypto provider P        P, for this principal, on every load (the table key
//!                             stays in P; P decides and audits each unwrap)
//! ```
//!
//! Used where a scan's table is resolved: the coordinator's [`crate::PolicyTableProvider`]
//! and a worker's [`crate::remote::scan_request`], so both ask the same provider.

use clearice_crypto::{CallContext, ProviderRef, ProviderRoute};
use clearice_iceberg::IcebergTableProvider;
use clearice_iceberg::native::ProviderKeys;
use std::sync::Arc;

/// `table` with its table key unwrapped by the provider `route` sends it to (`provider`:
/// the route resolved here), asked as `ctx`; a table that is not natively encrypted, or
/// whose key is the local provider's, as it is.
pub(crate) fn bind_table_key(
    table: IcebergTableProvider,
    route: &ProviderRoute,
    provider: &ProviderRef,
    ctx: CallContext,
) -> clearice_iceberg::Result<IcebergTableProvider> {
    let Some(key) = table.table_key_id() else {
        return Ok(table);
    };
    let owner = route.routes.get(key).unwrap_or(&route.name);
    if owner == clearice_policy::LOCAL_PROVIDER {
        return Ok(table);
    }
    table.with_key_client(Arc::new(ProviderKeys::new(Arc::clone(provider), ctx)))
}
