//! A scan's data files as `DataSourceExec` plans: each file with what is known of its
//! rows (manifest record counts, footer statistics as the principal may see them), split
//! into byte-balanced groups the same way on the coordinator and every worker.

use super::*;

/// Splits files into at most `n` groups of similar byte size (largest first).
fn split_groups(mut files: Vec<PartitionedFile>, n: usize) -> Vec<FileGroup> {
    let n = n.max(1).min(files.len().max(1));
    // Ties broken by path: Iceberg plans manifests concurrently, so the files come in any
    // order, and workers must group them exactly as the coordinator did.
    files.sort_by(|a, b| {
        b.object_meta
            .size
            .cmp(&a.object_meta.size)
            .then_with(|| a.object_meta.location.cmp(&b.object_meta.location))
    });
    let mut groups: Vec<(u64, Vec<PartitionedFile>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for f in files {
        let g = groups.iter_mut().min_by_key(|g| g.0).expect("n >= 1");
        g.0 += f.object_meta.size;
        g.1.push(f);
    }
    groups
        .into_iter()
        .filter(|g| !g.1.is_empty())
        .map(|g| FileGroup::new(g.1))
        .collect()
}

impl IcebergTableProvider {
    /// The footer statistics of each of `tasks` without deletes, as [`Shown`] lets this
    /// scan carry them (read a few files at a time, cached; see `statistics.rs`).
    pub(super) async fn file_statistics(
        &self,
        tasks: &[FileScanTask],
        factory: &DecryptingReaderFactory,
        grant: &ScanGrant,
    ) -> Vec<Option<Arc<Statistics>>> {
        if tasks.len() > crate::statistics::MAX_FILES
            || matches!(self.shown, Shown::Nothing | Shown::RowCounts)
        {
            return vec![None; tasks.len()];
        }
        let file_schema = self.file_schema();
        let pending: Vec<_> = tasks
            .iter()
            .map(|t| {
                self.file_statistics_of(t, factory, grant, &file_schema)
                    .boxed()
            })
            .collect();
        futures::stream::iter(pending)
            .buffered(LOAD_CONCURRENCY)
            .collect()
            .await
    }

    async fn file_statistics_of(
        &self,
        t: &FileScanTask,
        factory: &DecryptingReaderFactory,
        grant: &ScanGrant,
        file_schema: &SchemaRef,
    ) -> Option<Arc<Statistics>> {
        if !t.deletes.is_empty() {
            return None;
        }
        let file = self.scan_file(t, None).ok()?;
        let stats = crate::statistics::of_file(
            factory,
            grant,
            &self.name,
            &t.data_file_path,
            &file,
            file_schema,
        )
        .await?;
        // A footer that disagrees with its manifest entry is not this table's file.
        if t.record_count
            .is_some_and(|n| stats.num_rows != Precision::Exact(n as usize))
        {
            return None;
        }
        let width = self.full_schema().fields().len();
        crate::statistics::shown(&stats, &self.shown, &grant.scope, width).map(Arc::new)
    }

    /// One `DataSourceExec` reading `file` whole, in order, in one partition.
    pub(super) fn data_scan_unsplit(
        &self,
        source: ParquetSource,
        store_url: &ObjectStoreUrl,
        file: ScanFile,
        projection: &[usize],
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let config = FileScanConfigBuilder::new(store_url.clone(), Arc::new(source))
            .with_file_groups(vec![FileGroup::new(vec![file.file])])
            .with_projection_indices(Some(projection.to_vec()))?
            .with_expr_adapter(Some(Arc::new(FieldIdExprAdapterFactory)))
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }

    /// One `DataSourceExec` over `files`, split into byte-balanced groups.
    pub(super) fn data_scan(
        &self,
        source: ParquetSource,
        store_url: &ObjectStoreUrl,
        files: Vec<ScanFile>,
        projection: &[usize],
        limit: Option<usize>,
        partitions: usize,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        // Each file's footer statistics where known; else Iceberg's record counts, exact
        // for files without deletes: `count(*)` over them needs no IO.
        let schema = self.full_schema();
        let mut table_stats = Statistics::new_unknown(&schema);
        let footers: Option<Vec<Arc<Statistics>>> = files.iter().map(|f| f.stats.clone()).collect();
        let rows: Option<u64> = files.iter().map(|f| f.rows).sum();
        let exact = files.iter().all(|f| f.exact);
        match (footers, rows) {
            _ if matches!(self.shown, Shown::Nothing) => {}
            (Some(footers), _) if !footers.is_empty() => {
                table_stats =
                    Statistics::try_merge_iter(footers.iter().map(AsRef::as_ref), &schema)?;
            }
            (_, Some(n)) => {
                table_stats.num_rows = if exact {
                    Precision::Exact(n as usize)
                } else {
                    Precision::Inexact(n as usize)
                };
            }
            _ => {}
        }
        let files = files
            .into_iter()
            .map(|f| match (f.stats, f.rows) {
                _ if matches!(self.shown, Shown::Nothing) => f.file,
                (Some(stats), _) => f.file.with_statistics(stats),
                (None, Some(n)) if f.exact => {
                    let mut stats = Statistics::new_unknown(&schema);
                    stats.num_rows = Precision::Exact(n as usize);
                    f.file.with_statistics(Arc::new(stats))
                }
                _ => f.file,
            })
            .collect();
        let mut groups = split_groups(files, partitions);
        // A scan planned for workers is not optimized again there, so the byte-range split
        // DataFusion's optimizer makes of large files on one machine is made here (the
        // same on the coordinator and every worker): a few large files still spread over
        // every worker's partitions.
        if self.split.is_some()
            && let Some(ranged) = datafusion::datasource::physical_plan::FileGroupPartitioner::new()
                .with_target_partitions(partitions)
                .with_repartition_file_min_size(RANGE_MIN_BYTES)
                .repartition_file_groups(&groups)
        {
            groups = ranged;
        }
        let config = FileScanConfigBuilder::new(store_url.clone(), Arc::new(source))
            .with_statistics(table_stats)
            .with_file_groups(groups)
            .with_projection_indices(Some(projection.to_vec()))?
            .with_limit(limit)
            .with_expr_adapter(Some(Arc::new(FieldIdExprAdapterFactory)))
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }
}

/// Smallest file split into byte ranges in a scan planned for workers (DataFusion's
/// `repartition_file_min_size` default).
const RANGE_MIN_BYTES: usize = 10 * 1024 * 1024;

/// A data file of a scan and what is known of its rows.
pub(super) struct ScanFile {
    pub(super) file: PartitionedFile,
    pub(super) rows: Option<u64>,
    /// No delete applies: `rows` is exact.
    pub(super) exact: bool,
    /// Its footer's statistics as the principal may see them (files without deletes).
    pub(super) stats: Option<Arc<Statistics>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(groups: &[FileGroup]) -> Vec<Vec<String>> {
        groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|f| f.object_meta.location.to_string())
                    .collect()
            })
            .collect()
    }

    /// Workers group a scan's files again: whatever order Iceberg lists them in, the
    /// groups must be the coordinator's.
    #[test]
    fn file_groups_do_not_depend_on_listing_order() {
        let files: Vec<PartitionedFile> = (0..12)
            .map(|i| PartitionedFile::new(format!("data/f{i:02}.parquet"), 100 + (i % 3) * 10))
            .collect();
        let want = names(&split_groups(files.clone(), 4));
        for seed in 0..20u64 {
            let mut shuffled = files.clone();
            // A deterministic shuffle per seed.
            shuffled.sort_by_key(|f| {
                let h = f
                    .object_meta
                    .location
                    .as_ref()
                    .bytes()
                    .fold(seed, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
                h.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            });
            assert_eq!(names(&split_groups(shuffled, 4)), want, "seed {seed}");
        }
        assert_eq!(want.len(), 4);
        assert_eq!(want.iter().map(Vec::len).sum::<usize>(), 12);
    }
}
