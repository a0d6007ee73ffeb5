//! Conversions between the `ps.v1` table messages and the store's row types,
//! with every field validated (a bad field becomes an [`Error`], never a panic).

use ps_proto::key::ParamKey;
use ps_proto::rows::{decode_ids, decode_rows};
use ps_proto::v1;

use crate::error::{Error, Result};
use crate::store::{DeclaredBucket, PulledTable, PushedBucket, RowBlock};
use crate::table::TableSpec;

/// Validates a table from the wire.
///
/// # Errors
/// `InvalidTable`, saying what to change.
pub fn table_spec(table: Option<&v1::TableSpec>) -> Result<TableSpec> {
    let Some(table) = table else {
        return Err(Error::InvalidField {
            field: "table",
            reason: "missing; say which table to declare".into(),
        });
    };
    TableSpec::from_proto(table).map_err(|reason| Error::InvalidTable {
        table: table.name.clone(),
        reason,
    })
}

/// The blocks of a pull (`rows` ignored) or a push of `table`, decoded.
///
/// # Errors
/// `BadRows` for ids or rows whose byte length is not a whole number of them.
pub fn row_blocks(table: &str, blocks: &[v1::RowBlock], with_rows: bool) -> Result<Vec<RowBlock>> {
    blocks
        .iter()
        .map(|block| {
            let bad = |reason| Error::BadRows {
                key: ParamKey::new(table, block.bucket),
                reason,
            };
            let ids = decode_ids(&block.ids).map_err(bad)?;
            let rows = match with_rows {
                true => decode_rows(&block.rows).map_err(bad)?,
                false => Vec::new(),
            };
            Ok(RowBlock {
                bucket: block.bucket,
                ids,
                rows,
            })
        })
        .collect()
}

/// The answer to a `DeclareTable`.
pub fn declare_response(declared: Vec<DeclaredBucket>) -> v1::DeclareTableResponse {
    let buckets = declared
        .into_iter()
        .map(|d| v1::DeclaredBucket {
            bucket: d.bucket,
            created: d.created,
            version: d.version.get(),
            rows: d.rows as u64,
        })
        .collect();
    v1::DeclareTableResponse { buckets }
}

/// The answer to a `PullRows`.
pub fn pull_rows_response(pulled: PulledTable) -> v1::PullRowsResponse {
    let blocks = pulled
        .blocks
        .into_iter()
        .map(|p| v1::PulledRows {
            bucket: p.bucket,
            version: p.version.get(),
        })
        .collect();
    v1::PullRowsResponse {
        blocks,
        rows: pulled.rows,
    }
}

/// The answer to a `PushRows`.
pub fn push_rows_response(pushed: Vec<PushedBucket>) -> v1::PushRowsResponse {
    let buckets = pushed
        .into_iter()
        .map(|p| v1::PushedBucket {
            bucket: p.bucket,
            accepted: p.accepted,
            version: p.version.get(),
        })
        .collect();
    v1::PushRowsResponse { buckets }
}
