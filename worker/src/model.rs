//! Models built from candle-nn, so their parameters live in a `VarMap` whose names
//! are the PS keys.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder, linear};

use crate::segmented::Cuts;

/// A multi-layer perceptron: linear layers with ReLU between them.
#[derive(Debug, Clone)]
pub struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    /// `input -> hidden[0] -> ... -> classes`; layer `i` is named `fc{i}`.
    ///
    /// # Errors
    /// When the variables cannot be created.
    pub fn new(vb: VarBuilder<'_>, input: usize, hidden: &[usize], classes: usize) -> Result<Self> {
        let widths: Vec<usize> = std::iter::once(input)
            .chain(hidden.iter().copied())
            .chain([classes])
            .collect();
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| linear(w[0], w[1], vb.pp(format!("fc{i}"))))
            .collect::<Result<_>>()?;
        Ok(Self { layers })
    }

    /// Layers in the model.
    pub fn depth(&self) -> usize {
        self.layers.len()
    }

    /// The forward pass cut into `segments` runs of about as many layers each
    /// (at most one per layer), the boundaries recorded in `cuts` for
    /// [`crate::PsTrainer::backward_segments`]. One segment is
    /// [`Module::forward`].
    ///
    /// # Errors
    /// candle's.
    pub fn forward_cut(&self, x: &Tensor, segments: usize, cuts: &mut Cuts) -> Result<Tensor> {
        let segments = segments.clamp(1, self.depth());
        let last = self.depth() - 1;
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            // Layer i opens segment i * segments / depth.
            if i > 0 && i * segments / self.depth() != (i - 1) * segments / self.depth() {
                h = cuts.cut(&h)?;
            }
            h = layer.forward(&h)?;
            if i < last {
                h = h.relu()?;
            }
        }
        Ok(h)
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_cut(x, 1, &mut Cuts::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;

    #[test]
    fn layers_are_named_and_shaped() {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let mlp = Mlp::new(vb, 64, &[32, 16], 10).unwrap();
        let mut names: Vec<String> = varmap.data().lock().unwrap().keys().cloned().collect();
        names.sort();
        assert_eq!(
            names,
            [
                "fc0.bias",
                "fc0.weight",
                "fc1.bias",
                "fc1.weight",
                "fc2.bias",
                "fc2.weight"
            ]
        );
        let out = mlp
            .forward(&Tensor::zeros((5, 64), DType::F32, &Device::Cpu).unwrap())
            .unwrap();
        assert_eq!(out.dims(), [5, 10]);
    }
}
