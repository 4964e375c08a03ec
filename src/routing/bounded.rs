//! Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam),
//! weighted: a keyed request takes the first backend in its ranking whose
//! load is below its cap (or that has a free slot, see `routing::Facts`).
//! While loads are even every key stays on its first choice; only a hot
//! key's excess moves, always down the same ranking.

/// The cap of a backend of weight `weight`:
/// `ceil(factor * (total_load + 1) * weight / total_weight)`, where
/// `total_load` is the model's load (in flight plus queued, this request
/// not counted) and `total_weight` the weights' sum over the backends that
/// are not excluded. A backend is eligible while its load is below its cap.
///
/// Some backend that is not excluded is always eligible: the caps add up to
/// at least `factor * (total_load + 1)`, more than the load they hold.
pub fn cap(factor: f64, total_load: usize, weight: u32, total_weight: u64) -> usize {
    if total_weight == 0 {
        return usize::MAX;
    }
    let exact = factor * (total_load + 1) as f64 * f64::from(weight) / total_weight as f64;
    // A product that should be whole may land a hair above it in floating
    // point; the hair must not raise the cap by one.
    (exact - 1e-9).ceil().max(1.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_thresholds() {
        // 3 equal backends, factor 1.25.
        assert_eq!(cap(1.25, 0, 1, 3), 1); // 0.42 -> 1
        assert_eq!(cap(1.25, 1, 1, 3), 1); // 0.83 -> 1
        assert_eq!(cap(1.25, 2, 1, 3), 2); // 1.25 -> 2
        assert_eq!(cap(1.25, 5, 1, 3), 3); // 2.5 -> 3
                                           // Whole products stay whole: 1.5 * 2 * 1 / 3 = 1, 1.25 * 4 / 5 = 1.
        assert_eq!(cap(1.5, 1, 1, 3), 1);
        assert_eq!(cap(1.25, 3, 1, 5), 1);
        assert_eq!(cap(2.0, 9, 1, 2), 10);
    }

    #[test]
    fn weights_scale_the_cap() {
        // Weights 1 and 3 (W = 4), factor 1.25, load 7: 10 * w / 4.
        assert_eq!(cap(1.25, 7, 1, 4), 3); // 2.5 -> 3
        assert_eq!(cap(1.25, 7, 3, 4), 8); // 7.5 -> 8
    }

    #[test]
    fn excluded_backends_leave_the_total_weight() {
        // Of 4 equal backends one is excluded: W = 3, caps rise.
        assert!(cap(1.25, 8, 1, 3) > cap(1.25, 8, 1, 4));
        assert_eq!(cap(1.25, 8, 1, 3), 4); // 3.75 -> 4
        assert_eq!(cap(1.25, 8, 1, 4), 3); // 2.81 -> 3
    }

    #[test]
    fn the_caps_always_cover_the_load() {
        for factor in [1.01, 1.25, 1.5, 10.0] {
            for weights in [vec![1, 1, 1], vec![1, 2, 7], vec![5], vec![1; 9]] {
                let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
                for load in 0..200 {
                    let caps: usize = weights.iter().map(|w| cap(factor, load, *w, total)).sum();
                    assert!(caps > load, "{factor} {weights:?} {load}: {caps}");
                }
            }
        }
    }
}
