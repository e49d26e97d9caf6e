//! ClearIce's error classes across the wire: datafusion-distributed sends a worker's
//! error as its variant and text, so a ClearIce error (a denial, a tampered file, a key
//! the KMS refuses) would reach the coordinator as an untyped external error. A worker
//! therefore tags each error of a stage with its class ([`ClassifiedExec`]), and the
//! coordinator turns a tagged error back into [`ClusterError::OnWorker`] of that class.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use clearice_access::ErrorClass;
use clearice_iceberg::exec::only_child;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use crate::error::ClusterError;

/// How a worker's engine classifies its errors: the class, and the one-line message its
/// front ends would show.
pub type Classifier = Arc<dyn Fn(&DataFusionError) -> (ErrorClass, String) + Send + Sync>;

/// Starts the text of a tagged error: `clearice-error-class=<name>; <one-line message>`.
const TAG: &str = "clearice-error-class=";

/// A worker's error as it travels (its text is the tag and the message).
#[derive(Debug)]
struct Tagged(String);

impl fmt::Display for Tagged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Tagged {}

/// The tagged form of `e`, unless it is tagged already (raised by another worker), a
/// resource limit (whose variant survives the wire as it is), or a failed call to
/// another worker (the coordinator probes the workers and may run the query again).
fn tag(e: DataFusionError, classify: &Classifier) -> DataFusionError {
    // A limit met inside an operator's shared state (a hash join's build side) arrives
    // wrapped: sent as the limit it is.
    if let DataFusionError::ResourcesExhausted(m) = e.find_root() {
        return DataFusionError::ResourcesExhausted(m.clone());
    }
    if tagged(&e).is_some() || clearice_access::cause_of::<tonic::Status>(&e).is_some() {
        return e;
    }
    let (class, message) = classify(&e);
    tagged_error(class, message)
}

/// An error of `class` raised by ClearIce on a worker (outside any operator), tagged.
pub(crate) fn tagged_error(class: ErrorClass, message: String) -> DataFusionError {
    DataFusionError::External(Box::new(Tagged(format!(
        "{TAG}{}; {message}",
        class.name()
    ))))
}

/// The class and message of a tagged error anywhere in `e`'s chain (an external error
/// whose text starts with the tag: only a worker's [`ClassifiedExec`] writes one).
pub(crate) fn tagged(e: &DataFusionError) -> Option<ClusterError> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(DataFusionError::External(inner)) = err.downcast_ref::<DataFusionError>()
            && let Some(rest) = inner.to_string().strip_prefix(TAG)
            && let Some((name, message)) = rest.split_once("; ")
            && let Some(class) = ErrorClass::from_name(name)
        {
            return Some(ClusterError::OnWorker {
                class,
                message: message.to_owned(),
            });
        }
        cur = err.source();
    }
    None
}

/// A worker's stage root: passes batches through and tags each error with its class.
#[derive(Clone)]
pub(crate) struct ClassifiedExec {
    input: Arc<dyn ExecutionPlan>,
    classify: Classifier,
}

impl ClassifiedExec {
    pub(crate) fn new(input: Arc<dyn ExecutionPlan>, classify: Classifier) -> Self {
        Self { input, classify }
    }
}

impl fmt::Debug for ClassifiedExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifiedExec")
            .field("input", &self.input)
            .finish_non_exhaustive()
    }
}

impl DisplayAs for ClassifiedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClassifiedExec")
    }
}

impl ExecutionPlan for ClassifiedExec {
    fn name(&self) -> &str {
        "ClassifiedExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = only_child("ClassifiedExec", children)?;
        Ok(Arc::new(Self::new(input, Arc::clone(&self.classify))))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        use futures::StreamExt;
        let classify = Arc::clone(&self.classify);
        let input = self
            .input
            .execute(partition, context)
            .map_err(|e| tag(e, &classify))?;
        let schema = input.schema();
        let stream = input.map(move |item| item.map_err(|e| tag(e, &classify)));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tagged_error_keeps_its_class_and_message_through_the_wire_text() {
        let classify: Classifier =
            Arc::new(|e| (ErrorClass::Tampered, clearice_access::one_line(e)));
        let e = tag(
            DataFusionError::Execution("file 'f.parquet': column 'ssn' altered".into()),
            &classify,
        );
        // What the coordinator decodes: datafusion-distributed sends an external error
        // as its inner error's text, which may arrive wrapped in context.
        let DataFusionError::External(inner) = &e else {
            panic!("not external: {e}");
        };
        let sent = DataFusionError::Context(
            "stage 2".into(),
            Box::new(DataFusionError::External(inner.to_string().into())),
        );
        match tagged(&sent) {
            Some(ClusterError::OnWorker { class, message }) => {
                assert_eq!(class, ErrorClass::Tampered);
                assert_eq!(
                    message,
                    "Execution error: file 'f.parquet': column 'ssn' altered"
                );
            }
            other => panic!("{other:?}"),
        }
        // A limit wrapped in an operator's shared state is sent as the limit.
        let shared = DataFusionError::Shared(Arc::new(DataFusionError::ResourcesExhausted(
            "query memory limit".into(),
        )));
        assert!(matches!(
            tag(shared, &classify),
            DataFusionError::ResourcesExhausted(m) if m == "query memory limit"
        ));
        // Tagged once; limits keep their variant; untagged text is not read as a tag.
        assert_eq!(tag(e, &classify).to_string().matches(TAG).count(), 1);
        assert!(matches!(
            tag(
                DataFusionError::ResourcesExhausted("pool".into()),
                &classify
            ),
            DataFusionError::ResourcesExhausted(_)
        ));
        let user = DataFusionError::External(format!("column 'x{TAG}denied; y' not found").into());
        assert!(tagged(&user).is_none());
        let unknown = DataFusionError::External(format!("{TAG}nonsense; m").into());
        assert!(tagged(&unknown).is_none());
    }
}
