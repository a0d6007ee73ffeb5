//! The table methods of [`ParameterService`]: `DeclareTable`, `PullRows` and
//! `PushRows`, each through the one admission step (map version, then memory
//! budget) before the store sees it, as the dense methods are.

use prost::Message;
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::v1;

use crate::admission::Admitted;
use crate::error::{Error, Result};
use crate::service::ParameterService;
use crate::table_wire;

/// The highest `DeclareTable.restore_version` taken: far past any job's
/// steps, and far enough below `u64::MAX` that steps after it cannot overflow.
const MAX_RESTORE_VERSION: u64 = 1 << 62;

impl ParameterService {
    /// A `DeclareTable`, admitted by map version and applied.
    pub(crate) async fn declare_table_rows(
        &self,
        request: &v1::DeclareTableRequest,
    ) -> Result<v1::DeclareTableResponse> {
        // Nothing to charge here: a bucket holds no rows until pushes make
        // them, and the store charges each row as it makes it.
        let _admitted = Admitted::map(self.store(), request.map_version).await?;
        let spec = table_wire::table_spec(request.table.as_ref())?;
        if request.restore_version > MAX_RESTORE_VERSION {
            return Err(Error::InvalidField {
                field: "restore_version",
                reason: format!(
                    "{} is past any step a job reaches (at most {MAX_RESTORE_VERSION})",
                    request.restore_version
                ),
            });
        }
        let restore = Version(request.restore_version);
        let declared = self
            .store()
            .declare_table(spec, &request.buckets, restore)?;
        Ok(table_wire::declare_response(declared))
    }

    /// A `PullRows`: admitted, its answer's bytes charged while it is built,
    /// refused before any row is read when it would pass `limit`.
    pub(crate) async fn pull_table_rows(
        &self,
        request: &v1::PullRowsRequest,
        limit: usize,
    ) -> Result<v1::PullRowsResponse> {
        let admitted = Admitted::map(self.store(), request.map_version).await?;
        let blocks = table_wire::row_blocks(&request.table, &request.blocks, false)?;
        let bytes = self.store().pull_rows_bytes(&request.table, &blocks)?;
        if bytes > limit {
            return Err(Error::ResponseTooLarge { bytes, limit });
        }
        let ids: usize = blocks.iter().map(|b| b.ids.len()).sum();
        let _held = admitted.charge(bytes, || {
            format!("pulling {ids} rows of table `{}`", request.table)
        })?;
        let timeout = self.config().pull_timeout(request.timeout_ms);
        let pulled = self
            .store()
            .pull_rows(
                &request.table,
                &blocks,
                Version(request.min_version),
                timeout,
                MapVersion(request.map_version),
            )
            .await?;
        let response = table_wire::pull_rows_response(pulled);
        if response.encoded_len() > limit {
            return Err(Error::ResponseTooLarge {
                bytes: response.encoded_len(),
                limit,
            });
        }
        Ok(response)
    }

    /// A `PushRows`: admitted, its decoded rows charged while they are applied.
    pub(crate) async fn push_table_rows(
        &self,
        request: &v1::PushRowsRequest,
    ) -> Result<v1::PushRowsResponse> {
        let admitted = Admitted::map(self.store(), request.map_version).await?;
        let blocks = table_wire::row_blocks(&request.table, &request.blocks, true)?;
        let bytes = blocks
            .iter()
            .map(|b| b.rows.len() * 4 + b.ids.len() * 8)
            .sum();
        let _held = admitted.charge(bytes, || {
            format!("a push of rows to table `{}`", request.table)
        })?;
        let (worker, step) = (Rank(request.worker_id), Step(request.step));
        let pushed = self
            .store()
            .push_rows(&request.table, worker, step, &blocks)?;
        Ok(table_wire::push_rows_response(pushed))
    }
}
