//! `clearice policy check`: every table, provider and key the policy names checked against the catalogs and providers, one line per problem.

use clearice_crypto::CallContext;

use crate::{Engine, ErrorClass, classify, message_of, one_line};

impl Engine {
    /// Whether each provider the table's policy names is reachable and knows the
    /// master keys routed to it.
    async fn check_providers(
        &self,
        table: &str,
        tpol: &clearice_policy::TablePolicy,
    ) -> Vec<String> {
        let providers = tpol.key_providers();
        let mut by_provider: std::collections::BTreeMap<&str, Vec<(String, &str)>> =
            Default::default();
        for (col, c) in &tpol.columns {
            if let Some(k) = &c.master_key {
                by_provider
                    .entry(providers[k].as_str())
                    .or_default()
                    .push((k.clone(), col));
            }
        }
        let context = CallContext {
            principal: "clearice-policy-check".into(),
            application: [("table".to_owned(), table.to_owned())].into(),
            ..Default::default()
        };
        let mut problems = Vec::new();
        for (name, keys) in by_provider {
            let Some(provider) = self.providers.get(name) else {
                continue;
            };
            let ids: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
            match provider.check_access(&context, &ids).await {
                Err(e) => problems.push(format!("{table}: {e}")),
                Ok(answers) => {
                    for (k, col) in &keys {
                        if answers.get(k) == Some(&clearice_crypto::KeyAccess::Unknown) {
                            problems.push(format!(
                                "{table}.{col}: crypto provider '{name}' does not know master key '{k}'"
                            ));
                        }
                    }
                }
            }
        }
        problems
    }

    /// Checks the policy against the catalogs (`clearice policy check`): every table and
    /// column it names exists, every mask applies to its column's type, and every column
    /// encrypted under its own key in the table's current data is declared with that
    /// `master_key` (reading one data file's footer; no column key is requested), the
    /// table's files can be planned, and `SELECT *` of it plans for every user of the
    /// policy (a refusal by the policy is fine; any other failure is a problem), and every
    /// crypto provider it names answers and knows the master keys routed to it.
    /// Returns the problems found, one line each.
    pub async fn check_policy(&self) -> Vec<String> {
        use futures::TryStreamExt;
        let mut problems = Vec::new();
        for (name, tpol) in self.policy.tables() {
            let parts: Vec<&str> = name.split('.').collect();
            let Some(cat) = self.iceberg.get(parts[0]) else {
                problems.push(format!("{name}: no catalog '{}' in the config", parts[0]));
                continue;
            };
            // catalog.namespace.table, the namespace of any depth.
            let ns = parts[1..parts.len() - 1]
                .iter()
                .map(|p| (*p).to_owned())
                .collect::<Vec<_>>();
            let Ok(ns) = iceberg::NamespaceIdent::from_vec(ns) else {
                problems.push(format!("{name}: not catalog.namespace.table"));
                continue;
            };
            let ident = iceberg::TableIdent::new(ns, parts[parts.len() - 1].into());
            let table = match cat.load_table(&ident).await {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{name}: {}", one_line(&e)));
                    continue;
                }
            };
            let schema =
                match clearice_iceberg::arrow_schema(name, table.metadata().current_schema()) {
                    Ok(s) => s,
                    Err(e) => {
                        problems.push(one_line(&e));
                        continue;
                    }
                };
            let cols: Vec<(String, clearice_policy::ColumnKind)> = schema
                .fields()
                .iter()
                .map(|f| {
                    (
                        f.name().clone(),
                        clearice_access::column_kind(f.data_type()),
                    )
                })
                .collect();
            problems.extend(
                self.policy
                    .check_table(name, &cols)
                    .iter()
                    .map(|e| e.to_string()),
            );
            problems.extend(self.check_providers(name, tpol).await);
            for user in self.policy.user_names() {
                let session = self.session_for(user, "policy-check");
                if let Err(e) = session.sql_plan(&format!("SELECT * FROM {name}")).await
                    && classify(&e) != ErrorClass::Denied
                {
                    problems.push(format!(
                        "{name}: SELECT * does not plan for user '{user}': {}",
                        message_of(&e)
                    ));
                }
            }
            // A table Iceberg encrypts itself: every file is under its own key from the
            // manifests, which only a principal's scan unwraps (its table key may be a
            // provider's, deciding per user): the per-user plans above are the check.
            if clearice_iceberg::native::table_key_id(table.metadata()).is_some() {
                continue;
            }
            let planned = match table.scan().select_all().build() {
                Ok(scan) => match scan.plan_files().await {
                    Ok(s) => s.try_collect::<Vec<_>>().await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            let tasks = match planned {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{name}: cannot plan its files: {}", one_line(&e)));
                    continue;
                }
            };
            let Some(task) = tasks.first() else { continue };
            let path = task.data_file_path.clone();
            let keys = self.file_column_keys(&path).await;
            match keys {
                Ok(keys) => {
                    for (col, key) in keys {
                        let top = col.split('.').next().unwrap_or(&col);
                        let declared = tpol.columns.get(top).and_then(|c| c.master_key.clone());
                        if let Some(k) = key
                            && declared.as_deref() != Some(k.as_str())
                        {
                            problems.push(format!(
                                "{name}.{top}: encrypted under master key '{k}' in '{path}', but the policy declares {}",
                                declared.map(|d| format!("master_key = '{d}'")).unwrap_or_else(|| "no master_key".into())
                            ));
                        }
                    }
                }
                Err(e) => problems.push(format!("{name}: cannot read '{path}': {e}")),
            }
        }
        problems.extend(self.check_unnamed_tables().await);
        problems
    }

    /// Catalog tables the policy does not name whose data has encrypted columns: they
    /// are denied to everyone (fail closed) until the policy names them (one data file's
    /// footer read per table; no column key is requested).
    async fn check_unnamed_tables(&self) -> Vec<String> {
        use futures::TryStreamExt;
        let mut problems = Vec::new();
        for (cat_name, cat) in &self.iceberg {
            let mut pending: Vec<Option<iceberg::NamespaceIdent>> = vec![None];
            let mut tables = Vec::new();
            while let Some(parent) = pending.pop() {
                let Ok(children) = cat.list_namespaces(parent.as_ref()).await else {
                    continue;
                };
                for ns in children {
                    if let Ok(t) = cat.list_tables(&ns).await {
                        tables.extend(t);
                    }
                    pending.push(Some(ns));
                }
            }
            for ident in tables {
                let name = format!(
                    "{cat_name}.{}.{}",
                    ident.namespace().clone().inner().join("."),
                    ident.name()
                );
                if self.policy.table(&name).is_some() {
                    continue;
                }
                let Ok(table) = cat.load_table(&ident).await else {
                    continue;
                };
                // Denied to everyone when the policy does not name it (see above).
                if clearice_iceberg::native::table_key_id(table.metadata()).is_some() {
                    continue;
                }
                let tasks = match table.scan().select_all().build() {
                    Ok(scan) => match scan.plan_files().await {
                        Ok(s) => s.try_collect::<Vec<_>>().await.unwrap_or_default(),
                        Err(_) => vec![],
                    },
                    Err(_) => vec![],
                };
                let Some(task) = tasks.first() else { continue };
                if let Ok(keys) = self.file_column_keys(&task.data_file_path).await {
                    let encrypted: Vec<String> = keys
                        .into_iter()
                        .filter_map(|(c, k)| Some(format!("'{c}' (master key '{}')", k?)))
                        .collect();
                    if !encrypted.is_empty() {
                        problems.push(format!(
                            "{name}: not named by the policy, but its columns {} are encrypted: they are denied to everyone until the policy names the table and their master_key",
                            encrypted.join(", ")
                        ));
                    }
                }
            }
        }
        problems
    }
}
