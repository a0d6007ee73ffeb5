//! A large key's arithmetic split over cores: an update or an accumulation of a
//! key of many elements runs as a few parts of consecutive elements, one per
//! core, on rayon's pool. Each element is still computed exactly as it would be
//! in one pass, so the result does not depend on the split.
//!
//! The passes are bound by memory bandwidth, which one core cannot use up on
//! its own; a key smaller than [`PARALLEL_FROM_ELEMENTS`] stays on the calling
//! thread, where splitting would cost more than it saves.

use std::ops::Range;

use rayon::prelude::*;

/// Elements from which a key's pass is split over cores: 4 MiB of `f32`.
pub const PARALLEL_FROM_ELEMENTS: usize = 1 << 20;

/// Fewest elements in one part.
const MIN_PART_ELEMENTS: usize = 1 << 19;

/// Consecutive elements of a key, with the matching optimizer state.
#[derive(Debug)]
pub(crate) struct Part<'a> {
    /// Index of the part's first element in the key.
    pub offset: usize,
    /// The part's values (or accumulated sum).
    pub values: &'a mut [f32],
    /// The first state buffer's elements; empty where the optimizer keeps none.
    pub first: &'a mut [f32],
    /// The second state buffer's elements; empty where the optimizer keeps none.
    pub second: &'a mut [f32],
}

impl Part<'_> {
    /// The part's elements, as indices into the key.
    pub(crate) fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.values.len()
    }
}

/// How many parts a pass over `elements` is cut into: one for a small key or
/// a gradient that is not read where it lies, otherwise one per core.
pub(crate) fn parts(elements: usize, splits_cheaply: bool) -> usize {
    if elements < PARALLEL_FROM_ELEMENTS || !splits_cheaply {
        return 1;
    }
    rayon::current_num_threads().clamp(1, elements / MIN_PART_ELEMENTS)
}

/// Cuts `values` and the state buffers (each either empty or as long as
/// `values`) into `parts` parts and calls `f` on each, in parallel when there
/// are several.
pub(crate) fn split(
    parts: usize,
    values: &mut [f32],
    first: &mut [f32],
    second: &mut [f32],
    f: impl Fn(Part<'_>) + Send + Sync,
) {
    let len = values.len().div_ceil(parts.max(1)).max(1);
    let mut firsts = first.chunks_mut(len);
    let mut seconds = second.chunks_mut(len);
    let cut: Vec<Part<'_>> = values
        .chunks_mut(len)
        .enumerate()
        .map(|(i, values)| Part {
            offset: i * len,
            values,
            first: firsts.next().unwrap_or_default(),
            second: seconds.next().unwrap_or_default(),
        })
        .collect();
    match cut.len() {
        0 | 1 => cut.into_iter().for_each(f),
        _ => cut.into_par_iter().for_each(f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_every_element_once_with_their_state() {
        for (elements, parts) in [(10, 1), (10, 3), (1000, 4), (1001, 7), (5, 8)] {
            let mut values = vec![0f32; elements];
            let mut first = vec![0f32; elements];
            split(parts, &mut values, &mut first, &mut [], |part| {
                assert!(part.second.is_empty(), "no second state was given");
                assert_eq!(part.first.len(), part.values.len());
                for (i, (v, f)) in part
                    .values
                    .iter_mut()
                    .zip(part.first.iter_mut())
                    .enumerate()
                {
                    *v += (part.offset + i) as f32;
                    *f += 1.0;
                }
            });
            let want: Vec<f32> = (0..elements).map(|i| i as f32).collect();
            assert_eq!(values, want, "{elements} elements in {parts} parts");
            assert!(first.iter().all(|&f| f == 1.0), "{elements} in {parts}");
        }
    }

    #[test]
    fn small_keys_and_widened_gradients_stay_in_one_part() {
        assert_eq!(parts(PARALLEL_FROM_ELEMENTS - 1, true), 1);
        assert_eq!(parts(PARALLEL_FROM_ELEMENTS * 8, false), 1);
        let large = parts(PARALLEL_FROM_ELEMENTS * 8, true);
        assert_eq!(large, rayon::current_num_threads().min(16));
    }
}
