//! In-process Flight SQL server queried with arrow-flight's own Flight SQL client.
#![allow(clippy::unwrap_used, reason = "tests: a panic is how a test fails")]
// Tests may block: they are not async workers serving anyone.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Duration;

use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetTables, SqlInfo};
use clearice_demo as demo;
use clearice_engine::{Config, Engine};
use clearice_flight::ClearIceFlightSql;
use datafusion::arrow::array::{AsArray, RecordBatch};
use futures::{StreamExt, TryStreamExt};
use tonic::transport::Channel;

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    addr: std::net::SocketAddr,
    engine: Arc<Engine>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The CPU runtime queries run on, when the test asked for one.
    cpu: Option<tokio::runtime::Runtime>,
}

impl Fixture {
    async fn start() -> Fixture {
        Self::start_with(|p| p).await
    }

    /// The demo lake with its policy file edited by `edit`.
    async fn start_with(edit: impl FnOnce(String) -> String) -> Fixture {
        Self::start_full(edit, |_| {}).await
    }

    /// The demo lake with its policy edited by `edit` and `[server]` by `server`.
    async fn start_full(
        edit: impl FnOnce(String) -> String,
        server_edit: impl FnOnce(&mut clearice_engine::ServerConfig),
    ) -> Fixture {
        Self::start_on(edit, server_edit, false).await
    }

    /// The demo lake, served as `clearice serve` does: queries on a CPU runtime of their
    /// own.
    async fn start_with_cpu_runtime() -> Fixture {
        Self::start_on(|p| p, |_| {}, true).await
    }

    async fn start_on(
        edit: impl FnOnce(String) -> String,
        server_edit: impl FnOnce(&mut clearice_engine::ServerConfig),
        own_cpu_runtime: bool,
    ) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("lake");
        let config_path = demo::init(&dir).await.unwrap();
        let policy = dir.join("policy.toml");
        std::fs::write(&policy, edit(std::fs::read_to_string(&policy).unwrap())).unwrap();
        let config = Config::load(&config_path).unwrap();
        let mut server = config.server.clone().unwrap();
        server_edit(&mut server);
        let engine = Arc::new(Engine::open(config).await.unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut service = ClearIceFlightSql::new(Arc::clone(&engine), &server);
        let cpu = own_cpu_runtime.then(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
        });
        if let Some(rt) = &cpu {
            service =
                service.with_cpu_executor(clearice_engine::CpuExecutor::new(rt.handle().clone()));
        }
        let task = tokio::spawn(async move {
            clearice_flight::serve(service, listener, None, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        Fixture {
            _tmp: tmp,
            dir,
            addr,
            engine,
            stop: Some(tx),
            task: Some(task),
            cpu,
        }
    }

    async fn client(
        &self,
        user: &str,
        password: &str,
    ) -> Result<FlightSqlServiceClient<Channel>, tonic::Status> {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut c = FlightSqlServiceClient::new(channel);
        c.handshake(user, password)
            .await
            .map_err(|e| tonic::Status::unauthenticated(e.to_string()))?;
        Ok(c)
    }

    async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
        if let Some(rt) = self.cpu.take() {
            rt.shutdown_background();
        }
    }
}

/// A result far larger than any transport buffer (1.6M rows), so it is still running
/// when a test cancels or disconnects.
const BIG: &str = "SELECT o.* FROM lake.sales.orders o CROSS JOIN (VALUES (1), (2), (3), (4), (5), (6), (7), (8)) v(x)";

async fn query(
    c: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
) -> Result<Vec<RecordBatch>, String> {
    let info = c
        .execute(sql.to_owned(), None)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for ep in info.endpoint {
        let stream = c
            .do_get(ep.ticket.unwrap())
            .await
            .map_err(|e| e.to_string())?;
        out.extend(
            stream
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(out)
}

#[tokio::test]
async fn login_query_and_metadata_follow_the_policy() {
    let fx = Fixture::start().await;
    let mut admin = fx.client("admin", "admin").await.unwrap();
    let mut analyst = fx.client("analyst", "analyst").await.unwrap();
    let sql = "SELECT ssn FROM lake.sales.customers WHERE id = 1000001";
    let a = query(&mut admin, sql).await.unwrap();
    assert_eq!(
        a[0].column(0).as_string::<i32>().value(0),
        "609-11-1603",
        "Utf8View is sent as Utf8"
    );
    let b = query(&mut analyst, sql).await.unwrap();
    assert_eq!(b[0].column(0).as_string::<i32>().value(0), "XXX-XX-1603");
    let e = query(&mut analyst, "SELECT card_number FROM lake.sales.orders")
        .await
        .unwrap_err();
    assert!(
        e.contains("PermissionDenied") || e.contains("permission"),
        "{e}"
    );
    let e = query(&mut analyst, "SELECT * FROM lake.sales.nope")
        .await
        .unwrap_err();
    assert!(e.contains("NotFound") || e.contains("not found"), "{e}");
    // metadata
    let info = analyst
        .get_tables(CommandGetTables {
            catalog: None,
            db_schema_filter_pattern: Some("sal%".into()),
            table_name_filter_pattern: None,
            table_types: vec![],
            include_schema: true,
        })
        .await
        .unwrap();
    let batches: Vec<RecordBatch> = analyst
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let names: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            b.column(2)
                .as_string::<i32>()
                .iter()
                .map(|s| s.unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(names, vec!["customers", "orders"]);
    let info = analyst
        .get_sql_info(vec![SqlInfo::FlightSqlServerName])
        .await
        .unwrap();
    let rows: Vec<RecordBatch> = analyst
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    // a per-user token with no provider that takes tokens is refused, not ignored
    let mut with_token = fx.client("analyst", "analyst").await.unwrap();
    with_token.set_header("kms_token", "t0k3n");
    let e = query(&mut with_token, sql).await.unwrap_err();
    assert!(
        e.contains("'kms_token' was sent, but no configured crypto provider takes per-user tokens"),
        "{e}"
    );
    // wrong password / no token
    assert!(fx.client("admin", "wrong").await.is_err());
    assert!(fx.client("admin", "").await.is_err());
    fx.shutdown().await;
}

async fn table_names(c: &mut FlightSqlServiceClient<Channel>) -> Vec<String> {
    let info = c
        .get_tables(CommandGetTables {
            catalog: Some("lake".into()),
            db_schema_filter_pattern: None,
            table_name_filter_pattern: None,
            table_types: vec![],
            include_schema: true,
        })
        .await
        .unwrap();
    let batches: Vec<RecordBatch> = c
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    batches
        .iter()
        .flat_map(|b| {
            b.column(2)
                .as_string::<i32>()
                .iter()
                .map(|s| s.unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn table_rules_hide_or_deny_whole_tables() {
    let fx = Fixture::start_with(|p| {
        let header = "[tables.\"lake.sales.orders\"]\n";
        assert!(p.contains(header));
        p.replace(
            header,
            &format!("{header}access = {{ support = \"hide\", analyst = \"deny\" }}\n"),
        )
    })
    .await;
    let mut admin = fx.client("admin", "admin").await.unwrap();
    let mut analyst = fx.client("analyst", "analyst").await.unwrap();
    let mut support = fx.client("support", "support").await.unwrap();
    assert_eq!(table_names(&mut admin).await, vec!["customers", "orders"]);
    // deny: listed (with its schema), but no query reads it
    assert_eq!(table_names(&mut analyst).await, vec!["customers", "orders"]);
    let e = query(&mut analyst, "SELECT count(*) FROM lake.sales.orders")
        .await
        .unwrap_err();
    assert!(
        e.contains("does not have permission")
            && e.contains(
                "table 'lake.sales.orders' is denied to principal 'analyst' (rule: role:analyst)"
            ),
        "{e}"
    );
    let cols = query(
        &mut analyst,
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'orders'",
    )
    .await
    .unwrap();
    assert!(
        cols[0]
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
            .value(0)
            > 0
    );
    // hide: not listed anywhere, and naming it reads as a table that does not exist
    assert_eq!(table_names(&mut support).await, vec!["customers"]);
    let e = query(&mut support, "SELECT * FROM lake.sales.orders")
        .await
        .unwrap_err();
    assert!(
        e.contains("entity was not found") && e.contains("lake.sales.orders' not found"),
        "{e}"
    );
    let listed = query(
        &mut support,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'sales'",
    )
    .await
    .unwrap();
    let listed: Vec<&str> = listed
        .iter()
        .flat_map(|b| b.column(0).as_string::<i32>().iter().map(Option::unwrap))
        .collect();
    assert_eq!(listed, vec!["customers"]);
    // a table rule does not touch the other tables
    assert_eq!(
        query(&mut support, "SELECT count(*) FROM lake.sales.customers")
            .await
            .unwrap()[0]
            .num_rows(),
        1
    );
    // both refusals are audited
    let log = std::fs::read_to_string(fx.dir.join("audit.jsonl")).unwrap();
    let refused = |user: &str, what: &str| {
        log.lines().any(|l| {
            l.contains(&format!("\"user\":\"{user}\""))
                && l.contains("\"allowed\":false")
                && l.contains("lake.sales.orders")
                && l.contains(what)
        })
    };
    assert!(refused("analyst", "is denied"), "{log}");
    assert!(refused("support", "hidden"), "{log}");
    fx.shutdown().await;
}

/// Queries running at once over one Flight session (one bearer token), on a CPU runtime
/// of their own as `clearice serve` runs them, are each audited with their own table,
/// columns and row count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_queries_of_one_flight_session_are_audited_separately() {
    let fx = Fixture::start_with_cpu_runtime().await;
    let admin = fx.client("admin", "admin").await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let mut c = admin.clone();
        tasks.push(tokio::spawn(async move {
            let sql = if i % 2 == 0 {
                "SELECT id, ssn FROM lake.sales.customers LIMIT 3"
            } else {
                "SELECT order_id FROM lake.sales.orders LIMIT 5"
            };
            let batches = query(&mut c, sql).await.unwrap();
            batches.iter().map(RecordBatch::num_rows).sum::<usize>()
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), if i % 2 == 0 { 3 } else { 5 });
    }
    let log = std::fs::read_to_string(fx.dir.join("audit.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["user"] == "admin" && r["action"] == "query")
        .collect();
    assert_eq!(records.len(), 8, "{log}");
    for r in &records {
        let columns: Vec<&str> = r["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        match r["table"].as_str().unwrap() {
            "lake.sales.customers" => {
                assert_eq!((r["rows"].as_u64(), columns), (Some(3), vec!["id", "ssn"]))
            }
            "lake.sales.orders" => {
                assert_eq!((r["rows"].as_u64(), columns), (Some(5), vec!["order_id"]))
            }
            other => panic!("unexpected table {other}"),
        }
    }
    fx.shutdown().await;
}

#[tokio::test]
async fn a_client_that_stops_reading_cancels_its_query() {
    let fx = Fixture::start().await;
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let idle_tasks = tasks();
    let mut admin = fx.client("admin", "admin").await.unwrap();
    let info = admin.execute(BIG.into(), None).await.unwrap();
    let mut stream = admin
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap();
    let first = stream.try_next().await.unwrap().unwrap();
    assert!(first.num_rows() > 0);
    let busy = (fx.engine.memory_reserved(), tasks());
    assert!(
        busy.1 > idle_tasks,
        "a running query shows in the task count: {busy:?}"
    );
    drop(stream);
    drop(admin);
    // The server drops the query's stream: its audit record says it was cancelled.
    let audit = fx.dir.join("audit.jsonl");
    let mut cancelled = false;
    for _ in 0..100 {
        let log = std::fs::read_to_string(&audit).unwrap_or_default();
        if log
            .lines()
            .any(|l| l.contains("\"user\":\"admin\"") && l.contains("cancelled"))
        {
            cancelled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cancelled,
        "no cancelled audit record: {}",
        std::fs::read_to_string(&audit).unwrap_or_default()
    );
    // Nothing is left behind: the query's memory is released and its tasks (and the
    // connection's) have ended.
    let mut left = (usize::MAX, usize::MAX);
    for _ in 0..100 {
        left = (fx.engine.memory_reserved(), tasks());
        if left.0 == 0 && left.1 <= idle_tasks {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        left.0 == 0 && left.1 <= idle_tasks,
        "(reserved bytes, live tasks) after disconnect: {left:?}, idle: {idle_tasks} tasks"
    );
    fx.shutdown().await;
}

#[tokio::test]
async fn cancel_flight_info_stops_a_running_result() {
    use arrow_flight::CancelStatus;
    let fx = Fixture::start().await;
    let mut admin = fx.client("admin", "admin").await.unwrap();
    let info = admin.execute(BIG.into(), None).await.unwrap();
    let mut stream = admin
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap();
    assert!(stream.try_next().await.unwrap().unwrap().num_rows() > 0);
    let result = cancel(&mut admin, info.clone()).await;
    assert_eq!(result.status, CancelStatus::Cancelled as i32);
    // the stream ends early, and with CANCELLED: never as a clean (short) result
    let mut rows = 0;
    let end = loop {
        match stream.try_next().await {
            Ok(Some(b)) => rows += b.num_rows(),
            Ok(None) => panic!("a cancelled result ended cleanly after {rows} rows"),
            Err(e) => break status_of_flight(e),
        }
    };
    assert_eq!(end.code(), tonic::Code::Cancelled, "{end}");
    assert_eq!(end.message(), "query cancelled by CancelFlightInfo");
    assert!(rows < 1_600_000, "{rows} rows after cancel");
    // cancelling again: nothing is running under that ticket
    let again = cancel(&mut admin, info).await;
    assert_eq!(again.status, CancelStatus::NotCancellable as i32);
    fx.shutdown().await;
}

async fn cancel(
    c: &mut FlightSqlServiceClient<Channel>,
    info: arrow_flight::FlightInfo,
) -> arrow_flight::CancelFlightInfoResult {
    use prost::Message;
    let req = arrow_flight::CancelFlightInfoRequest::new(info);
    let action = arrow_flight::Action::new("CancelFlightInfo", req.encode_to_vec());
    let mut results = c.do_action(action).await.unwrap();
    let result = results.try_next().await.unwrap().expect("one result");
    arrow_flight::CancelFlightInfoResult::decode(result.body).unwrap()
}

async fn action<M: prost::Message + Default>(
    c: &mut FlightSqlServiceClient<Channel>,
    kind: &str,
    body: Vec<u8>,
) -> M {
    let mut results = c
        .do_action(arrow_flight::Action::new(kind, body))
        .await
        .unwrap();
    M::decode(results.try_next().await.unwrap().expect("one result").body).unwrap()
}

fn set_request(options: &[(&str, &str)]) -> Vec<u8> {
    use clearice_flight::session::{OptionValue, SessionOptionValue, SetSessionOptionsRequest};
    use prost::Message;
    SetSessionOptionsRequest {
        session_options: options
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    SessionOptionValue {
                        option_value: Some(OptionValue::StringValue(v.to_string())),
                    },
                )
            })
            .collect(),
    }
    .encode_to_vec()
}

#[tokio::test]
async fn session_options_set_the_default_catalog_and_schema_per_connection() {
    use clearice_flight::session::{
        CloseSessionResult, GetSessionOptionsResult, OptionValue, SetSessionOptionsError,
        SetSessionOptionsResult,
    };
    let fx = Fixture::start().await;
    let mut a = fx.client("analyst", "analyst").await.unwrap();
    let mut b = fx.client("analyst", "analyst").await.unwrap();
    let sql = "SELECT ssn FROM customers WHERE id = 1000001";
    assert!(query(&mut a, sql).await.unwrap_err().contains("not found"));
    // what the JDBC driver sends for `catalog=lake`, plus a schema
    let r: SetSessionOptionsResult = action(
        &mut a,
        "SetSessionOptions",
        set_request(&[("catalog", "lake"), ("schema", "sales")]),
    )
    .await;
    assert!(r.errors.is_empty(), "{r:?}");
    let rows = query(&mut a, sql).await.unwrap();
    // still the analyst's view: the policy applies to unqualified names too
    assert_eq!(rows[0].column(0).as_string::<i32>().value(0), "XXX-XX-1603");
    let got: GetSessionOptionsResult = action(&mut a, "GetSessionOptions", vec![]).await;
    assert_eq!(
        got.session_options["catalog"].option_value,
        Some(OptionValue::StringValue("lake".into()))
    );
    // another connection of the same user has its own session
    assert!(query(&mut b, sql).await.unwrap_err().contains("not found"));
    // bad values and names are reported per option, and change nothing
    let r: SetSessionOptionsResult = action(
        &mut a,
        "SetSessionOptions",
        set_request(&[("catalog", "nope"), ("timezone", "UTC")]),
    )
    .await;
    assert_eq!(
        r.errors["catalog"].value,
        SetSessionOptionsError::InvalidValue as i32
    );
    assert_eq!(
        r.errors["timezone"].value,
        SetSessionOptionsError::InvalidName as i32
    );
    assert!(query(&mut a, sql).await.is_ok());
    let closed: CloseSessionResult = action(&mut a, "CloseSession", vec![]).await;
    assert_eq!(closed.status, 1, "CLOSED");
    assert!(query(&mut a, sql).await.unwrap_err().contains("not found"));
    fx.shutdown().await;
}

#[tokio::test]
async fn prepared_statements_take_jdbc_question_mark_placeholders() {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let fx = Fixture::start().await;
    let mut analyst = fx.client("analyst", "analyst").await.unwrap();
    // what the JDBC driver sends for a PreparedStatement; the '?' inside the literal stays text
    let mut stmt = analyst
        .prepare(
            "SELECT id, ssn, 'who?' AS q FROM lake.sales.customers WHERE id = ? AND name <> ?"
                .into(),
            None,
        )
        .await
        .unwrap();
    let params = stmt.parameter_schema().unwrap().clone();
    assert_eq!(params.fields().len(), 2, "{params:?}");
    assert_eq!(stmt.dataset_schema().unwrap().fields().len(), 3);
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("$1", DataType::Int64, true),
            Field::new("$2", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![1000002])),
            Arc::new(StringArray::from(vec!["nobody"])),
        ],
    )
    .unwrap();
    stmt.set_parameters(batch).unwrap();
    let info = stmt.execute().await.unwrap();
    let rows: Vec<RecordBatch> = analyst
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(rows.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
    assert_eq!(rows[0].column(1).as_string::<i32>().value(0), "XXX-XX-8653");
    assert_eq!(rows[0].column(2).as_string::<i32>().value(0), "who?");
    fx.shutdown().await;
}

async fn prepare_handle(c: &mut FlightSqlServiceClient<Channel>, sql: &str) -> prost::bytes::Bytes {
    use arrow_flight::sql::{
        ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, Any,
        ProstMessageExt,
    };
    use prost::Message;
    let req = ActionCreatePreparedStatementRequest {
        query: sql.into(),
        transaction_id: None,
    };
    let mut results = c
        .do_action(arrow_flight::Action::new(
            "CreatePreparedStatement",
            req.as_any().encode_to_vec(),
        ))
        .await
        .unwrap();
    let body = results.try_next().await.unwrap().unwrap().body;
    Any::decode(body)
        .unwrap()
        .unpack::<ActionCreatePreparedStatementResult>()
        .unwrap()
        .unwrap()
        .prepared_statement_handle
}

async fn info_for_handle(
    c: &mut FlightSqlServiceClient<Channel>,
    handle: prost::bytes::Bytes,
) -> Result<arrow_flight::FlightInfo, tonic::Status> {
    use arrow_flight::sql::{CommandPreparedStatementQuery, ProstMessageExt};
    use prost::Message;
    let cmd = CommandPreparedStatementQuery {
        prepared_statement_handle: handle,
    };
    let mut req = tonic::Request::new(arrow_flight::FlightDescriptor::new_cmd(
        cmd.as_any().encode_to_vec(),
    ));
    let bearer = format!("Bearer {}", c.token().unwrap());
    req.metadata_mut()
        .insert("authorization", bearer.parse().unwrap());
    c.inner_mut()
        .get_flight_info(req)
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn prepared_statements_a_client_never_closed_are_forgotten() {
    // 3 s: enough for the first client's two calls on a loaded CI machine
    let fx = Fixture::start_full(|p| p, |s| s.token_ttl_s = Some(3)).await;
    let mut first = fx.client("analyst", "analyst").await.unwrap();
    let stale = prepare_handle(&mut first, "SELECT 1").await;
    assert!(info_for_handle(&mut first, stale.clone()).await.is_ok());
    // the client goes away without ClosePreparedStatement; a token lifetime later...
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let mut second = fx.client("analyst", "analyst").await.unwrap();
    let fresh = prepare_handle(&mut second, "SELECT 2").await;
    assert!(info_for_handle(&mut second, fresh).await.is_ok());
    let gone = info_for_handle(&mut second, stale).await.unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone}");
    fx.shutdown().await;
}

/// The gRPC status of a client-side Flight error.
fn status_of_flight(e: arrow_flight::error::FlightError) -> tonic::Status {
    match e {
        arrow_flight::error::FlightError::Tonic(s) => *s,
        other => panic!("not a gRPC status: {other}"),
    }
}

/// A FlightInfo whose one ticket is `ticket`.
fn info_with_ticket(ticket: Vec<u8>) -> arrow_flight::FlightInfo {
    arrow_flight::FlightInfo::new().with_endpoint(
        arrow_flight::FlightEndpoint::new().with_ticket(arrow_flight::Ticket::new(ticket)),
    )
}

/// A ticket built the way this server built them before query ids: the SQL text alone.
fn ticket_from_sql(sql: &str) -> Vec<u8> {
    use arrow_flight::sql::{ProstMessageExt, TicketStatementQuery};
    use prost::Message;
    TicketStatementQuery {
        statement_handle: sql.as_bytes().to_vec().into(),
    }
    .as_any()
    .encode_to_vec()
}

#[tokio::test]
async fn cancel_flight_info_of_another_principal_or_session_leaves_the_query_running() {
    use arrow_flight::CancelStatus;
    let fx = Fixture::start().await;
    let mut admin = fx.client("admin", "admin").await.unwrap();
    let mut analyst = fx.client("analyst", "analyst").await.unwrap();
    // the same principal from another login (another bearer token, another session)
    let mut admin_elsewhere = fx.client("admin", "admin").await.unwrap();
    let expected = 8 * query(&mut admin, "SELECT count(*) FROM lake.sales.orders")
        .await
        .unwrap()[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
        .value(0) as usize;
    let info = admin.execute(BIG.into(), None).await.unwrap();
    let mut stream = admin
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap();
    let mut rows = stream.try_next().await.unwrap().unwrap().num_rows();
    // the victim's real ticket, a ticket forged from the SQL text, another session: none
    // cancels, and each gets the answer of an unknown ticket
    let forged = info_with_ticket(ticket_from_sql(BIG));
    let attempts = [
        (
            "analyst, real ticket",
            cancel(&mut analyst, info.clone()).await,
        ),
        (
            "analyst, forged ticket",
            cancel(&mut analyst, forged.clone()).await,
        ),
        (
            "admin elsewhere, forged ticket",
            cancel(&mut admin_elsewhere, forged).await,
        ),
        (
            "admin elsewhere, real ticket",
            cancel(&mut admin_elsewhere, info.clone()).await,
        ),
    ];
    for (who, r) in attempts {
        assert_eq!(r.status, CancelStatus::NotCancellable as i32, "{who}");
    }
    // the owner's query returns every row and ends cleanly
    while let Some(b) = stream.try_next().await.unwrap() {
        rows += b.num_rows();
    }
    assert_eq!(rows, expected);
    fx.shutdown().await;
}

#[tokio::test]
async fn a_ticket_forged_from_sql_text_is_refused() {
    use arrow_flight::sql::{CommandPreparedStatementQuery, ProstMessageExt};
    use prost::Message;
    let fx = Fixture::start().await;
    let mut analyst = fx.client("analyst", "analyst").await.unwrap();
    let e = analyst
        .do_get(arrow_flight::Ticket::new(ticket_from_sql("SELECT 1")))
        .await
        .map(|_| ())
        .unwrap_err();
    let e = status_of_flight(e);
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("no query id"), "{e}");
    // a prepared statement's handle alone is no ticket either
    let handle = prepare_handle(&mut analyst, "SELECT 1").await;
    let forged = CommandPreparedStatementQuery {
        prepared_statement_handle: handle.clone(),
    }
    .as_any()
    .encode_to_vec();
    let e = status_of_flight(
        analyst
            .do_get(arrow_flight::Ticket::new(forged))
            .await
            .map(|_| ())
            .unwrap_err(),
    );
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    // the ticket of its FlightInfo runs it
    let info = info_for_handle(&mut analyst, handle).await.unwrap();
    let rows: Vec<RecordBatch> = analyst
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(rows.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
    fx.shutdown().await;
}

/// Sends `batches` batches of 1 MiB (one Int64 column `k`) as an ingest into
/// `lake.sales.<table>` (created if missing, else appended to), generated as the client
/// sends them; returns the result and how many batches were generated.
async fn ingest_mib(
    c: &mut FlightSqlServiceClient<Channel>,
    table: &str,
    batches: usize,
    rows_per_batch: usize,
) -> (Result<i64, tonic::Status>, usize) {
    use arrow_flight::sql::{
        CommandStatementIngest, TableDefinitionOptions, TableExistsOption, TableNotExistOption,
    };
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from_iter_values(
            0..rows_per_batch as i64,
        ))],
    )
    .unwrap();
    let made = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&made);
    let stream = futures::stream::iter(0..batches).map(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(batch.clone())
    });
    let cmd = CommandStatementIngest {
        table_definition_options: Some(TableDefinitionOptions {
            if_not_exist: TableNotExistOption::Create as i32,
            if_exists: TableExistsOption::Append as i32,
        }),
        table: table.into(),
        schema: Some("sales".into()),
        catalog: Some("lake".into()),
        temporary: false,
        transaction_id: None,
        options: Default::default(),
    };
    let result = c
        .execute_ingest(cmd, stream)
        .await
        .map_err(status_of_flight);
    (result, made.load(Ordering::SeqCst))
}

/// Rows of one MiB of Int64.
const MIB_ROWS: usize = (1 << 20) / 8;

#[tokio::test]
async fn an_ingest_without_write_rights_is_refused_before_its_data_is_read() {
    let fx = Fixture::start().await;
    let mut analyst = fx.client("analyst", "analyst").await.unwrap();
    let (result, made) = ingest_mib(&mut analyst, "ingested", 64, MIB_ROWS).await;
    let e = result.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    assert!(
        e.message()
            .contains("write denied: ingest into table 'lake.sales.ingested'"),
        "{e}"
    );
    assert!(made < 8, "{made} of 64 MiB generated before the refusal");
    let log = std::fs::read_to_string(fx.dir.join("audit.jsonl")).unwrap();
    assert!(
        log.lines().any(|l| l.contains("\"user\":\"analyst\"")
            && l.contains("\"action\":\"ingest\"")
            && l.contains("write denied")),
        "{log}"
    );
    fx.shutdown().await;
}

#[tokio::test]
async fn an_ingest_over_the_memory_cap_is_refused_without_buffering_it() {
    // the cap of an ingest is the per-query memory limit: 8 MiB here
    let fx = Fixture::start_full(|p| p, |s| s.limits.query_memory_mb = Some(8)).await;
    let mut admin = fx.client("admin", "admin").await.unwrap();
    let (result, made) = ingest_mib(&mut admin, "ingested", 64, MIB_ROWS).await;
    let e = result.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(
        e.message().contains("ingest data over 8 MiB") && e.message().contains("query_memory_mb"),
        "{e}"
    );
    assert!(made < 32, "{made} of 64 MiB generated before the refusal");
    // an ingest under the cap is written
    let (rows, _) = ingest_mib(&mut admin, "ingested", 2, 3).await;
    assert_eq!(rows.unwrap(), 6);
    let n = query(&mut admin, "SELECT count(*) FROM lake.sales.ingested")
        .await
        .unwrap();
    assert_eq!(
        n[0].column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
            .value(0),
        6
    );
    fx.shutdown().await;
}

#[tokio::test]
async fn prepared_statement_parameters_and_count_are_capped() {
    use datafusion::arrow::array::StringArray;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let fx = Fixture::start().await;
    let mut analyst = fx.client("analyst", "analyst").await.unwrap();
    let mut stmt = analyst
        .prepare(
            "SELECT id FROM lake.sales.customers WHERE name = ?".into(),
            None,
        )
        .await
        .unwrap();
    let params = |name: String| {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("$1", DataType::Utf8, true)])),
            vec![Arc::new(StringArray::from(vec![name]))],
        )
        .unwrap()
    };
    // 2 MiB of parameters: refused, not kept
    stmt.set_parameters(params("x".repeat(2 << 20))).unwrap();
    let e = status_of_flight(stmt.execute().await.unwrap_err());
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("parameters over 1 MiB"), "{e}");
    // a normal parameter set still binds
    stmt.set_parameters(params("nobody".into())).unwrap();
    assert!(stmt.execute().await.is_ok());
    // at most 64 open prepared statements per principal, across its logins: while all
    // were used in the last 10 s the 65th is refused; once the least recently used one
    // (`stmt`) has been idle that long (a client that died without closing it), the 65th
    // takes its place, so crashed clients do not lock the principal out
    let mut other = fx.client("analyst", "analyst").await.unwrap();
    let mut held = Vec::new();
    for i in 1..64 {
        let c = if i % 2 == 0 { &mut analyst } else { &mut other };
        held.push(c.prepare(format!("SELECT {i} AS n"), None).await.unwrap());
    }
    let e = status_of_flight(
        other
            .prepare("SELECT 64 AS n".into(), None)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("64 open prepared statements"), "{e}");
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    held.push(other.prepare("SELECT 64 AS n".into(), None).await.unwrap());
    let e = status_of_flight(stmt.execute().await.unwrap_err());
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    assert!(e.message().contains("no prepared statement"), "{e}");
    // the others still answer their own statement (the first, the last before, the new one)
    for i in [0, 62, 63] {
        let info = held[i].execute().await.unwrap();
        let ticket = info.endpoint[0].ticket.clone().unwrap();
        let batches: Vec<RecordBatch> = other
            .do_get(ticket)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let n = batches[0]
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
            .value(0);
        assert_eq!(n, i as i64 + 1, "statement {i}");
    }
    fx.shutdown().await;
}
