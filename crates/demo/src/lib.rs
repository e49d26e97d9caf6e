//! The demo lake (`clearice demo init DIR`): a lake written by ClearIce itself (SQLite
//! Iceberg catalog, keyring, config, policy), with PME per-column keys. It sits above the
//! engine (which it only needs for [`Error`]); the CLI passes the OS account that runs it
//! as [`DemoOptions::owner`].
//!
//! ```text
//!  init_with(DIR, DemoOptions) ─▶ keyring.json, policy.toml, clearice.toml
//!    ─▶ SQLite Iceberg catalog ─▶ seeded rows ─▶ clearice-iceberg's encrypted writes
//!       (PME per column: pii_key, finance_key; footer_key) ─▶ DIR/warehouse or S3
//! ```
//!
//! ```no_run
//! # async fn f() -> Result<(), clearice_engine::Error> {
//! let config = clearice_demo::init("demo".as_ref()).await?;
//! let engine = clearice_engine::Engine::open(clearice_engine::Config::load(&config)?).await?;
//! # let _ = engine; Ok(()) }
//! ```
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Result<T, E = BoxError> = std::result::Result<T, E>;

use clearice_policy::Policy;

use clearice_crypto::{KeyringKms, SecretKey};
use clearice_engine::Error;
use clearice_iceberg::write::{EncryptionSpec, WriteProviders, append_encrypted_with};
use clearice_storage::{LakeStores, S3Options};
use datafusion::arrow::array::{
    ArrayRef, Date32Array, Decimal128Array, Int64Array, ListBuilder, RecordBatch, StringArray,
    StringBuilder, TimestampMicrosecondArray,
};
use iceberg::spec::{
    ListType, NestedField, PrimitiveType, Schema, Transform, Type, UnboundPartitionSpec,
};
use iceberg::{NamespaceIdent, TableCreation};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Rows in `lake.sales.customers`.
pub const CUSTOMERS: usize = 100_000;
/// Rows in `lake.sales.orders`.
pub const ORDERS: usize = 200_000;

/// Where the demo lake's data goes and who protects its PII columns.
#[derive(Debug, Clone, Default)]
pub struct DemoOptions {
    /// Encrypt (PME per column); off gives the plaintext twin.
    pub plaintext: bool,
    /// The PII key held by the demo crypto service (see [`init_remote`]).
    pub remote: bool,
    /// Warehouse URI (`s3://bucket/prefix`); default `DIR/warehouse`.
    pub warehouse: Option<String>,
    /// S3 options for an `s3://` warehouse (written to `[storage.s3]` without secrets:
    /// credentials come from the environment then too).
    pub s3: S3Options,
    /// The account that will run the shell, made an admin in the policy (and in the
    /// remote demo's service) so the first query shows plaintext; `clearice demo init`
    /// passes the OS account. `None`: only `admin`, `analyst` and `support`.
    pub owner: Option<String>,
}

/// Writes a demo lake into `dir` (absent or empty) and returns its config path (no
/// [`owner`](DemoOptions::owner): see [`init_with`]).
pub async fn init(dir: &Path) -> Result<PathBuf, Error> {
    init_with(dir, DemoOptions::default()).await
}

/// The same lake with PME off (the plaintext twin, for benchmarks and comparisons).
pub async fn init_plaintext(dir: &Path) -> Result<PathBuf, Error> {
    init_with(
        dir,
        DemoOptions {
            plaintext: true,
            ..Default::default()
        },
    )
    .await
}

/// The demo lake with its PII key held by a protection service: `DIR/crypto-server/`
/// holds the service's config (`clearice crypto-server --config
/// DIR/crypto-server/crypto-server.toml`), its keyring with `pii_key` and the JWT secret
/// both sides share; ClearIce's keyring keeps only the footer and finance keys, and the
/// policy routes the PII columns to provider `dbps` (`on_missing_key = "null"`: users
/// the service refuses see NULL). The service lets roles `admin` and `support` use
/// `pii_key`, and refuses `analyst`.
pub async fn init_remote(dir: &Path) -> Result<PathBuf, Error> {
    init_with(
        dir,
        DemoOptions {
            remote: true,
            ..Default::default()
        },
    )
    .await
}

/// Where the remote demo's service listens (`crypto-server.toml`, `[providers.dbps]`).
pub const REMOTE_DEMO_ADDR: &str = "127.0.0.1:8443";

/// The demo lake with `options` (an S3 warehouse, a remote provider, plaintext).
pub async fn init_with(dir: &Path, options: DemoOptions) -> Result<PathBuf, Error> {
    let fail = |reason: String| Error::DemoInit {
        dir: dir.display().to_string(),
        reason,
    };
    match dir.read_dir().map(|mut entries| entries.next().is_some()) {
        Ok(true) => return Err(fail("the directory is not empty; choose a new one".into())),
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e.to_string())),
    }
    if let Some(w) = &options.warehouse
        && !(w.starts_with("s3://") || w.starts_with("file:///"))
    {
        return Err(fail(format!(
            "warehouse '{w}' is not s3://BUCKET/PREFIX or file:///ABSOLUTE/PATH"
        )));
    }
    write_lake(dir, options)
        .await
        .map_err(|e| fail(e.to_string()))
}

#[expect(
    clippy::disallowed_methods,
    reason = "demo init is a one-off setup command that writes a lake before anything is served"
)]
async fn write_lake(dir: &Path, options: DemoOptions) -> Result<PathBuf> {
    let (encrypt, remote) = (!options.plaintext, options.remote);
    // The account that will run the shell becomes an admin, so the first query shows
    // plaintext (the CLI passes the OS account, not only $USER: containers have none).
    let owner = options.owner.clone();
    std::fs::create_dir_all(dir)?;
    if options.warehouse.is_none() {
        std::fs::create_dir_all(dir.join("warehouse"))?;
    }
    let dir = dir.canonicalize()?;
    let keyring = KeyringKms::from_keys([
        (
            "footer_key".to_string(),
            SecretKey::from_bytes(rand::random::<[u8; 32]>().to_vec()),
        ),
        (
            "pii_key".to_string(),
            SecretKey::from_bytes(rand::random::<[u8; 16]>().to_vec()),
        ),
        (
            "finance_key".to_string(),
            SecretKey::from_bytes(rand::random::<[u8; 24]>().to_vec()),
        ),
    ]);
    // With a remote provider, pii_key lives only in the demo service, which encrypts the
    // PII columns' modules itself while the lake is written (started here, in process).
    let (local_kms, service) = if remote {
        write_crypto_server(&dir, &keyring, owner.as_deref())?;
        let local = KeyringKms::from_file(&dir.join("keyring.json"))?;
        (local, Some(DemoService::start(&dir).await?))
    } else {
        write_private(&dir.join("keyring.json"), &keyring.to_json())?;
        (keyring, None)
    };
    let local_kms: Arc<dyn clearice_crypto::Kms> = Arc::new(local_kms);
    let write_providers = service
        .as_ref()
        .map(DemoService::write_providers)
        .unwrap_or_default();
    let db = dir.join("catalog.db");
    let warehouse = options
        .warehouse
        .clone()
        .map(|w| w.trim_end_matches('/').to_owned())
        .unwrap_or_else(|| format!("file://{}", dir.join("warehouse").display()));
    let storage = if warehouse.starts_with("s3://") {
        let mut s =
            "# Credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile.\n[storage.s3]\n"
                .to_owned();
        if let Some(e) = &options.s3.endpoint {
            s.push_str(&format!("endpoint = \"{e}\"\n"));
        }
        if let Some(r) = &options.s3.region {
            s.push_str(&format!("region = \"{r}\"\n"));
        }
        s.push('\n');
        s
    } else {
        String::new()
    };
    let providers = if remote {
        format!(
            "# The PII key stays in the protection service (clearice crypto-server).\n\
             [providers.dbps]\ntype = \"remote\"\nurl = \"http://{REMOTE_DEMO_ADDR}\"\n\
             hs256_secret_file = \"crypto-server/jwt.secret\"\nsubject = \"clearice\"\n\n"
        )
    } else {
        String::new()
    };
    let config = format!(
        "# ClearIce demo lake (written by `clearice demo init`)\n\
         [catalogs.lake]\ntype = \"sql\"\nuri = \"sqlite://{}\"\nwarehouse = \"{warehouse}\"\n\n{storage}\
         [kms]\ntype = \"keyring\"\npath = \"keyring.json\"\n\n{providers}\
         [policy]\npath = \"policy.toml\"\n\n[audit]\npath = \"audit.jsonl\"\n\n\
         # Flight SQL users (clearice serve). DEMO ONLY: each password equals the user name.\n\
         [server]\naddr = \"127.0.0.1:50051\"\n{}",
        db.display(),
        demo_server_users()?
    );
    let mut policy_text = demo_policy(owner.as_deref());
    if remote {
        policy_text = policy_text.replace(
            "master_key = \"pii_key\"\n",
            "master_key = \"pii_key\"\nprovider = \"dbps\"\non_missing_key = \"null\"\n",
        );
    }
    let policy = Policy::parse(&policy_text, "policy.toml")?;
    std::fs::write(dir.join("policy.toml"), &policy_text)?;
    let spec_for = |table: &str| -> EncryptionSpec {
        match (encrypt, policy.table(table)) {
            (true, Some(t)) => clearice_access::encryption_spec(t),
            _ => EncryptionSpec::default(),
        }
    };
    let stores = LakeStores::new(options.s3.with_environment());
    let catalog = clearice_iceberg::open_sql_catalog(
        "lake",
        &format!("sqlite://{}?mode=rwc", db.display()),
        &warehouse,
        &stores,
    )
    .await?;
    let ns = NamespaceIdent::new("sales".into());
    catalog.create_namespace(&ns, HashMap::new()).await?;

    let customers = catalog
        .create_table(
            &ns,
            TableCreation::builder()
                .name("customers".into())
                .schema(customers_schema()?)
                .properties([("clearice.demo".to_string(), "true".to_string())])
                .build(),
        )
        .await?;
    let spec = spec_for("lake.sales.customers");
    let mut rng = StdRng::seed_from_u64(42);
    let mut table = customers;
    let chunk = CUSTOMERS / 4;
    for part in 0..4 {
        let batch = customers_batch(&mut rng, part * chunk, chunk)?;
        table = append_encrypted_with(
            catalog.as_ref(),
            &table,
            &[batch],
            &spec,
            Arc::clone(&local_kms),
            &write_providers,
        )
        .await?;
    }

    let orders_schema = orders_schema()?;
    let partition = UnboundPartitionSpec::builder()
        .add_partition_field(3, "order_date_day", Transform::Day)?
        .build();
    let orders = catalog
        .create_table(
            &ns,
            TableCreation::builder()
                .name("orders".into())
                .schema(orders_schema)
                .partition_spec(partition)
                .build(),
        )
        .await?;
    let spec = spec_for("lake.sales.orders");
    let batch = orders_batch(&mut rng)?;
    append_encrypted_with(
        catalog.as_ref(),
        &orders,
        &[batch],
        &spec,
        Arc::clone(&local_kms),
        &write_providers,
    )
    .await?;
    if let Some(s) = service {
        s.stop().await;
    }

    let config_path = dir.join("clearice.toml");
    std::fs::write(&config_path, config)?;
    Ok(config_path)
}

/// The demo's crypto service, run in process while `demo init --provider remote` writes
/// the lake (on a free loopback port; the config's `listen` is for later runs).
struct DemoService {
    provider: clearice_crypto::ProviderRef,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::result::Result<(), clearice_crypto_server::Error>>,
}

impl DemoService {
    #[expect(
        clippy::disallowed_methods,
        reason = "demo init is a one-off setup command that writes a lake before anything is served"
    )]
    async fn start(dir: &Path) -> Result<Self> {
        let service_dir = dir.join("crypto-server");
        let config = clearice_crypto_server::Config::load(&service_dir.join("crypto-server.toml"))?;
        let service = Arc::new(clearice_crypto_server::Service::new(config)?);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        #[expect(
            clippy::disallowed_methods,
            reason = "the demo crypto service's server task; stopped and awaited by its owner"
        )]
        let task = tokio::spawn(clearice_crypto_server::serve(
            service,
            listener,
            None,
            async move {
                let _ = stopped.await;
            },
        ));
        let secret = std::fs::read(service_dir.join("jwt.secret"))?;
        let mut config = clearice_crypto::RemoteConfig::new("dbps", format!("http://{addr}"));
        config.credential = clearice_crypto::RemoteCredential::Hs256 {
            secret: SecretKey::from_bytes(secret.trim_ascii().to_vec()),
            subject: "clearice".into(),
            audience: "clearice-crypto".into(),
        };
        let provider = Arc::new(clearice_crypto::RemoteProvider::new(config, None)?);
        Ok(Self {
            provider,
            stop,
            task,
        })
    }

    /// The PII key's columns go to the service, written as `admin`.
    fn write_providers(&self) -> WriteProviders {
        WriteProviders {
            by_master_key: [("pii_key".to_owned(), Arc::clone(&self.provider))].into(),
            context: clearice_crypto::CallContext {
                principal: "admin".into(),
                ..Default::default()
            },
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Moves `pii_key` into `DIR/crypto-server/` with the service's config and JWT secret.
#[expect(
    clippy::disallowed_methods,
    reason = "demo init is a one-off setup command that writes a lake before anything is served"
)]
fn write_crypto_server(dir: &Path, keyring: &KeyringKms, owner: Option<&str>) -> Result<()> {
    let service_dir = dir.join("crypto-server");
    std::fs::create_dir_all(&service_dir)?;
    let split = |keep: &dyn Fn(&str) -> bool| -> Result<String> {
        let all: HashMap<String, String> = serde_json::from_str(&keyring.to_json())?;
        let kept: std::collections::BTreeMap<_, _> =
            all.into_iter().filter(|(k, _)| keep(k)).collect();
        Ok(serde_json::to_string_pretty(&kept)?)
    };
    write_private(&dir.join("keyring.json"), &split(&|k| k != "pii_key")?)?;
    write_private(
        &service_dir.join("keyring.json"),
        &split(&|k| k == "pii_key")?,
    )?;
    use base64::Engine;
    let secret = base64::prelude::BASE64_STANDARD.encode(rand::random::<[u8; 32]>());
    write_private(&service_dir.join("jwt.secret"), &secret)?;
    let owner = match owner {
        Some(o) if !["admin", "analyst", "support"].contains(&o) && !o.contains('"') => {
            format!("\n[users.\"{o}\"]\nroles = [\"admin\"]\n")
        }
        _ => String::new(),
    };
    let config = format!(
        r#"# Demo protection service (clearice crypto-server --config crypto-server.toml).
# It holds pii_key; ClearIce sends it encrypted PII modules and the user they are read
# for, and it decides per user.
listen = "{REMOTE_DEMO_ADDR}"
audit = "audit.jsonl"

[kms]
type = "keyring"
path = "keyring.json"

[auth]
audience = "clearice-crypto"
hs256_secret_file = "jwt.secret"
trusted_services = ["clearice"]     # may name the user it reads for

[users.admin]
roles = ["admin"]

[users.support]
roles = ["support"]

[users.analyst]
roles = ["analyst"]
{owner}
[keys.pii_key]
roles = ["admin", "support"]        # analyst is refused by the service
"#
    );
    std::fs::write(service_dir.join("crypto-server.toml"), config)?;
    Ok(())
}

#[expect(
    clippy::disallowed_methods,
    reason = "demo init is a one-off setup command that writes a lake before anything is served"
)]
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    o.mode(0o600);
    o.open(path)?.write_all(text.as_bytes())?;
    Ok(())
}

fn prim(t: PrimitiveType) -> Type {
    Type::Primitive(t)
}

fn customers_schema() -> Result<Schema> {
    let dec = PrimitiveType::Decimal {
        precision: 12,
        scale: 2,
    };
    Ok(Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", prim(PrimitiveType::Long)).into(),
            NestedField::optional(2, "name", prim(PrimitiveType::String)).into(),
            NestedField::optional(3, "email", prim(PrimitiveType::String)).into(),
            NestedField::optional(4, "ssn", prim(PrimitiveType::String)).into(),
            NestedField::optional(5, "phone", prim(PrimitiveType::String)).into(),
            NestedField::optional(6, "birth_date", prim(PrimitiveType::Date)).into(),
            NestedField::optional(7, "balance", prim(dec)).into(),
            NestedField::optional(8, "signup_ts", prim(PrimitiveType::Timestamptz)).into(),
            NestedField::optional(9, "country", prim(PrimitiveType::String)).into(),
            NestedField::optional(
                10,
                "tags",
                Type::List(ListType::new(
                    NestedField::list_element(11, prim(PrimitiveType::String), false).into(),
                )),
            )
            .into(),
        ])
        .build()?)
}

fn orders_schema() -> Result<Schema> {
    let dec = PrimitiveType::Decimal {
        precision: 12,
        scale: 2,
    };
    Ok(Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "order_id", prim(PrimitiveType::Long)).into(),
            NestedField::required(2, "customer_id", prim(PrimitiveType::Long)).into(),
            NestedField::required(3, "order_date", prim(PrimitiveType::Date)).into(),
            NestedField::optional(4, "amount", prim(dec)).into(),
            NestedField::optional(5, "card_number", prim(PrimitiveType::String)).into(),
            NestedField::optional(6, "status", prim(PrimitiveType::String)).into(),
        ])
        .build()?)
}

const FIRST: &[&str] = &[
    "Alice", "Bob", "Carol", "David", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory",
    "Zoë", "José", "Łukasz", "Søren",
];
const LAST: &[&str] = &[
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Martinez",
    "Wilson", "Müller",
];
const COUNTRIES: &[&str] = &[
    "US", "DE", "FR", "GB", "ES", "IT", "NL", "PL", "SE", "JP", "BR", "CA",
];
const TAGS: &[&str] = &["newsletter", "b2b", "beta", "vip", "churn-risk"];

fn maybe<T>(rng: &mut StdRng, null_pct: u32, v: T) -> Option<T> {
    if rng.random_range(0..100) < null_pct {
        None
    } else {
        Some(v)
    }
}

fn customers_batch(rng: &mut StdRng, start: usize, n: usize) -> Result<RecordBatch> {
    let mut ids = Vec::with_capacity(n);
    let (
        mut names,
        mut emails,
        mut ssns,
        mut phones,
        mut births,
        mut balances,
        mut signups,
        mut countries,
    ) = (
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
    );
    let mut tags = ListBuilder::new(StringBuilder::new());
    for i in start..start + n {
        ids.push(1_000_000 + i as i64);
        let (f, l) = (
            FIRST[rng.random_range(0..FIRST.len())],
            LAST[rng.random_range(0..LAST.len())],
        );
        names.push(maybe(rng, 2, format!("{f} {l}")));
        let email = format!("{}.{}{i}@example.com", f.to_lowercase(), l.to_lowercase());
        emails.push(maybe(rng, 3, email));
        let ssn = format!(
            "{:03}-{:02}-{:04}",
            rng.random_range(100..900),
            rng.random_range(10..100),
            rng.random_range(0..10000)
        );
        ssns.push(maybe(rng, 4, ssn));
        let phone = format!(
            "+1-{:03}-555-{:04}",
            rng.random_range(200..999),
            rng.random_range(0..10000)
        );
        phones.push(maybe(rng, 5, phone));
        let birth = rng.random_range(-10957..13148); // 1940-01-01 .. 2005-12-31
        births.push(maybe(rng, 3, birth));
        let bal: i128 = rng.random_range(-1_000_000..50_000_000);
        balances.push(maybe(rng, 5, bal));
        let ts: i64 = rng.random_range(1_420_070_400_000_000..1_735_689_600_000_000);
        signups.push(maybe(rng, 2, ts));
        let country = COUNTRIES[rng.random_range(0..COUNTRIES.len())];
        countries.push(maybe(rng, 2, country));
        match rng.random_range(0..10) {
            0 => tags.append_null(),
            1 => tags.append(true),
            _ => {
                for _ in 0..rng.random_range(1..4) {
                    tags.values()
                        .append_value(TAGS[rng.random_range(0..TAGS.len())]);
                }
                tags.append(true)
            }
        }
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(StringArray::from(names)),
        Arc::new(StringArray::from(emails)),
        Arc::new(StringArray::from(ssns)),
        Arc::new(StringArray::from(phones)),
        Arc::new(Date32Array::from(births)),
        Arc::new(Decimal128Array::from(balances).with_precision_and_scale(12, 2)?),
        Arc::new(TimestampMicrosecondArray::from(signups).with_timezone("+00:00")),
        Arc::new(StringArray::from(countries)),
        Arc::new(tags.finish()),
    ];
    batch_for(&customers_schema()?, cols)
}

fn orders_batch(rng: &mut StdRng) -> Result<RecordBatch> {
    let days = 20089..20089 + 60; // 2025-01-01, 60 days
    let (mut ids, mut customers, mut dates) = (Vec::new(), Vec::new(), Vec::new());
    let (mut amounts, mut cards, mut statuses) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..ORDERS {
        ids.push(10_000_000 + i as i64);
        customers.push(1_000_000 + rng.random_range(0..CUSTOMERS as i64));
        dates.push(rng.random_range(days.clone()));
        let amount: i128 = rng.random_range(100..2_000_000);
        amounts.push(maybe(rng, 1, amount));
        let card = format!(
            "4{:03}-{:04}-{:04}-{:04}",
            rng.random_range(0..1000),
            rng.random_range(0..10000),
            rng.random_range(0..10000),
            rng.random_range(0..10000)
        );
        cards.push(maybe(rng, 1, card));
        statuses.push(Some(
            ["placed", "shipped", "delivered", "returned"][rng.random_range(0..4)],
        ));
    }
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(Int64Array::from(customers)),
        Arc::new(Date32Array::from(dates)),
        Arc::new(Decimal128Array::from(amounts).with_precision_and_scale(12, 2)?),
        Arc::new(StringArray::from(cards)),
        Arc::new(StringArray::from(statuses)),
    ];
    batch_for(&orders_schema()?, arrays)
}

fn batch_for(schema: &Schema, cols: Vec<ArrayRef>) -> Result<RecordBatch> {
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(schema)?);
    // Rebuild list arrays with the schema's element field (name and field id).
    let cols = cols
        .into_iter()
        .zip(arrow.fields())
        .map(|(c, f)| datafusion::arrow::compute::cast(&c, f.data_type()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(arrow, cols)?)
}

/// The demo policy: users `admin`, `analyst`, `support` in roles of the same names, plus
/// `owner` (the OS user who ran `demo init`) as an admin (so the first run shows plaintext).
pub fn demo_policy(owner: Option<&str>) -> String {
    let owner = match owner {
        Some(o) if !["admin", "analyst", "support"].contains(&o) && !o.contains('"') => {
            format!(
                "\"{o}\" = {{ roles = [\"admin\"] }}    # the OS user who ran `clearice demo init`\n"
            )
        }
        _ => String::new(),
    };
    format!(
        r#"# ClearIce demo policy. Who sees what of each column, and how columns are encrypted.
# Decisions: plaintext, null, fixed, show_last_4, show_first_4, sha256, hmac_sha256 (keyed:
# needs [masks] hmac_key_file), truncate_to_year, truncate_to_month, hide, deny. Most specific rule wins (user:NAME over role over "*");
# a protected column (master_key set) with no matching rule is denied.
# Writes: `[writes] create` may create and drop schemas and tables (and write tables
# without their own `write`); a table's `write` may change its rows; a protected column
# takes values only from its own `write` list. Files are encrypted as the table says.

on_missing_key = "error"

[roles]
admin = {{ description = "sees everything in plaintext" }}
analyst = {{ description = "analytics: identifiers masked, money in plaintext" }}
support = {{ description = "customer support: contact data, no identifiers or money" }}

[users]
admin = {{ roles = ["admin"] }}
analyst = {{ roles = ["analyst"] }}
support = {{ roles = ["support"] }}
{owner}
[files]
decrypt = ["admin"]            # who may decrypt standalone files (SELECT FROM 'file.parquet')

[writes]
create = ["admin"]             # CREATE/DROP SCHEMA and TABLE; writes to tables without `write`

[tables."lake.sales.customers"]
footer_key = "footer_key"
write = ["admin"]              # INSERT, DELETE, UPDATE, MERGE, DROP
export = ["admin"]             # COPY ... TO of decrypted protected columns

[tables."lake.sales.customers".columns.ssn]
master_key = "pii_key"
write = ["admin"]
access = {{ admin = "plaintext", analyst = "show_last_4", support = "null" }}

[tables."lake.sales.customers".columns.email]
master_key = "pii_key"
write = ["admin"]
access = {{ admin = "plaintext", analyst = "sha256", support = "plaintext" }}

[tables."lake.sales.customers".columns.phone]
master_key = "pii_key"
write = ["admin"]
access = {{ admin = "plaintext", analyst = "hide", support = "show_last_4" }}

[tables."lake.sales.customers".columns.balance]
master_key = "finance_key"
write = ["admin"]
access = {{ admin = "plaintext", analyst = "plaintext", support = "hide" }}

[tables."lake.sales.customers".columns.birth_date]
access = {{ analyst = "truncate_to_year", support = "hide" }}

[tables."lake.sales.customers".columns.tags]
access = {{ support = "null" }}

[tables."lake.sales.orders"]
footer_key = "footer_key"
write = ["admin"]
export = ["admin"]

[tables."lake.sales.orders".columns.amount]
master_key = "finance_key"
write = ["admin"]
access = {{ admin = "plaintext", analyst = "plaintext", support = "null" }}

[tables."lake.sales.orders".columns.card_number]
master_key = "finance_key"
write = ["admin"]
access = {{ admin = "plaintext", analyst = "deny", support = "show_last_4" }}
"#
    )
}

/// `[server.users.*]` for the demo principals, password = user name (argon2 hashes).
fn demo_server_users() -> Result<String> {
    server_users(&["admin", "analyst", "support"])
}

/// `[server]` user sections for demo principals whose password is their name (test and
/// demo configs only: `demo = true` marks them).
pub fn server_users(users: &[&str]) -> Result<String> {
    use argon2::password_hash::{PasswordHasher, SaltString, rand_core::OsRng};
    let mut out = String::new();
    for &user in users {
        let salt = SaltString::generate(&mut OsRng);
        let hash = argon2::Argon2::default()
            .hash_password(user.as_bytes(), &salt)
            .map_err(|e| format!("argon2: {e}"))?
            .to_string();
        out.push_str(&format!(
            "\n[server.users.{user}]\npassword_hash = \"{hash}\"\ndemo = true\n"
        ));
    }
    Ok(out)
}
