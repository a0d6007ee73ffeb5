//! [`PsEmbedding`]: an embedding table on the parameter servers as a candle
//! layer. Each step gathers the rows its batch reads, each distinct id once,
//! into a small dense `Var`, and looks the batch up in it with `index_select`;
//! after backward it pushes that `Var`'s gradient, one row per distinct id
//! (candle has already summed the gradients of an id's repeats). The dense
//! part of the model goes through [`crate::PsTrainer`] as before.

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use ps_client::{PsClient, UniqueIds};
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::v1;

use crate::trainer::TrainerError;

/// The rows one step gathered.
struct Gathered {
    ids: Vec<u64>,
    rows: Var,
}

/// An embedding table held by the parameter servers.
pub struct PsEmbedding {
    table: String,
    width: usize,
    device: Device,
    gathered: Option<Gathered>,
}

impl PsEmbedding {
    /// Declares `table` through `client` (every worker of a job declares the
    /// same table) and makes the layer, computing on `device`.
    ///
    /// # Errors
    /// [`TrainerError`] when a server refuses the table.
    pub async fn declare(
        client: &mut PsClient,
        table: v1::TableSpec,
        device: &Device,
    ) -> Result<Self, TrainerError> {
        let (name, width) = (table.name.clone(), table.width as usize);
        client.declare_table(table).await?;
        Ok(Self {
            table: name,
            width,
            device: device.clone(),
            gathered: None,
        })
    }

    /// Elements per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The rows of `ids` once every bucket they come from reaches
    /// `min_version`, as a tensor of `shape` (the ids' shape) plus the row
    /// width, which backward differentiates into this step's rows.
    ///
    /// # Errors
    /// [`TrainerError`] from the servers or candle (`shape` not holding
    /// `ids.len()` ids).
    pub async fn lookup(
        &mut self,
        client: &PsClient,
        ids: &[u64],
        shape: &[usize],
        min_version: Version,
    ) -> Result<Tensor, TrainerError> {
        let unique = UniqueIds::of(ids);
        let rows = client
            .pull_unique_rows(&self.table, &unique, min_version)
            .await?;
        let rows = Var::from_tensor(&Tensor::from_vec(
            rows,
            (unique.ids.len(), self.width),
            &self.device,
        )?)?;
        let index = Tensor::from_vec(unique.index, ids.len(), &self.device)?;
        let mut dims = shape.to_vec();
        dims.push(self.width);
        let looked_up = rows.as_tensor().index_select(&index, 0)?.reshape(dims)?;
        self.gathered = Some(Gathered {
            ids: unique.ids,
            rows,
        });
        Ok(looked_up)
    }

    /// Pushes the gradient of the last lookup's rows in `grads` as `(worker,
    /// step)`; every bucket of the table hears of the step, so BSP steps
    /// complete. The rows stay gathered until the next lookup, so a push that
    /// failed, or whose buckets were restored since, can be repeated (a
    /// bucket that took it acknowledges the repeat). Returns how many buckets
    /// took it.
    ///
    /// # Errors
    /// [`TrainerError`] from the servers or candle; [`TrainerError::Usage`]
    /// when nothing was looked up yet.
    pub async fn push_gradients(
        &self,
        client: &PsClient,
        grads: &GradStore,
        at: (Rank, Step),
    ) -> Result<usize, TrainerError> {
        let Some(gathered) = &self.gathered else {
            return Err(TrainerError::Usage(
                "push_gradients before any lookup".into(),
            ));
        };
        let grad = match grads.get(gathered.rows.as_tensor()) {
            Some(grad) => grad.flatten_all()?.to_vec1::<f32>()?,
            None => vec![0.0; gathered.ids.len() * self.width],
        };
        Ok(client
            .push_unique_rows(&self.table, at, &gathered.ids, &grad)
            .await?)
    }

    /// The rows of `ids` as they are now (no waiting), for evaluation.
    ///
    /// # Errors
    /// As [`PsEmbedding::lookup`].
    pub async fn read(
        &self,
        client: &PsClient,
        ids: &[u64],
        shape: &[usize],
    ) -> Result<Tensor, TrainerError> {
        let rows = client.pull_rows(&self.table, ids, Version(0)).await?;
        let mut dims = shape.to_vec();
        dims.push(self.width);
        Ok(Tensor::from_vec(rows, dims, &self.device)?)
    }
}
