//! Embedding tables: rows named by 64-bit ids, spread over buckets by a hash of
//! the id (`ps_proto::rows`), each bucket held by one server.
//!
//! - [`spec`]: a table's width, initialiser, optimizer and bounds, checked.
//! - [`init`]: a row's initial values, the same on every server and restart.
//! - [`row_optimizer`]: SGD, Adagrad and lazy Adam over one row.
//! - [`bucket`]: one bucket's rows, version, per-worker steps and BSP accumulator.
//!
//! The store's operations on tables (declare, pull, push) are in `crate::store::rows`.

pub mod bucket;
pub mod init;
pub mod row_optimizer;
pub mod spec;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use bucket::Bucket;
pub use spec::{RowInit, RowOptimizer, TableSpec};

/// One declared table and the buckets of it this server holds.
#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) spec: TableSpec,
    pub(crate) buckets: RwLock<HashMap<u32, Arc<Bucket>>>,
}

impl Table {
    /// A table holding no bucket yet.
    pub(crate) fn new(spec: TableSpec) -> Self {
        Self {
            spec,
            buckets: RwLock::default(),
        }
    }

    /// Whether this server holds `bucket`.
    pub(crate) fn holds(&self, bucket: u32) -> bool {
        let buckets = self.buckets.read().unwrap_or_else(|p| p.into_inner());
        buckets.contains_key(&bucket)
    }

    /// Every bucket this server holds, taken out from under the map's lock.
    pub(crate) fn all_buckets(&self) -> Vec<Arc<Bucket>> {
        let buckets = self.buckets.read().unwrap_or_else(|p| p.into_inner());
        buckets.values().cloned().collect()
    }
}

/// Every table of a server, by name.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    tables: RwLock<HashMap<String, Arc<Table>>>,
    /// Held by a declaration while it makes and inserts the buckets this
    /// server lacks: workers declaring a table at once after a server was
    /// lost restore (and charge) each bucket from its checkpoint once, not
    /// once each.
    pub(crate) declaring: std::sync::Mutex<()>,
}

impl Tables {
    /// The table `name`, when it was declared here.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Table>> {
        let tables = self.tables.read().unwrap_or_else(|p| p.into_inner());
        tables.get(name).cloned()
    }

    /// How many tables are declared here.
    pub(crate) fn len(&self) -> usize {
        self.tables.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The table `spec` names: the one declared, or a new one. `Err` carries
    /// the declared table when its spec differs.
    pub(crate) fn declare(&self, spec: &TableSpec) -> Result<Arc<Table>, Arc<Table>> {
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let table = tables
            .entry(spec.name.clone())
            .or_insert_with(|| Arc::new(Table::new(spec.clone())));
        if table.spec == *spec {
            Ok(Arc::clone(table))
        } else {
            Err(Arc::clone(table))
        }
    }

    /// Every table, taken out from under the map's lock.
    pub(crate) fn all(&self) -> Vec<Arc<Table>> {
        let tables = self.tables.read().unwrap_or_else(|p| p.into_inner());
        tables.values().cloned().collect()
    }
}
