//! Unit tests of the cluster: the wire, signatures, call credentials, admitted plans.

use std::sync::Arc;
use std::time::Duration;

use clearice_access::MaskOutput;
use clearice_access::remote::{RemoteScanExec, ScanBuilder, ScanRequest};
use clearice_crypto::{AccessToken, KeyScope, ProviderRoute, ScanGrant};
use datafusion::arrow::datatypes::Schema;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use tonic::codegen::http;

use clearice_access::compact::CompactViewsExec;
use clearice_access::fair::YieldExec;

use crate::codec::{ClearIceCodec, SCAN_MAGIC};
use crate::signer::{CALL_WINDOW, TaskSigner, now_s};
use crate::wire::WireScan;
use crate::worker::{admitted, guard};
use datafusion::arrow::datatypes::{DataType, Field};

fn signer(ttl_s: u64) -> Arc<TaskSigner> {
    Arc::new(TaskSigner::new(&[42u8; 32], Duration::from_secs(ttl_s)).unwrap())
}

fn request() -> ScanRequest {
    ScanRequest {
        catalog: "lake".into(),
        namespace: vec!["sales".into()],
        table: "customers".into(),
        snapshot_id: Some(7),
        travel: false,
        table_fields: vec!["id".into(), "ssn".into()],
        projection: vec![0, 1],
        filters: vec![datafusion::prelude::col("id").gt(datafusion::prelude::lit(3i64))],
        limit: Some(10),
        set_predicate: true,
        grant: ScanGrant {
            principal: "analyst".into(),
            credential: Some(AccessToken::new("the-analysts-own-token")),
            scope: KeyScope::Columns(clearice_crypto::ColumnKeys {
                by_field_id: [(4, "pii_key".to_owned()), (7, "finance_key".to_owned())].into(),
                by_name: [("ssn".to_owned(), "pii_key".to_owned())].into(),
            }),
            aad_prefix: Some(b"tenant-1".to_vec()),
            route: Some(ProviderRoute {
                name: "local".into(),
                routes: [("finance_key".to_owned(), "vault".to_owned())].into(),
            }),
            provider: None,
            column_keys: [("ssn".to_owned(), "pii_key".to_owned())].into(),
        },
        masks: Some(vec![
            MaskOutput {
                name: "id".into(),
                decision: clearice_policy::Decision::Plaintext,
                input: Some(0),
                data_type: DataType::Int64,
            },
            MaskOutput {
                name: "ssn".into(),
                decision: clearice_policy::Decision::Mask(clearice_policy::Mask::ShowLast4),
                input: Some(1),
                data_type: DataType::Utf8,
            },
        ]),
        mask_key_check: Some("00112233445566ff".into()),
        schema: Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("ssn", DataType::Utf8, true),
        ])),
        partitions: 3,
    }
}

#[derive(Debug)]
struct NoBuilder;

#[async_trait::async_trait]
impl ScanBuilder for NoBuilder {
    async fn build(
        &self,
        _request: &ScanRequest,
        _ctx: Arc<TaskContext>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Err(DataFusionError::Internal("not in this test".into()))
    }
}

fn encode(signer: &Arc<TaskSigner>, request: ScanRequest) -> Vec<u8> {
    let plan: Arc<dyn ExecutionPlan> = Arc::new(RemoteScanExec::planned(
        request,
        Arc::new(EmptyExec::new(Arc::new(Schema::empty()))),
    ));
    let mut buf = Vec::new();
    crate::queries::encoding_for(uuid::Uuid::new_v4(), || {
        ClearIceCodec::coordinator(Arc::clone(signer)).try_encode(plan, &mut buf)
    })
    .unwrap();
    buf
}

#[test]
fn a_scan_request_survives_the_wire() {
    let s = signer(60);
    let buf = encode(&s, request());
    let codec = ClearIceCodec::worker(Arc::clone(&s), Arc::new(NoBuilder));
    let plan = codec
        .try_decode(&buf, &[], &TaskContext::default())
        .unwrap();
    let got = plan
        .as_any()
        .downcast_ref::<RemoteScanExec>()
        .unwrap()
        .request();
    let want = request();
    assert_eq!(got.table_name(), "lake.sales.customers");
    assert_eq!(got.snapshot_id, want.snapshot_id);
    assert_eq!(got.projection, want.projection);
    assert_eq!(got.filters, want.filters);
    assert_eq!(got.limit, want.limit);
    assert_eq!(
        format!("{:?}", got.grant.scope),
        format!("{:?}", want.grant.scope)
    );
    assert_eq!(got.grant.principal, want.grant.principal);
    assert_eq!(got.grant.aad_prefix, want.grant.aad_prefix);
    assert_eq!(got.grant.route, want.grant.route);
    assert_eq!(got.grant.column_keys, want.grant.column_keys);
    // The principal's own token reaches the worker, sealed on the wire.
    assert_eq!(
        got.grant.credential.as_ref().map(AccessToken::expose),
        Some("the-analysts-own-token")
    );
    assert!(!String::from_utf8_lossy(&buf).contains("the-analysts-own-token"));
    assert!(!format!("{got:?}").contains("the-analysts-own-token"));
    let mut bare = request();
    bare.grant.credential = None;
    let plain = codec
        .try_decode(&encode(&s, bare), &[], &TaskContext::default())
        .unwrap();
    let plain = plain.as_any().downcast_ref::<RemoteScanExec>().unwrap();
    assert!(plain.request().grant.credential.is_none());
    assert_eq!(got.schema, want.schema);
    assert_eq!(got.partitions, 3);
    assert_eq!(got.mask_key_check, want.mask_key_check);
    let masks: Vec<_> = got
        .masks
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m.name.clone(),
                m.decision.clone(),
                m.input,
                m.data_type.clone(),
            )
        })
        .collect();
    let want_masks: Vec<_> = want
        .masks
        .unwrap()
        .into_iter()
        .map(|m| (m.name, m.decision, m.input, m.data_type))
        .collect();
    assert_eq!(masks, want_masks);
    // The policy's mask names on the wire.
    assert!(String::from_utf8_lossy(&buf).contains("\"show_last_4\""));
}

#[test]
fn expired_truncated_and_foreign_scans_are_refused() {
    let s = signer(60);
    let codec = ClearIceCodec::worker(Arc::clone(&s), Arc::new(NoBuilder));
    let ctx = TaskContext::default();
    // Signed long ago (a replay): re-sign a body with an old stamp.
    let mut wire = WireScan::from_request(&request(), uuid::Uuid::new_v4(), &s).unwrap();
    wire.issued_at = now_s() - 3600;
    let body = serde_json::to_vec(&wire).unwrap();
    let mut old = SCAN_MAGIC.to_vec();
    old.extend_from_slice(&s.sign(&body));
    old.extend_from_slice(&body);
    let e = codec.try_decode(&old, &[], &ctx).unwrap_err().to_string();
    assert!(
        e.contains("longer than the cluster's task_ttl_s (60)"),
        "{e}"
    );
    let e = codec
        .try_decode(&SCAN_MAGIC[..], &[], &ctx)
        .unwrap_err()
        .to_string();
    assert!(e.contains("truncated"), "{e}");
    let e = codec
        .try_decode(b"something else", &[], &ctx)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown plan node"), "{e}");
    assert!(TaskSigner::new(&[1u8; 31], Duration::from_secs(1)).is_err());
}

/// Signs `wire` with `s` as a coordinator would.
fn signed(s: &TaskSigner, wire: &WireScan) -> Vec<u8> {
    let body = serde_json::to_vec(wire).unwrap();
    let mut buf = SCAN_MAGIC.to_vec();
    buf.extend_from_slice(&s.sign(&body));
    buf.extend_from_slice(&body);
    buf
}

#[test]
fn a_sealed_token_opens_only_in_its_own_scan_of_its_own_cluster() {
    let s = signer(60);
    let codec = ClearIceCodec::worker(Arc::clone(&s), Arc::new(NoBuilder));
    let ctx = TaskContext::default();
    let opened = |buf: &[u8]| {
        codec
            .try_decode(buf, &[], &ctx)
            .map(|p| {
                let scan = p.as_any().downcast_ref::<RemoteScanExec>().unwrap();
                scan.request()
                    .grant
                    .credential
                    .as_ref()
                    .map(|t| t.expose().to_owned())
            })
            .map_err(|e| e.to_string())
    };
    let wire = || -> serde_json::Value {
        serde_json::to_value(WireScan::from_request(&request(), uuid::Uuid::new_v4(), &s).unwrap())
            .unwrap()
    };
    let resign = |v: &serde_json::Value| signed(&s, &serde_json::from_value(v.clone()).unwrap());
    let original = wire();
    assert_eq!(
        opened(&resign(&original)).unwrap().as_deref(),
        Some("the-analysts-own-token")
    );
    // Two seals of one token differ (a fresh nonce each time).
    assert_ne!(original["credential"], wire()["credential"]);
    // Moved, by whoever holds the secret, into a scan of another principal, table or
    // query, or of another time: it does not open, and the error does not show it.
    for (field, value) in [
        ("table", serde_json::json!("orders")),
        ("query", serde_json::json!(uuid::Uuid::new_v4().to_string())),
        ("issued_at", serde_json::json!(now_s() - 1)),
    ] {
        let mut moved = original.clone();
        moved[field] = value;
        let e = opened(&resign(&moved)).unwrap_err();
        assert!(
            e.contains("the principal's provider token: does not open"),
            "{field}: {e}"
        );
        assert!(!e.contains("the-analysts-own-token"), "{e}");
    }
    let mut moved = original.clone();
    moved["grant"]["principal"] = serde_json::json!("admin");
    assert!(opened(&resign(&moved)).is_err());
    // Sealed by another cluster (and signed by this one): does not open here.
    let theirs = TaskSigner::new(&[7u8; 32], Duration::from_secs(60)).unwrap();
    let mut foreign = original.clone();
    foreign["credential"] = serde_json::to_value(
        WireScan::from_request(&request(), uuid::Uuid::new_v4(), &theirs).unwrap(),
    )
    .unwrap()["credential"]
        .clone();
    foreign["issued_at"] = original["issued_at"].clone();
    assert!(opened(&resign(&foreign)).is_err());
    // Flipped bits, or not base64.
    for bad in ["AAAA", "not base64!"] {
        let mut broken = original.clone();
        broken["credential"] = serde_json::json!(bad);
        assert!(opened(&resign(&broken)).is_err(), "{bad}");
    }
}

#[test]
fn a_scan_lives_as_long_as_its_query() {
    let s = signer(60);
    let codec = ClearIceCodec::worker(Arc::clone(&s), Arc::new(NoBuilder));
    let ctx = TaskContext::default();
    let query = uuid::Uuid::new_v4();
    let wire = WireScan::from_request(&request(), query, &s).unwrap();
    let buf = signed(&s, &wire);
    let decoded = codec.try_decode(&buf, &[], &ctx).unwrap();
    // The coordinator said the query ended: the same signed bytes are refused...
    codec.ended.end(query);
    // ...and a scan decoded before runs no partition after.
    let e = decoded
        .execute(0, Arc::new(TaskContext::default()))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("its query ended"), "{e}");
    let e = codec.try_decode(&buf, &[], &ctx).unwrap_err().to_string();
    assert!(
        e.contains("worker refused the scan: table lake.sales.customers: its query ended"),
        "{e}"
    );
    // Other queries' scans are not.
    codec.try_decode(&encode(&s, request()), &[], &ctx).unwrap();
    // A scan is signed only as part of a query.
    let plan: Arc<dyn ExecutionPlan> = Arc::new(RemoteScanExec::planned(
        request(),
        Arc::new(EmptyExec::new(Arc::new(Schema::empty()))),
    ));
    let e = ClearIceCodec::coordinator(Arc::clone(&s))
        .try_encode(plan, &mut Vec::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("only as part of a query"), "{e}");
}

#[test]
fn workers_run_only_plans_whose_leaves_are_signed_scans() {
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::filter::FilterExec;
    let schema = request().schema;
    let scan: Arc<dyn ExecutionPlan> =
        Arc::new(RemoteScanExec::deferred(request(), Arc::new(NoBuilder)));
    let above = |leaf: Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
        Arc::new(
            FilterExec::try_new(datafusion::physical_expr::expressions::lit(true), leaf).unwrap(),
        )
    };
    assert!(admitted(&above(Arc::clone(&scan))).is_ok());
    // A plan of DataFusion's own (here rows in memory; a file scan alike) is refused,
    // and runs as a node that fails with why.
    let memory: Arc<dyn ExecutionPlan> =
        MemorySourceConfig::try_new_exec(&[vec![]], Arc::clone(&schema), None).unwrap();
    let forged = above(memory);
    let e = admitted(&forged).unwrap_err();
    assert!(e.contains("is not a scan signed by a coordinator"), "{e}");
    let guarded = guard(forged);
    assert_eq!(guarded.name(), "RefusedExec");
    assert_eq!(guarded.schema(), schema);
    let e = guarded
        .execute(0, Arc::new(TaskContext::default()))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("worker refused the scan: stage plan refused"),
        "{e}"
    );
}

#[test]
fn call_credentials_hold_for_their_rpc_secret_and_window_only() {
    const INFO: &str = "/worker.WorkerService/GetWorkerInfo";
    const TASK: &str = "/worker.WorkerService/ExecuteTask";
    let s = signer(60);
    let headers = |value: &str| {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(value).unwrap(),
        );
        h
    };
    let fresh = s.call_credential(TASK);
    assert!(fresh.starts_with("ClearIce-Cluster "), "{fresh}");
    assert_eq!(s.check_call(TASK, &headers(&fresh)), Ok(()));
    // Another RPC, another secret, tampered, stale or from too far ahead, absent.
    let e = s.check_call(INFO, &headers(&fresh)).unwrap_err();
    assert!(e.contains("does not verify"), "{e}");
    let other = TaskSigner::new(&[43u8; 32], Duration::from_secs(60)).unwrap();
    let e = other.check_call(TASK, &headers(&fresh)).unwrap_err();
    assert!(e.contains("does not verify"), "{e}");
    let (stamp, _) = fresh.split_once('.').unwrap();
    let e = s
        .check_call(TASK, &headers(&format!("{stamp}.{}", "00".repeat(32))))
        .unwrap_err();
    assert!(e.contains("does not verify"), "{e}");
    let window = CALL_WINDOW.as_secs();
    let old = s.credential_at(TASK, now_s() - window - 5);
    let e = s.check_call(TASK, &headers(&old)).unwrap_err();
    assert!(e.contains("stale"), "{e}");
    let ahead = s.credential_at(TASK, now_s() + window + 5);
    assert!(s.check_call(TASK, &headers(&ahead)).is_err());
    let skewed = s.credential_at(TASK, now_s() - window + 30);
    assert_eq!(s.check_call(TASK, &headers(&skewed)), Ok(()));
    for bad in ["Bearer x", "ClearIce-Cluster 12", "ClearIce-Cluster x.00"] {
        let e = s.check_call(TASK, &headers(bad)).unwrap_err();
        assert!(e.contains("malformed"), "{bad}: {e}");
    }
    let e = s.check_call(TASK, &http::HeaderMap::new()).unwrap_err();
    assert!(e.contains("no cluster credential"), "{e}");
}

#[test]
fn yield_and_compact_nodes_round_trip_and_other_nodes_stay_home() {
    let s = signer(60);
    let input: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::new(Schema::empty())));
    let node: Arc<dyn ExecutionPlan> = Arc::new(YieldExec::new(Arc::clone(&input), Some(128)));
    let coordinator = ClearIceCodec::coordinator(Arc::clone(&s));
    let mut buf = Vec::new();
    coordinator.try_encode(node, &mut buf).unwrap();
    let worker = ClearIceCodec::worker(s, Arc::new(NoBuilder));
    let back = worker
        .try_decode(&buf, &[Arc::clone(&input)], &TaskContext::default())
        .unwrap();
    let y = back.as_any().downcast_ref::<YieldExec>().unwrap();
    assert_eq!(y.max_rows(), Some(128));
    let mut buf = Vec::new();
    coordinator
        .try_encode(
            Arc::new(CompactViewsExec::new(Arc::clone(&input))),
            &mut buf,
        )
        .unwrap();
    let back = worker
        .try_decode(&buf, &[input], &TaskContext::default())
        .unwrap();
    assert!(back.as_any().is::<CompactViewsExec>());
    // Bytes after the name are not a CompactViewsExec.
    buf.push(0);
    let empty: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::new(Schema::empty())));
    assert!(
        worker
            .try_decode(&buf, &[empty], &TaskContext::default())
            .is_err()
    );
    let e = coordinator
        .try_encode(
            Arc::new(PlaceholderRowExec::new(Arc::new(Schema::empty()))),
            &mut Vec::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot be sent to a worker"), "{e}");
}
