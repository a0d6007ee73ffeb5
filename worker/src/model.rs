//! Models built from candle-nn, so their parameters live in a `VarMap` whose names
//! are the PS keys.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder, VarMap, linear};
use ps_common::rng::SplitMix64;

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

    /// Draws every layer's parameters again from `seed`, with candle-nn's own
    /// distributions for a linear layer (Kaiming-normal weights for ReLU,
    /// biases uniform within `1/sqrt(fan_in)`), so that runs with the same seed
    /// start from the same model on every machine and device. candle draws
    /// from an unseeded generator, which made two runs of one job differ.
    ///
    /// # Errors
    /// When `varmap` does not hold this model's variables.
    pub fn draw_parameters(&self, varmap: &VarMap, seed: u64) -> Result<()> {
        for (i, layer) in self.layers.iter().enumerate() {
            let weight = layer.weight();
            let (out, fan_in) = weight.dims2()?;
            let mut rng = SplitMix64::new(seed ^ ((i as u64 + 1) << 32));
            let std = (2.0 / fan_in as f64).sqrt() as f32;
            let values: Vec<f32> = (0..out * fan_in).map(|_| rng.normal() * std).collect();
            let drawn = Tensor::from_vec(values, (out, fan_in), weight.device())?;
            set(varmap, &format!("fc{i}.weight"), &drawn)?;
            if let Some(bias) = layer.bias() {
                let bound = 1.0 / (fan_in as f64).sqrt();
                let values: Vec<f32> = (0..out)
                    .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
                    .collect();
                let drawn = Tensor::from_vec(values, out, bias.device())?;
                set(varmap, &format!("fc{i}.bias"), &drawn)?;
            }
        }
        Ok(())
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

/// Writes `value` into the variable `name` of `varmap`, in its own dtype.
fn set(varmap: &VarMap, name: &str, value: &Tensor) -> Result<()> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| candle_core::Error::Msg("the VarMap's lock is poisoned".into()))?;
    let var = data
        .get(name)
        .ok_or_else(|| candle_core::Error::Msg(format!("no variable {name}")))?;
    var.set(&value.to_dtype(var.dtype())?)
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

    fn parameters_of(seed: u64) -> Vec<(String, Vec<f32>)> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let mlp = Mlp::new(vb, 64, &[32], 10).unwrap();
        mlp.draw_parameters(&varmap, seed).unwrap();
        let data = varmap.data().lock().unwrap();
        let mut parameters: Vec<(String, Vec<f32>)> = data
            .iter()
            .map(|(name, var)| {
                let values = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
                (name.clone(), values)
            })
            .collect();
        parameters.sort_by(|a, b| a.0.cmp(&b.0));
        parameters
    }

    #[test]
    fn a_seed_draws_the_same_parameters_and_another_seed_others() {
        let (first, again, other) = (parameters_of(7), parameters_of(7), parameters_of(8));
        assert_eq!(first, again);
        assert_ne!(first, other);
        // fc0.weight: 32 x 64, Kaiming-normal, std sqrt(2/64) = 0.177.
        let weight = &first
            .iter()
            .find(|(name, _)| name == "fc0.weight")
            .unwrap()
            .1;
        let var = weight.iter().map(|w| w * w).sum::<f32>() / weight.len() as f32;
        assert!((var.sqrt() - 0.177).abs() < 0.02, "std {}", var.sqrt());
        let bias = &first.iter().find(|(name, _)| name == "fc0.bias").unwrap().1;
        assert!(bias.iter().all(|b| b.abs() <= 0.125), "{bias:?}");
        assert!(bias.iter().any(|b| *b != 0.0));
    }
}
