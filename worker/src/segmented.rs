//! Segmented backward (opt-in): a model's forward pass cut at boundaries, so
//! that its backward pass runs one segment at a time, the top first, and the
//! top segments' gradients can be pushed while the segments below are still
//! being differentiated (Poseidon's overlap, within what candle allows: it
//! has no per-tensor gradient hook).
//!
//! ```text
//! let mut cuts = Cuts::default();
//! let h = lower.forward(&x)?;
//! let h = cuts.cut(&h)?;                          // a boundary
//! let loss = cross_entropy(&upper.forward(&h)?, &y)?;
//! trainer.backward_segments(&loss, cuts).await?;  // instead of backward_step
//! ```
//!
//! At a boundary the output `h` of the segment below is replaced by a new leaf
//! variable holding a copy of its values. The backward pass of the segment
//! above stops there, with the gradient `g` of the loss with respect to `h`;
//! the segment below is then differentiated through `sum(h * g)` (`g`
//! detached, a constant), whose gradient with respect to `h` is `g` itself
//! (`1 * g`, exact in floating point), so every parameter gets the gradient
//! one whole backward pass would give it. The cost is one copy of `h`, one multiply and one sum per
//! boundary.
//!
//! What it cannot do: a parameter used on both sides of a boundary (tied
//! weights) would get its gradient in parts, one per segment. The trainer
//! finds it when the second part appears, after the first was pushed, and
//! fails the step naming the parameter; the worker must stop there. A value
//! computed below a boundary and used above it other than through the cut
//! tensor is not differentiated through. Cut only where everything above
//! depends on what is below through the one tensor cut.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

/// The boundaries of one forward pass, in the order it crossed them.
#[derive(Debug, Default)]
pub struct Cuts {
    boundaries: Vec<Boundary>,
}

/// One boundary: the tensor the segment below produced, and the leaf variable
/// the segment above continued from.
#[derive(Debug)]
struct Boundary {
    below: Tensor,
    leaf: Var,
}

impl Cuts {
    /// Ends a segment at `h`: the tensor the next segment continues from (the
    /// same values, as a new leaf of the graph).
    ///
    /// # Errors
    /// candle's, when `h` cannot be copied.
    pub fn cut(&mut self, h: &Tensor) -> Result<Tensor> {
        // Detached first, so that even a parameter's own tensor is copied
        // into a new leaf (`Var::from_tensor` hands a variable back as is).
        let leaf = Var::from_tensor(&h.detach())?;
        let above = leaf.as_tensor().clone();
        self.boundaries.push(Boundary {
            below: h.clone(),
            leaf,
        });
        Ok(above)
    }

    /// Boundaries crossed so far: the pass has one segment more.
    pub fn len(&self) -> usize {
        self.boundaries.len()
    }

    /// True when nothing was cut (one segment: a plain backward pass).
    pub fn is_empty(&self) -> bool {
        self.boundaries.is_empty()
    }

    /// The backward pass of `loss`, one segment at a time, the top first: each
    /// item holds the gradients of the parameters of one segment (and of the
    /// boundary leaf below it, which a caller ignores).
    pub fn backward(self, loss: &Tensor) -> SegmentGrads {
        SegmentGrads {
            next: Some(loss.clone()),
            boundaries: self.boundaries,
        }
    }
}

/// The gradients of a segmented backward pass, segment by segment: an
/// iterator that differentiates the next segment each time it is advanced.
#[derive(Debug)]
pub struct SegmentGrads {
    /// What the next segment's backward starts from: the loss, then the
    /// product and sum at each boundary.
    next: Option<Tensor>,
    /// The boundaries not yet crossed, the lowest first.
    boundaries: Vec<Boundary>,
}

impl SegmentGrads {
    /// Differentiates `top` and readies the segment below the next boundary.
    fn segment(&mut self, top: &Tensor) -> Result<GradStore> {
        let grads = top.backward()?;
        if let Some(Boundary { below, leaf }) = self.boundaries.pop() {
            // A boundary nothing above depends on leaves the segments below
            // with no gradient at all, as one whole backward pass would.
            // candle computes gradients with ops that record the graph (the
            // gradient at a layer's input is made from its weight): detached,
            // `g` is a constant and `sum(h * g)` reaches nothing above the cut.
            if let Some(grad) = grads.get(leaf.as_tensor()) {
                self.next = Some(below.mul(&grad.detach())?.sum_all()?);
            }
        }
        Ok(grads)
    }
}

impl Iterator for SegmentGrads {
    type Item = Result<GradStore>;

    fn next(&mut self) -> Option<Self::Item> {
        let top = self.next.take()?;
        Some(self.segment(&top))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Mlp;
    use crate::trainer::vars_by_name;
    use candle_core::{DType, Device, Module};
    use candle_nn::{VarBuilder, VarMap};

    /// A 4-layer MLP, its variables, a batch and its labels.
    fn model() -> (Mlp, Vec<(String, Var)>, Tensor, Tensor) {
        let device = Device::Cpu;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        let mlp = Mlp::new(vb, 20, &[32, 24, 16], 5).unwrap();
        let vars = vars_by_name(&varmap);
        let x = Tensor::randn(0f32, 1.0, (8, 20), &device).unwrap();
        let y = Tensor::new(&[0u32, 1, 2, 3, 4, 0, 1, 2], &device).unwrap();
        (mlp, vars, x, y)
    }

    /// Each variable's gradient as values, gathered over every segment (a
    /// variable in two segments would fail the test).
    fn gradients(vars: &[(String, Var)], stores: &[GradStore]) -> Vec<Vec<f32>> {
        vars.iter()
            .map(|(name, var)| {
                let found: Vec<&Tensor> = stores.iter().filter_map(|g| g.get(var)).collect();
                assert_eq!(found.len(), 1, "{name} has a gradient in one segment");
                found[0].flatten_all().unwrap().to_vec1().unwrap()
            })
            .collect()
    }

    #[test]
    fn every_cut_gives_the_plain_backward_gradients() {
        let (mlp, vars, x, y) = model();
        let loss = |logits: &Tensor| candle_nn::loss::cross_entropy(logits, &y).unwrap();
        let plain = loss(&mlp.forward(&x).unwrap()).backward().unwrap();
        let plain = gradients(&vars, &[plain]);
        for segments in 1..=4 {
            let mut cuts = Cuts::default();
            let logits = mlp.forward_cut(&x, segments, &mut cuts).unwrap();
            assert_eq!(cuts.len(), segments - 1);
            let stores: Vec<GradStore> = cuts
                .backward(&loss(&logits))
                .collect::<Result<_>>()
                .unwrap();
            assert_eq!(stores.len(), segments, "one gradient store per segment");
            let segmented = gradients(&vars, &stores);
            for ((name, _), (plain, segmented)) in vars.iter().zip(plain.iter().zip(&segmented)) {
                // Bit for bit: the same kernels on the same values, in the same order.
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(plain),
                    bits(segmented),
                    "{name} with {segments} segments differs from the plain gradient"
                );
            }
        }
    }

    #[test]
    fn the_top_segment_comes_first() {
        let (mlp, vars, x, y) = model();
        let mut cuts = Cuts::default();
        let logits = mlp.forward_cut(&x, 2, &mut cuts).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
        let first = cuts.backward(&loss).next().unwrap().unwrap();
        let has = |name: &str| {
            let var = &vars.iter().find(|(n, _)| n == name).unwrap().1;
            first.get(var).is_some()
        };
        assert!(
            has("fc3.weight") && has("fc2.bias"),
            "the top two layers first"
        );
        assert!(
            !has("fc1.weight") && !has("fc0.weight"),
            "not the lower two"
        );
    }

    #[test]
    fn a_boundary_nothing_depends_on_ends_the_pass() {
        let device = Device::Cpu;
        let w = Var::new(&[1f32, 2.0], &device).unwrap();
        let mut cuts = Cuts::default();
        let _unused = cuts.cut(&w.as_tensor().sqr().unwrap()).unwrap();
        let loss = w.as_tensor().sum_all().unwrap();
        let stores: Vec<GradStore> = cuts.backward(&loss).collect::<Result<_>>().unwrap();
        assert_eq!(stores.len(), 1);
    }
}
