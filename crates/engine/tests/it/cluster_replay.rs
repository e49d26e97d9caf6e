//! A stage plan lives as long as its query: a worker runs a recorded stage plan again
//! while its query runs, and refuses it, before any work, once the coordinator said the
//! query ended. Sent over the worker's real gRPC service, as a peer holding the
//! cluster's call credential (a recorded call) would.

use std::sync::Arc;
use std::time::Duration;

use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{DistributedCodec, DistributedExt};
use datafusion_proto::physical_plan::AsExecutionPlan;
use datafusion_proto::protobuf::PhysicalPlanNode;
use prost::Message;

use crate::cluster::{cluster_of, still_answers};

/// datafusion-distributed's `TaskKey` (worker.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct TaskKey {
    #[prost(bytes = "vec", tag = "1")]
    query_id: Vec<u8>,
    #[prost(uint64, tag = "2")]
    stage_id: u64,
    #[prost(uint64, tag = "3")]
    task_number: u64,
}

/// `CoordinatorToWorkerMsg { set_plan_request: SetPlanRequest }` (worker.proto; a oneof
/// of one field is this on the wire).
#[derive(Clone, PartialEq, prost::Message)]
struct CoordinatorToWorker {
    #[prost(message, optional, tag = "1")]
    set_plan: Option<SetPlan>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SetPlan {
    #[prost(message, optional, tag = "1")]
    task_key: Option<TaskKey>,
    #[prost(uint64, tag = "2")]
    task_count: u64,
    #[prost(bytes = "vec", tag = "3")]
    plan_proto: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ExecuteTask {
    #[prost(message, optional, tag = "1")]
    task_key: Option<TaskKey>,
    #[prost(uint64, tag = "2")]
    start: u64,
    #[prost(uint64, tag = "3")]
    end: u64,
}

/// Any message, its fields skipped.
#[derive(Clone, PartialEq, prost::Message)]
struct Skipped {}

/// A gRPC client of the worker at `url`, each call with a credential of `signer`.
struct Peer {
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
    signer: clearice_engine::TaskSigner,
}

impl Peer {
    fn request<T>(&self, path: &str, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert(
            "authorization",
            self.signer.call_credential(path).parse().unwrap(),
        );
        request
    }

    /// Sets `plan` as task `key` of `query` (`SetPlan`), then runs it (`ExecuteTask`): the
    /// number of messages streamed back, or the worker's refusal.
    async fn run(
        &mut self,
        key: TaskKey,
        query: Option<uuid::Uuid>,
        plan: &[u8],
    ) -> Result<usize, tonic::Status> {
        self.set(key.clone(), query, plan).await?;
        self.execute(key).await
    }

    /// Sets `plan` as task `key` (`SetPlan` on the coordinator channel), sent as a stage
    /// of `query` (the header the coordinator sends with its stage plans).
    async fn set(
        &mut self,
        key: TaskKey,
        query: Option<uuid::Uuid>,
        plan: &[u8],
    ) -> Result<(), tonic::Status> {
        const SET_PLAN: &str = "/worker.WorkerService/CoordinatorChannel";
        let set = CoordinatorToWorker {
            set_plan: Some(SetPlan {
                task_key: Some(key.clone()),
                task_count: 1,
                plan_proto: plan.to_vec(),
            }),
        };
        self.grpc.ready().await.unwrap();
        let mut request = self.request(SET_PLAN, futures::stream::once(async { set }));
        if let Some(query) = query {
            request.metadata_mut().insert(
                clearice_engine::QUERY_HEADER,
                query.to_string().parse().unwrap(),
            );
        }
        self.grpc
            .streaming::<_, _, Skipped, _>(
                request,
                SET_PLAN.parse().unwrap(),
                tonic_prost::ProstCodec::default(),
            )
            .await?;
        Ok(())
    }

    /// Runs task `key`'s first partition (`ExecuteTask`): the number of messages streamed
    /// back, or the worker's refusal.
    async fn execute(&mut self, key: TaskKey) -> Result<usize, tonic::Status> {
        const EXECUTE: &str = "/worker.WorkerService/ExecuteTask";
        self.grpc.ready().await.unwrap();
        let execute = ExecuteTask {
            task_key: Some(key),
            start: 0,
            end: 1,
        };
        let request = self.request(EXECUTE, execute);
        let mut stream = self
            .grpc
            .server_streaming::<_, Skipped, _>(
                request,
                EXECUTE.parse().unwrap(),
                tonic_prost::ProstCodec::default(),
            )
            .await?
            .into_inner();
        let mut messages = 0;
        while stream.message().await?.is_some() {
            messages += 1;
        }
        Ok(messages)
    }

    /// `EndQuery` for `query`, as the coordinator sends it when the query ends.
    async fn end(&mut self, query: uuid::Uuid) -> Result<(), tonic::Status> {
        let mut request = self.request(clearice_engine::END_QUERY, Skipped {});
        request.metadata_mut().insert(
            clearice_engine::QUERY_HEADER,
            query.to_string().parse().unwrap(),
        );
        self.grpc.ready().await.unwrap();
        let mut answer = self
            .grpc
            .server_streaming::<_, Skipped, _>(
                request,
                clearice_engine::END_QUERY.parse().unwrap(),
                tonic_prost::ProstCodec::default(),
            )
            .await?
            .into_inner();
        assert!(
            answer.message().await?.is_none(),
            "EndQuery sends no message"
        );
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stage_plan_replayed_after_its_query_ended_is_refused_before_work() {
    let tmp = tempfile::tempdir().unwrap();
    let config = clearice_demo::init(&tmp.path().join("lake")).await.unwrap();
    let (coordinator, workers) = cluster_of(&config, "").await;
    let secret = std::fs::read(tmp.path().join("lake/cluster.secret")).unwrap();
    let signer = || {
        clearice_engine::TaskSigner::new(secret.trim_ascii(), Duration::from_secs(3600)).unwrap()
    };
    // The stage plan a coordinator sends for an analyst's scan, signed for one query.
    let plan = coordinator
        .session("analyst")
        .sql_plan("SELECT id, ssn FROM lake.sales.customers")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let scan = find_scan(&plan).expect("a RemoteScanExec");
    let state = SessionStateBuilder::new()
        .with_distributed_user_codec(clearice_engine::ClearIceCodec::coordinator(Arc::new(
            signer(),
        )))
        .build();
    let codec = DistributedCodec::new_combined_with_user(state.config());
    let query = uuid::Uuid::new_v4();
    let stage = clearice_engine::encoding_for(query, || {
        PhysicalPlanNode::try_from_physical_plan(scan, &codec)
    })
    .unwrap()
    .encode_to_vec();

    let channel = tonic::transport::Channel::from_shared(workers[0].url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut peer = Peer {
        grpc: tonic::client::Grpc::new(channel),
        signer: signer(),
    };
    let key = |task: u64| TaskKey {
        query_id: query.as_bytes().to_vec(),
        stage_id: 1,
        task_number: task,
    };
    // While the query runs, the worker runs it (also a second time, as a stage's tasks do).
    assert!(peer.run(key(0), Some(query), &stage).await.unwrap() > 0);
    assert!(peer.run(key(1), Some(query), &stage).await.unwrap() > 0);
    // A stage plan sent as part of no query is refused before it is decoded.
    let refused = peer.run(key(4), None, &stage).await.unwrap_err();
    assert!(
        String::from_utf8_lossy(refused.details())
            .contains("worker refused the scan: a stage plan without its query"),
        "{refused:?}"
    );
    // A task set up while the query runs, not run yet (a query cut short by a LIMIT).
    peer.set(key(3), Some(query), &stage).await.unwrap();
    // The query ends: the coordinator says so.
    peer.end(query).await.unwrap();
    // The task set up before runs nothing (refused as it starts: the error travels in
    // the status's message).
    let refused = peer.execute(key(3)).await.unwrap_err();
    assert!(
        refused
            .message()
            .contains("worker refused the scan: a stage of a query that ended"),
        "{refused:?}"
    );
    // The same bytes, under a new task key, sent for the query that ended: refused
    // before they are decoded.
    let refused = peer.run(key(2), Some(query), &stage).await.unwrap_err();
    assert!(
        String::from_utf8_lossy(refused.details())
            .contains("worker refused the scan: a stage plan of a query that ended"),
        "{refused:?}"
    );
    // ... and sent as a stage of another query: its signed scan still names the query
    // that ended, refused when decoded, naming the table.
    let refused = peer
        .run(key(5), Some(uuid::Uuid::new_v4()), &stage)
        .await
        .unwrap_err();
    assert!(
        String::from_utf8_lossy(refused.details())
            .contains("worker refused the scan: table lake.sales.customers: its query ended"),
        "{refused:?}"
    );
    // An EndQuery that names no query is refused; without the credential, not read.
    let mut bare = tonic::Request::new(Skipped {});
    bare.metadata_mut().insert(
        "authorization",
        peer.signer
            .call_credential(clearice_engine::END_QUERY)
            .parse()
            .unwrap(),
    );
    peer.grpc.ready().await.unwrap();
    let e = peer
        .grpc
        .server_streaming::<_, Skipped, _>(
            bare,
            clearice_engine::END_QUERY.parse().unwrap(),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    peer.signer = clearice_engine::TaskSigner::new(&[7u8; 32], Duration::from_secs(60)).unwrap();
    let e = peer.end(uuid::Uuid::new_v4()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    // The coordinator's own queries run (each attempt signed for itself, ended after).
    for _ in 0..2 {
        still_answers(&coordinator).await;
    }
}

fn find_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.name() == "RemoteScanExec" {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(find_scan)
}
